# SPDX-License-Identifier: Apache-2.0
"""Worker-local disk tier for native KV offloading (store only).

Each tensor-parallel worker writes its own KV bytes, taken from its own CPU
staging slots, to its own local disk in chunk store format v1
(kv_store_format). The scheduler never touches the disk; it only attaches a
side channel to every store job naming the job's keys in block order and the
boundary manifests those keys may complete.

Flow on a worker:

1. ``remember``: a store job arrives; keep its CPU chunk ids and side channel.
2. ``capture``: the GPU->CPU copy of the job completed (or the flush path
   waited for it) and this rank has not acked yet. Copy the job's real,
   unpadded bytes out of staging into a private buffer under a byte budget.
   A full budget drops that store; serving never waits and acks are never
   deferred.
3. The writer thread writes header + payload to a temp file, fsyncs, renames
   and fsyncs the directory. A boundary manifest is published only once every
   file it names is durable and its header verifies. Keep-K retention runs
   right after each publication.

This module is imported only when ``GLM53_KV_OFFLOAD=1``; the hooks in vLLM's
files check the variable before importing it. Standard library only; torch
objects handed in by vLLM are used through the small staging adapters below.
"""

import ctypes
import errno
import fcntl
import itertools
import logging
import os
import re
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

try:
    from . import kv_store_format as fmt
except ImportError:  # loaded as a top-level module: tests, bench, tools
    import kv_store_format as fmt  # type: ignore[no-redef]

logger = logging.getLogger(__name__)

# --------------------------------------------------------------------------
# Knobs
# --------------------------------------------------------------------------

ENV_ENABLE = "GLM53_KV_OFFLOAD"
ENV_DIR = "GLM53_KV_OFFLOAD_DIR"
ENV_CPU_GB = "GLM53_KV_OFFLOAD_CPU_GB"
ENV_RESTORE = "GLM53_KV_OFFLOAD_RESTORE"
ENV_DRAFTER = "GLM53_KV_OFFLOAD_DRAFTER"
ENV_KEEP = "GLM53_KV_OFFLOAD_KEEP_BOUNDARIES"
ENV_BUILD_ID = "GLM53_KV_OFFLOAD_BUILD_ID"

DEFAULT_KEEP_BOUNDARIES = 2
DEFAULT_CAPTURE_BUDGET_BYTES = 512 << 20
_DECIMAL = re.compile(r"0|[1-9][0-9]{0,5}")
_BUILD_ID = re.compile(r"[A-Za-z0-9._+-]{0,128}")


class KnobError(ValueError):
    """A GLM53_KV_OFFLOAD* variable with a value this stage does not accept."""


@dataclass(frozen=True)
class StoreKnobs:
    enabled: bool
    root: str
    cpu_gb: int | None
    drafter: bool
    keep_boundaries: int
    build_id: str


def _flag(environ: Mapping[str, str], name: str) -> bool:
    value = environ.get(name)
    if value is None or value == "0":
        return False
    if value == "1":
        return True
    raise KnobError(f"{name} must be unset, '0' or '1'; got {value!r}.")


def _bounded_int(
    environ: Mapping[str, str], name: str, low: int, high: int, default: int | None
) -> int | None:
    value = environ.get(name)
    if value is None:
        return default
    if not _DECIMAL.fullmatch(value) or not low <= int(value) <= high:
        raise KnobError(
            f"{name} must be a decimal integer in [{low}, {high}]; got {value!r}."
        )
    return int(value)


def read_knobs(environ: Mapping[str, str] | None = None) -> StoreKnobs:
    """Parse every GLM53_KV_OFFLOAD* variable strictly; raise KnobError."""
    env = os.environ if environ is None else environ
    enabled = _flag(env, ENV_ENABLE)
    if env.get(ENV_RESTORE) not in (None, "0"):
        if env[ENV_RESTORE] == "1":
            raise KnobError(
                f"{ENV_RESTORE}=1 is refused: this stage stores only and has no "
                "restore path."
            )
        raise KnobError(
            f"{ENV_RESTORE} must be unset or '0'; got {env[ENV_RESTORE]!r}."
        )
    drafter = _flag(env, ENV_DRAFTER)
    keep = _bounded_int(
        env, ENV_KEEP, 0, fmt.MAX_KEEP_BOUNDARIES, DEFAULT_KEEP_BOUNDARIES
    )
    cpu_gb = _bounded_int(env, ENV_CPU_GB, 1, 64, None)
    build_id = env.get(ENV_BUILD_ID, "")
    if not _BUILD_ID.fullmatch(build_id):
        raise KnobError(
            f"{ENV_BUILD_ID} must match [A-Za-z0-9._+-]{{0,128}}; got {build_id!r}."
        )
    root = env.get(ENV_DIR, "")
    if enabled:
        if not root:
            raise KnobError(f"{ENV_DIR} must be set when {ENV_ENABLE}=1.")
        if not os.path.isabs(root) or re.search(r"[\s'\"]", root):
            raise KnobError(
                f"{ENV_DIR} must be an absolute path without quotes or "
                f"whitespace; got {root!r}."
            )
    assert keep is not None
    return StoreKnobs(
        enabled=enabled,
        root=os.path.normpath(root) if root else "",
        cpu_gb=cpu_gb,
        drafter=drafter,
        keep_boundaries=keep,
        build_id=build_id,
    )


# --------------------------------------------------------------------------
# Store-job side channel (scheduler side)
# --------------------------------------------------------------------------

META_VERSION = 1


def key_hash(key: bytes) -> bytes:
    """Block hash of an OffloadKey (hash bytes + 4-byte big-endian group)."""
    return bytes(key[:-4])


def key_group(key: bytes) -> int:
    return int.from_bytes(key[-4:], "big", signed=False)


@dataclass(frozen=True)
class SchedulerGroup:
    """What the scheduler side needs to know about one offloaded group."""

    group: int  # original KV cache group index
    tokens_per_chunk: int
    kind: str  # "full", "state" or "window"


class SchedulerStoreMeta:
    """Attaches the versioned side channel to every store job.

    ``kv_store_meta`` is a dict of builtins so it pickles with the scheduler
    output and needs nothing of ours to unpickle:

    - ``keys``/``groups``/``tokens``: the job's keys in block order (the order
      of the CPU chunk ids in its dst spec), each with its original group and
      end token;
    - ``candidates``: boundary manifests these keys may complete, each with
      ``boundary``, ``chunk_tokens``, the cumulative ``chain`` of chunk hashes
      from token 0, and the ``full`` and ``state`` groups it names.
    """

    def __init__(self, groups: Sequence[SchedulerGroup], tokens_per_hash: int):
        self.groups = tuple(groups)
        self.tokens_per_hash = tokens_per_hash
        self._slot_of = {g.group: slot for slot, g in enumerate(self.groups)}
        self._full = tuple(g.group for g in self.groups if g.kind == "full")
        self._state = tuple(g.group for g in self.groups if g.kind == "state")
        chunk_tokens = {g.tokens_per_chunk for g in self.groups if g.kind != "window"}
        # A manifest's chain has one chunk size; mixed sizes publish none.
        self.chunk_tokens = chunk_tokens.pop() if len(chunk_tokens) == 1 else None
        if self.chunk_tokens is None:
            logger.warning(
                "KV store: offloaded groups use different chunk sizes; chunks "
                "are written but no boundary manifest is published."
            )

    @classmethod
    def from_vllm(cls, config: Any) -> "SchedulerStoreMeta":
        """Scheduler-side entry point: validate the knobs, then build."""
        knobs = read_knobs()
        meta = cls.from_config(config)
        logger.info(
            "KV store: scheduler attaches store metadata; restore is off (no "
            "external hits); disk tier under %s",
            knobs.root,
        )
        return meta

    @classmethod
    def from_config(cls, config: Any) -> "SchedulerStoreMeta":
        """Build from vLLM's SchedulerOffloadConfig."""
        return cls(
            [
                SchedulerGroup(
                    group=g.group_idx,
                    tokens_per_chunk=g.tokens_per_chunk,
                    kind=_scheduler_group_kind(g),
                )
                for g in config.kv_group_configs
            ],
            config.tokens_per_hash,
        )

    def attach(
        self,
        store_jobs: Mapping[int, Any],
        job_status: Mapping[int, Any],
        req_states: Mapping[str, Any],
    ) -> None:
        for job_id, job in store_jobs.items():
            status = job_status.get(job_id)
            req_state = req_states.get(job.req_id)
            if status is None or req_state is None:
                continue
            job.kv_store_meta = self.build(status.keys, req_state)

    def build(self, keys: Iterable[bytes], req_state: Any) -> dict[str, Any]:
        ctx = req_state.req_context
        positioned = []
        for key in keys:
            group = key_group(key)
            token = ctx.get_offload_key_position(key)
            slot = self._slot_of.get(group)
            if token is None or slot is None:
                # Unknown position: the job cannot be named; write nothing.
                return {"version": META_VERSION, "keys": None}
            positioned.append((slot, token, bytes(key), group))
        # The scheduler builds each job slot by slot, chunk by chunk.
        positioned.sort(key=lambda item: (item[0], item[1]))
        return {
            "version": META_VERSION,
            "keys": [item[2] for item in positioned],
            "groups": [item[3] for item in positioned],
            "tokens": [item[1] for item in positioned],
            "candidates": self._candidates(positioned, req_state.req.block_hashes),
        }

    def _candidates(
        self, positioned: list[tuple[int, int, bytes, int]], block_hashes: Sequence
    ) -> list[dict[str, Any]]:
        if self.chunk_tokens is None:
            return []
        state = set(self._state)
        if state:
            boundaries = {tok for _, tok, _, g in positioned if g in state}
        else:
            ends = [tok for _, tok, _, g in positioned if g in self._full]
            boundaries = {max(ends)} if ends else set()
        out = []
        for boundary in sorted(boundaries):
            chain = self._chain(boundary, block_hashes)
            if chain is None:
                continue
            out.append(
                {
                    "boundary": boundary,
                    "chunk_tokens": self.chunk_tokens,
                    "chain": chain,
                    "full": list(self._full),
                    "state": list(self._state),
                }
            )
        return out

    def _chain(self, boundary: int, block_hashes: Sequence) -> list[bytes] | None:
        chunk_tokens = self.chunk_tokens
        assert chunk_tokens is not None
        if (
            boundary <= 0
            or boundary % chunk_tokens
            or chunk_tokens % self.tokens_per_hash
        ):
            return None
        per_chunk = chunk_tokens // self.tokens_per_hash
        count = boundary // chunk_tokens
        if count * per_chunk > len(block_hashes):
            return None
        return [bytes(block_hashes[(i + 1) * per_chunk - 1]) for i in range(count)]


def _scheduler_group_kind(group_config: Any) -> str:
    if getattr(group_config, "requires_cow_source", False) or _is_mamba(
        group_config.kv_cache_spec
    ):
        return "state"
    if group_config.sliding_window_size_in_chunks is None:
        return "full"
    return "window"


def _is_mamba(spec: Any) -> bool:
    try:
        from vllm.v1.kv_cache_interface import MambaSpec
    except ImportError:
        return False
    return isinstance(spec, MambaSpec)


# --------------------------------------------------------------------------
# Layout of one rank's staging slots
# --------------------------------------------------------------------------

_DTYPES = {
    "uint8": fmt.DType.UINT8,
    "int8": fmt.DType.INT8,
    "float16": fmt.DType.FLOAT16,
    "bfloat16": fmt.DType.BFLOAT16,
    "float32": fmt.DType.FLOAT32,
    "float8_e4m3fn": fmt.DType.FLOAT8_E4M3FN,
    "float8_e5m2": fmt.DType.FLOAT8_E5M2,
    "int32": fmt.DType.INT32,
    "float64": fmt.DType.FLOAT64,
}


@dataclass(frozen=True)
class StatePart:
    """One state tensor of a state layer, as laid out in its page."""

    dtype: str  # e.g. "bfloat16"
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        n = fmt.DTYPE_ITEMSIZE[_DTYPES[self.dtype]]
        for dim in self.shape:
            n *= dim
        return n


@dataclass(frozen=True)
class LayerLayout:
    tensor: int  # index into the staging tensors
    real_bytes: int  # unpadded page bytes: what the DMA wrote
    state: tuple[StatePart, ...] = ()  # empty for attention layers


@dataclass(frozen=True)
class GroupLayout:
    group: int  # original KV cache group index
    slot: int  # position in the offloading config / transfer spec
    kind: str  # "full", "window" or "state"
    layers: tuple[LayerLayout, ...]

    @property
    def block_bytes(self) -> int:
        return sum(layer.real_bytes for layer in self.layers)

    def segments(self, blocks: int) -> tuple[fmt.Segment, ...]:
        specs = []
        for index, layer in enumerate(self.layers):
            if not layer.state:
                n = layer.real_bytes * blocks
                specs.append((index, fmt.SegmentKind.KV, fmt.DType.UINT8, (n,), (1,)))
                continue
            if blocks != 1:
                raise ValueError("a state payload holds exactly one block")
            *conv, temporal = layer.state
            if len(conv) == 1 and conv[0].dtype in _DTYPES:
                part = conv[0]
                specs.append(
                    (
                        index,
                        fmt.SegmentKind.CONV,
                        _DTYPES[part.dtype],
                        part.shape,
                        _contiguous(part.shape),
                    )
                )
            elif conv:
                # Several conv states (e.g. q/k/v): one opaque run; their
                # shapes and dtypes are fenced in the namespace's state ABI.
                n = sum(part.nbytes for part in conv)
                specs.append((index, fmt.SegmentKind.CONV, fmt.DType.UINT8, (n,), (1,)))
            specs.append(
                (
                    index,
                    fmt.SegmentKind.TEMPORAL,
                    _DTYPES[temporal.dtype],
                    temporal.shape,
                    _contiguous(temporal.shape),
                )
            )
        return fmt.make_segments(specs)


def _contiguous(shape: Sequence[int]) -> tuple[int, ...]:
    strides = []
    step = 1
    for dim in reversed(shape):
        strides.append(step)
        step *= dim
    return tuple(reversed(strides))


@dataclass(frozen=True)
class StagingTensor:
    """One staging tensor: rows of ``width`` bytes, ``row_stride`` apart."""

    source: Any  # writable buffer or a flat torch uint8 tensor
    offset: int  # byte offset of row 0 within source
    row_stride: int
    width: int  # bytes of one row that belong to this tensor


# --------------------------------------------------------------------------
# Capture: staging -> private buffer
# --------------------------------------------------------------------------


class CapturePool:
    """A fixed private buffer handed out as a FIFO ring of byte ranges.

    The writer frees ranges in the order they were captured, so a ring is
    enough; an out-of-order free is held until the ranges before it go.
    """

    def __init__(self, capacity: int):
        if capacity <= 0:
            raise ValueError("capture budget must be positive")
        self.capacity = capacity
        self.buffer = bytearray(capacity)
        self.address = ctypes.addressof(ctypes.c_char.from_buffer(self.buffer))
        # Fault every page in now, not on the serving path.
        ctypes.memset(self.address, 0, capacity)
        self._live: deque[list[int]] = deque()  # [start, size, freed]
        self._lock = threading.Lock()
        self._torch_view: Any = None

    @property
    def used(self) -> int:
        with self._lock:
            return sum(size for _, size, _ in self._live)

    def alloc(self, size: int) -> int | None:
        with self._lock:
            if size <= 0 or size > self.capacity:
                return None
            if not self._live:
                start = 0
            else:
                oldest = self._live[0][0]
                newest_start, newest_size, _ = self._live[-1]
                head = newest_start + newest_size
                if newest_start >= oldest:  # live range does not wrap
                    if self.capacity - head >= size:
                        start = head
                    elif oldest >= size:
                        start = 0
                    else:
                        return None
                elif oldest - head >= size:
                    start = head
                else:
                    return None
            self._live.append([start, size, 0])
            return start

    def free(self, start: int) -> None:
        with self._lock:
            for entry in self._live:
                if entry[0] == start and not entry[2]:
                    entry[2] = 1
                    break
            while self._live and self._live[0][2]:
                self._live.popleft()

    def view(self, start: int, size: int) -> memoryview:
        return memoryview(self.buffer)[start : start + size]

    def torch_view(self) -> Any:
        if self._torch_view is None:
            import torch

            self._torch_view = torch.frombuffer(self.buffer, dtype=torch.uint8)
        return self._torch_view


def _is_torch_tensor(obj: Any) -> bool:
    return type(obj).__module__.startswith("torch") and hasattr(obj, "data_ptr")


def _buffer_address(obj: Any) -> int:
    if _is_torch_tensor(obj):
        return obj.data_ptr()
    return ctypes.addressof(ctypes.c_char.from_buffer(obj))


class Copier:
    """Copies coalesced (source, src_off, dst_off, size) runs into the pool.

    ``engine="torch"`` uses ``copy_`` between torch views (torch's own
    threads); ``"memmove"`` uses ctypes.memmove, which releases the GIL, split
    across ``threads`` helper threads for large captures.
    """

    _SPLIT_BYTES = 4 << 20

    def __init__(self, pool: CapturePool, engine: str = "memmove", threads: int = 1):
        if engine not in ("torch", "memmove"):
            raise ValueError(f"unknown copy engine {engine!r}")
        self.pool = pool
        self.engine = engine
        self.threads = max(1, threads)
        self._addresses: dict[int, int] = {}
        self._workers: list[threading.Thread] = []
        self._tasks: deque = deque()
        self._cv = threading.Condition()
        self._pending = 0
        self._closed = False

    def copy(self, runs: Sequence[tuple[Any, int, int, int]]) -> None:
        if self.engine == "torch":
            dst = self.pool.torch_view()
            for source, src_off, dst_off, size in runs:
                dst[dst_off : dst_off + size].copy_(source[src_off : src_off + size])
            return
        moves = []
        for source, src_off, dst_off, size in runs:
            key = id(source)
            base = self._addresses.get(key)
            if base is None:
                base = self._addresses[key] = _buffer_address(source)
            src = base + src_off
            dst = self.pool.address + dst_off
            while size > 0:
                step = min(size, self._SPLIT_BYTES)
                moves.append((dst, src, step))
                dst += step
                src += step
                size -= step
        total = sum(m[2] for m in moves)
        if self.threads == 1 or total < 2 * self._SPLIT_BYTES:
            for dst, src, n in moves:
                ctypes.memmove(dst, src, n)
            return
        self._run_parallel(moves)

    def _run_parallel(self, moves: list[tuple[int, int, int]]) -> None:
        if not self._workers:
            for i in range(self.threads - 1):
                t = threading.Thread(
                    target=self._worker, name=f"kv-store-copy-{i}", daemon=True
                )
                t.start()
                self._workers.append(t)
        with self._cv:
            self._tasks.extend(moves)
            self._pending += len(moves)
            self._cv.notify_all()
        self._drain()
        with self._cv:
            while self._pending:
                self._cv.wait()

    def _drain(self) -> None:
        while True:
            with self._cv:
                if not self._tasks:
                    return
                dst, src, n = self._tasks.popleft()
            ctypes.memmove(dst, src, n)
            with self._cv:
                self._pending -= 1
                if not self._pending:
                    self._cv.notify_all()

    def _worker(self) -> None:
        while True:
            with self._cv:
                while not self._tasks and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return
            self._drain()

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()


def coalesce(
    runs: Iterable[tuple[Any, int, int, int]],
) -> list[tuple[Any, int, int, int]]:
    """Merge runs that continue each other on both sides."""
    out: list[list[Any]] = []
    for source, src, dst, size in runs:
        if out:
            last = out[-1]
            if (
                last[0] is source
                and last[1] + last[3] == src
                and last[2] + last[3] == dst
            ):
                last[3] += size
                continue
        out.append([source, src, dst, size])
    return [tuple(run) for run in out]  # type: ignore[misc]


# --------------------------------------------------------------------------
# Captured work handed to the writer
# --------------------------------------------------------------------------


@dataclass
class CapturedKey:
    hash: bytes
    group: int
    boundary: int  # end token of the chunk
    offset: int  # in the capture pool
    size: int
    segments: tuple[fmt.Segment, ...]
    # Payload CRC being computed on the checksum threads (writer side only).
    checksum: "PendingChecksum | None" = field(default=None, compare=False)
    freed: bool = field(default=False, compare=False)


@dataclass
class Candidate:
    boundary: int
    chunk_tokens: int
    chain: tuple[bytes, ...]
    full: tuple[int, ...]
    state: tuple[int, ...]

    @property
    def name(self) -> str:
        return fmt.manifest_file_name(self.boundary, self.chain[-1].hex())

    def needed(self) -> list[tuple[bytes, int]]:
        out = [(h, g) for g in self.full for h in self.chain]
        out += [(self.chain[-1], g) for g in self.state]
        return out


@dataclass
class CapturedJob:
    job_id: int
    keys: list[CapturedKey]
    candidates: list[Candidate]


@dataclass
class StoreStats:
    jobs_captured: int = 0
    keys_captured: int = 0
    bytes_captured: int = 0
    capture_seconds: float = 0.0
    keys_dropped_budget: int = 0
    keys_dropped_paused: int = 0
    keys_dropped_incomplete: int = 0
    jobs_without_meta: int = 0
    jobs_mismatched: int = 0
    keys_written: int = 0
    bytes_written: int = 0
    keys_deduplicated: int = 0
    keys_failed: int = 0
    write_seconds: float = 0.0
    manifests_published: int = 0
    manifests_dropped: int = 0
    manifests_superseded: int = 0
    state_files_removed: int = 0
    enospc_pauses: int = 0


# --------------------------------------------------------------------------
# The writer
# --------------------------------------------------------------------------


# The payload CRC (zlib's CRC-32, ~1-4 GB/s on one core) would otherwise run
# on the writer thread before the bytes reach the disk. It runs on helper
# threads instead (zlib.crc32 releases the GIL on large buffers), split in
# fixed-size slices whose CRCs are combined, and started for the next jobs
# while the writer writes the current one.

CHECKSUM_SLICE_BYTES = 4 << 20


def _gf2_times(matrix: Sequence[int], vector: int) -> int:
    out = 0
    i = 0
    while vector:
        if vector & 1:
            out ^= matrix[i]
        vector >>= 1
        i += 1
    return out


def _gf2_product(a: Sequence[int], b: Sequence[int]) -> list[int]:
    """The operator a after b."""
    return [_gf2_times(a, column) for column in b]


def crc32_shift(nbytes: int) -> list[int]:
    """The operator that appends nbytes zero bytes to a CRC-32 (zlib's).

    crc32(a + b) == _gf2_times(crc32_shift(len(b)), crc32(a)) ^ crc32(b).
    """
    result = [1 << n for n in range(32)]  # identity
    step = [0xEDB88320] + [1 << n for n in range(31)]  # one zero bit
    for _ in range(3):  # one zero byte
        step = _gf2_product(step, step)
    while nbytes:
        if nbytes & 1:
            result = _gf2_product(step, result)
        nbytes >>= 1
        if nbytes:
            step = _gf2_product(step, step)
    return result


class PendingChecksum:
    """The slices of one payload's CRC, on the checksum threads."""

    def __init__(self, futures: list[Future], shift: Sequence[int]):
        self._futures = futures
        self._shift = shift

    def result(self) -> int:
        value = self._futures[0].result()
        for f in self._futures[1:]:  # every slice after the first is full size
            value = _gf2_times(self._shift, value) ^ f.result()
        return value

    def settle(self) -> None:
        """Cancel or wait: the payload's memory may be reused afterwards."""
        for f in self._futures:
            f.cancel()
        wait(self._futures)


class Checksummer:
    def __init__(self, threads: int, slice_bytes: int | None = None):
        self.slice_bytes = slice_bytes or CHECKSUM_SLICE_BYTES
        self._shift = crc32_shift(self.slice_bytes)
        self._pool = ThreadPoolExecutor(
            max(1, threads), thread_name_prefix="kv-store-crc"
        )

    def start(self, payload: memoryview) -> PendingChecksum:
        # The short slice goes first so that every later one shifts by the
        # same (precomputed) length.
        n = len(payload)
        first = n % self.slice_bytes or min(n, self.slice_bytes)
        bounds = [0, *range(first, n + 1, self.slice_bytes)]
        if len(bounds) == 1:
            bounds.append(n)
        futures = [
            self._pool.submit(fmt.crc32, payload[a:b])
            for a, b in itertools.pairwise(bounds)
        ]
        return PendingChecksum(futures, self._shift)

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def default_checksum_threads() -> int:
    return max(1, min(4, (os.cpu_count() or 2) // 2))


class WriterDisabled(RuntimeError):
    """The writer cannot run safely here; serving continues without it."""


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: memoryview | bytes) -> None:
    view = memoryview(data).cast("B")
    while view:
        n = os.write(fd, view)
        view = view[n:]


def write_file_durably(
    path: str, parts: Sequence[bytes | memoryview], sync_dir: bool = True
) -> None:
    """tmp (pid + thread id) -> write -> fsync -> rename -> fsync dir.

    On any error the temp file is removed and the error re-raised; the final
    name is never left partial.
    """
    directory, name = os.path.split(path)
    tmp = os.path.join(
        directory, fmt.temp_name(name, os.getpid(), threading.get_native_id())
    )
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        try:
            for part in parts:
                _write_all(fd, part)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if sync_dir:
        _fsync_dir(directory)


class StoreWriter:
    """Owns one rank's store directory and the thread that writes it.

    Every method but ``submit``/``accepting``/``close``/``stats`` runs on the
    writer thread (or in tests, via ``process``).
    """

    MAX_PENDING_CANDIDATES = 1024
    MAX_KNOWN_DURABLE = 1 << 18

    def __init__(
        self,
        layout: fmt.StoreLayout,
        namespace: bytes,
        rank: int,
        pool: CapturePool,
        keep_boundaries: int,
        *,
        stats: StoreStats | None = None,
        pause_seconds: float = 30.0,
        resume_probe: Callable[[], bool] | None = None,
        min_free_bytes: int = 1 << 30,
        checksum_threads: int | None = None,
    ):
        self.layout = layout
        self.namespace = namespace
        self.rank = rank
        self.pool = pool
        self.keep = keep_boundaries
        self.stats = stats or StoreStats()
        self.pause_seconds = pause_seconds
        self.min_free_bytes = min_free_bytes
        self.resume_probe = resume_probe or self._enough_space
        # (hash, group) -> (payload length, payload checksum), verified.
        self._durable: OrderedDict[tuple[bytes, int], tuple[int, int]] = OrderedDict()
        self.failed: set[tuple[bytes, int]] = set()  # never manifested this boot
        self._pending: OrderedDict[str, tuple[Candidate, set[tuple[bytes, int]]]] = (
            OrderedDict()
        )
        self._waiting: dict[tuple[bytes, int], set[str]] = {}
        self._manifests: dict[str, tuple[str, ...]] = {}  # name -> chain (hex)
        self._made_dirs: set[str] = set()
        self._dirty_dirs: set[str] = set()
        self.paused_until: float | None = None
        self._queue: deque[CapturedJob] = deque()
        self._cv = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._busy = False
        self._lock_fd: int | None = None
        self._locked = False
        # Files written but not yet synced, and the I/O thread syncing them.
        self._io: ThreadPoolExecutor | None = None
        self._io_batch: tuple[list[_StagedFile], Future] | None = None
        self._staged: set[tuple[bytes, int]] = set()
        self._checksums = Checksummer(
            checksum_threads
            if checksum_threads is not None
            else default_checksum_threads()
        )
        self._prepare()

    # -- setup ---------------------------------------------------------------

    def _prepare(self) -> None:
        os.makedirs(self.layout.manifest_dir, exist_ok=True)
        _fsync_dir(self.layout.base)
        _fsync_dir(self.layout.root)
        self._lock_fd = os.open(self.layout.lock, os.O_RDWR | os.O_CREAT, 0o644)
        for name in sorted(os.listdir(self.layout.manifest_dir)):
            try:
                fmt.parse_manifest_file_name(name)
                with open(os.path.join(self.layout.manifest_dir, name), "rb") as f:
                    manifest = fmt.decode_manifest(f.read(fmt.MAX_MANIFEST_BYTES + 1))
            except (OSError, fmt.FormatError):
                continue  # temps and damaged files are kvstore gc's business
            self._manifests[name] = manifest.chain

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name=f"kv-store-writer-r{self.rank}", daemon=True
        )
        self._thread.start()

    # -- serving-side API ----------------------------------------------------

    @property
    def accepting(self) -> bool:
        return self.paused_until is None and not self._stop

    def submit(self, job: CapturedJob) -> None:
        with self._cv:
            self._queue.append(job)
            self._cv.notify()
        if self._thread is None:
            self.drain()  # no thread (tests, bench): write right here

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Wait until every submitted job has been processed."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while self._queue or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(min(left, 0.05))
        return True

    def close(self, timeout: float = 10.0) -> None:
        """Stop after the queued jobs, waiting at most ``timeout`` seconds."""
        with self._cv:
            self._stop = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._thread is None or not self._thread.is_alive():
            if self._io is not None:
                self._io.shutdown(wait=True)
            self._checksums.close()
        if self._lock_fd is not None and (
            self._thread is None or not self._thread.is_alive()
        ):
            os.close(self._lock_fd)
            self._lock_fd = None

    def drain(self) -> None:
        """Process every queued job on the calling thread (tests, bench)."""
        while True:
            with self._cv:
                if not self._queue:
                    break
                job = self._queue.popleft()
            self.process(job)
        self.flush()

    # -- writer thread -------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._stop:
                    self._cv.wait(timeout=self.pause_seconds)
                    if self.paused_until is not None:
                        break
                if self._stop and not self._queue:
                    return
                job = self._queue.popleft() if self._queue else None
                self._busy = job is not None
            if job is not None:
                try:
                    self.process(job)
                except Exception:
                    logger.exception("KV store: writer failed on job %d", job.job_id)
                    self._release(job)
                finally:
                    with self._cv:
                        idle = not self._queue
                    if idle:
                        self._flush_logged()
                    with self._cv:
                        self._busy = False
                        self._cv.notify_all()
            elif self.paused_until is not None:
                self.maybe_resume()

    def process(self, job: CapturedJob) -> None:
        """Stage this job's files, then commit the previous job's.

        Committing one job late lets the disk write back job N-1 while job
        N's checksums are computed and its bytes copied into the page cache;
        ``flush`` commits the rest once the queue is empty.
        """
        if self.paused_until is not None and not self.maybe_resume():
            self.stats.keys_dropped_paused += len(job.keys)
            self._release(job)
            return
        # Checksums of this job, and of the next one while this one is
        # written (the serving side only appends to the queue).
        self._start_checksums(job)
        with self._cv:
            following = self._queue[0] if self._queue else None
        if following is not None:
            self._start_checksums(following)
        self._lock_shared()
        ready: list[str] = []
        for candidate in job.candidates:
            ready += self._register(candidate)
        staged: list[_StagedFile] = []
        for index, item in enumerate(job.keys):
            if self.paused_until is not None:
                rest = job.keys[index:]
                self.stats.keys_dropped_paused += len(rest)
                for left in rest:
                    self._free(left)
                break
            try:
                result = self._stage_key(item)
            finally:
                self._free(item)  # the page cache holds it now
            if isinstance(result, _StagedFile):
                staged.append(result)
                self._staged.add(result.ident)
            elif result is not None:
                ready += self._mark_durable((item.hash, item.group), result)
        # The previous job's files are synced by now (or we wait for them);
        # this job's are synced on the I/O thread while the next one stages.
        ready += self._join_commit()
        self._start_commit(staged)
        self._publish_ready(ready)

    def flush(self) -> None:
        """Commit what is staged, publish what it completes, drop the lock."""
        try:
            ready = self._join_commit()
            self._sync_dirs()
            self._publish_ready(ready)
        finally:
            self._unlock()

    def _publish_ready(self, ready: list[str]) -> None:
        # Directories are synced in batches: the I/O thread syncs the
        # directories of each batch it renames; the rest (new parents, files
        # found on disk) here, once, before any manifest can name them.
        if ready or len(self._dirty_dirs) > 4096:
            self._sync_dirs()
        for name in dict.fromkeys(ready):
            self._publish(name)

    def _start_checksums(self, job: CapturedJob) -> None:
        for item in job.keys:
            if item.checksum is None:
                item.checksum = self._checksums.start(
                    self.pool.view(item.offset, item.size)
                )

    def _free(self, item: CapturedKey) -> None:
        if item.freed:
            return  # a failed job is released whole after some keys went
        item.freed = True
        if item.checksum is not None:
            item.checksum.settle()  # no checksum thread still reads the bytes
            item.checksum = None
        self.pool.free(item.offset)

    def _flush_logged(self) -> None:
        try:
            self.flush()
        except Exception:
            logger.exception("KV store: writer failed committing staged files")

    def _lock_shared(self) -> None:
        # Shared lock from reusing/writing chunks until the manifests naming
        # them are published: kvstore gc --sweep takes it exclusively.
        if not self._locked:
            assert self._lock_fd is not None
            fcntl.flock(self._lock_fd, fcntl.LOCK_SH)
            self._locked = True

    def _unlock(self) -> None:
        if self._locked:
            assert self._lock_fd is not None
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            self._locked = False

    def _release(self, job: CapturedJob) -> None:
        for item in job.keys:
            self._free(item)

    # -- chunks --------------------------------------------------------------

    def _chunk_path(self, hash_: bytes, group: int) -> str:
        return self.layout.chunk(hash_.hex(), group)

    def _verified_header(self, hash_: bytes, group: int) -> fmt.ChunkHeader | None:
        try:
            header = fmt.read_chunk_header(self._chunk_path(hash_, group))
        except (OSError, fmt.FormatError):
            return None
        if (
            header.namespace_hash != self.namespace
            or header.group != group
            or header.key_hash != hash_
        ):
            return None
        return header

    def _stage_key(self, item: CapturedKey) -> "_StagedFile | tuple[int, int] | None":
        """Dedup, or write the key's temp file and start its writeback.

        Returns the verified (length, checksum) of a file already there, a
        staged temp file to commit, or None when the key is not written.
        """
        ident = (item.hash, item.group)
        if ident in self.failed or ident in self._staged:
            return None  # failed this boot, or already on its way to disk
        header = self._verified_header(item.hash, item.group)
        if header is not None:
            # Dedup only on a header that verifies; anything else is rewritten.
            self.stats.keys_deduplicated += 1
            self._dirty_dirs.add(os.path.dirname(self._chunk_path(*ident)))
            return header.payload_length, header.payload_checksum
        path = self._chunk_path(item.hash, item.group)
        start = time.perf_counter()
        try:
            self._make_dirs(os.path.dirname(path))
            payload = self.pool.view(item.offset, item.size)
            if item.checksum is None:
                item.checksum = self._checksums.start(payload)
            header = fmt.ChunkHeader(
                namespace_hash=self.namespace,
                group=item.group,
                key_hash=item.hash,
                boundary=item.boundary,
                segments=tuple(item.segments),
                payload_length=len(payload),
                payload_checksum=item.checksum.result(),
            )
            fd, tmp = write_chunk_file(path, fmt.encode_header(header), payload)
        except OSError as e:
            self._failed_write(ident, path, e)
            return None
        self.stats.write_seconds += time.perf_counter() - start
        return _StagedFile(ident, path, tmp, fd, header, item.size)

    def _start_commit(self, staged: "list[_StagedFile]") -> None:
        """fsync + rename on the I/O thread while this thread stages more."""
        assert self._io_batch is None
        if staged:
            if self._io is None:
                self._io = ThreadPoolExecutor(1, thread_name_prefix="kv-store-sync")
            self._io_batch = (staged, self._io.submit(_sync_and_rename, staged))

    def _join_commit(self) -> list[str]:
        if self._io_batch is None:
            return []
        staged, future = self._io_batch
        self._io_batch = None
        future.result()
        return self._finalize(staged)

    def _finalize(self, staged: "list[_StagedFile]") -> list[str]:
        """Bookkeeping for synced files, on the writer thread only."""
        ready: list[str] = []
        for f in staged:
            self._staged.discard(f.ident)
            if f.error is not None:
                self._failed_write(f.ident, f.path, f.error)
                continue
            self.stats.keys_written += 1
            self.stats.bytes_written += f.size
            entry = (f.header.payload_length, f.header.payload_checksum)
            ready += self._mark_durable(f.ident, entry)
        return ready

    def _failed_write(self, ident: tuple[bytes, int], path: str, e: OSError) -> None:
        self.failed.add(ident)
        self.stats.keys_failed += 1
        if e.errno == errno.ENOSPC:
            self._pause()
        logger.warning(
            "KV store: writing %s failed (%s); this key is not manifested again "
            "this boot",
            path,
            e,
        )

    def _make_dirs(self, directory: str) -> None:
        if directory in self._made_dirs:
            return
        missing = []
        d = directory
        while not os.path.isdir(d):
            missing.append(d)
            d = os.path.dirname(d)
        for d in reversed(missing):
            try:
                os.mkdir(d)
            except FileExistsError:
                pass
            # The new entry must be durable before files in it are named.
            self._dirty_dirs.add(os.path.dirname(d))
        self._made_dirs.add(directory)

    def _sync_dirs(self) -> None:
        # Deepest first, so a parent's entry lands after its children's.
        for d in sorted(self._dirty_dirs, key=len, reverse=True):
            _fsync_dir(d)
        self._dirty_dirs.clear()

    def _pause(self) -> None:
        self.paused_until = time.monotonic() + self.pause_seconds
        self.stats.enospc_pauses += 1
        logger.warning(
            "KV store: disk full under %s; writer paused, stores are dropped "
            "until space returns",
            self.layout.base,
        )

    def _enough_space(self) -> bool:
        st = os.statvfs(self.layout.base)
        return st.f_bavail * st.f_frsize >= self.min_free_bytes

    def maybe_resume(self) -> bool:
        if self.paused_until is None:
            return True
        if time.monotonic() < self.paused_until:
            return False
        if not self.resume_probe():
            self.paused_until = time.monotonic() + self.pause_seconds
            return False
        self.paused_until = None
        logger.info(
            "KV store: space is back under %s; writer resumed", self.layout.base
        )
        return True

    # -- manifests -----------------------------------------------------------

    def _register(self, candidate: Candidate) -> list[str]:
        """Track a candidate; returns it when nothing it names is missing.

        The caller publishes only after syncing the directories of every
        file found on disk here (see _found_on_disk).
        """
        name = candidate.name
        if name in self._manifests or name in self._pending:
            return []
        missing: set[tuple[bytes, int]] = set()
        for ident in candidate.needed():
            if ident in self.failed:
                self.stats.manifests_dropped += 1
                return []
            if ident in self._durable:
                self._durable.move_to_end(ident)
                continue
            header = self._verified_header(*ident)
            if header is not None:
                self._found_on_disk(ident, header)
            else:
                missing.add(ident)
        self._pending[name] = (candidate, missing)
        for ident in missing:
            self._waiting.setdefault(ident, set()).add(name)
        if not missing:
            return [name]
        while len(self._pending) > self.MAX_PENDING_CANDIDATES:
            old, (_, old_missing) = self._pending.popitem(last=False)
            self._forget_waiting(old, old_missing)
            self.stats.manifests_dropped += 1
        return []

    def _forget_waiting(self, name: str, missing: Iterable[tuple[bytes, int]]) -> None:
        for ident in missing:
            names = self._waiting.get(ident)
            if names is not None:
                names.discard(name)
                if not names:
                    del self._waiting[ident]

    def _found_on_disk(self, ident: tuple[bytes, int], header: fmt.ChunkHeader) -> None:
        """A file this boot did not sync (an earlier boot's, or one renamed on
        the I/O thread a moment ago): its data was fsynced before its rename,
        but its directory entry may not be durable yet, so sync that too
        before any manifest names it."""
        self._dirty_dirs.add(os.path.dirname(self._chunk_path(*ident)))
        self._durable[ident] = (header.payload_length, header.payload_checksum)
        while len(self._durable) > self.MAX_KNOWN_DURABLE:
            self._durable.popitem(last=False)

    def _mark_durable(
        self, ident: tuple[bytes, int], entry: tuple[int, int]
    ) -> list[str]:
        self._durable[ident] = entry
        self._durable.move_to_end(ident)
        while len(self._durable) > self.MAX_KNOWN_DURABLE:
            self._durable.popitem(last=False)
        ready = []
        for name in self._waiting.pop(ident, ()):
            pending = self._pending.get(name)
            if pending is None:
                continue
            pending[1].discard(ident)
            if not pending[1]:
                ready.append(name)
        return ready

    def _publish(self, name: str) -> None:
        pending = self._pending.pop(name, None)
        if pending is None:
            return
        candidate = pending[0]
        groups = []
        entries: dict[tuple[bytes, int], fmt.ManifestEntry] = {}
        # Re-verify every named file now, under the shared lock: the manifest
        # may name chunks written long ago or by an earlier boot.
        for ident in candidate.needed():
            header = None if ident in self.failed else self._verified_header(*ident)
            known = self._durable.get(ident)
            if header is None or (
                known is not None
                and known != (header.payload_length, header.payload_checksum)
            ):
                self._durable.pop(ident, None)
                self.stats.manifests_dropped += 1
                logger.warning(
                    "KV store: not publishing %s: %s (group %d) is missing or "
                    "does not verify",
                    name,
                    ident[0].hex(),
                    ident[1],
                )
                return
            entries[ident] = fmt.ManifestEntry(
                ident[0].hex(), header.payload_length, header.payload_checksum
            )
        for g in sorted((*candidate.full, *candidate.state)):
            if g in candidate.full:
                group_entries = tuple(entries[(h, g)] for h in candidate.chain)
                kind = fmt.GROUP_KIND_FULL
            else:
                group_entries = (entries[(candidate.chain[-1], g)],)
                kind = fmt.GROUP_KIND_STATE
            groups.append(fmt.ManifestGroup(g, kind, group_entries))
        manifest = fmt.BoundaryManifest(
            namespace=self.namespace.hex(),
            rank=self.rank,
            boundary=candidate.boundary,
            chunk_tokens=candidate.chunk_tokens,
            chain=tuple(h.hex() for h in candidate.chain),
            groups=tuple(groups),
        )
        try:
            write_file_durably(
                os.path.join(self.layout.manifest_dir, name),
                [fmt.encode_manifest(manifest)],
            )
        except (OSError, fmt.FormatError) as e:
            self.stats.manifests_dropped += 1
            if isinstance(e, OSError) and e.errno == errno.ENOSPC:
                self._pause()
            logger.warning("KV store: publishing manifest %s failed: %s", name, e)
            return
        self.stats.manifests_published += 1
        self._manifests[name] = manifest.chain
        self._retain(manifest)

    def _retain(self, manifest: fmt.BoundaryManifest) -> None:
        """Keep-K inline, within the tree of chains the new manifest joins."""
        if self.keep == 0:
            return
        root = manifest.chain[0]
        tree = {n: c for n, c in self._manifests.items() if c[0] == root}
        kept = fmt.kept_manifests(tree, self.keep)
        superseded = [n for n in tree if n not in kept]
        if not superseded:
            return
        kept_state = set()
        for n in kept:
            kept_state.add(tree[n][-1])
        removed_dirs: set[str] = set()
        for n in superseded:
            path = os.path.join(self.layout.manifest_dir, n)
            manifest_chain = tree[n]
            try:
                with open(path, "rb") as f:
                    old = fmt.decode_manifest(f.read(fmt.MAX_MANIFEST_BYTES + 1))
            except (OSError, fmt.FormatError):
                old = None
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            del self._manifests[n]
            self.stats.manifests_superseded += 1
            removed_dirs.add(self.layout.manifest_dir)
            if old is None or manifest_chain[-1] in kept_state:
                continue
            # Full-attention chunks stay (descendants name them); the state
            # payloads of a superseded boundary go with it.
            for group in old.groups:
                if group.kind != fmt.GROUP_KIND_STATE:
                    continue
                chunk = self.layout.chunk(old.tip, group.group)
                try:
                    os.unlink(chunk)
                except FileNotFoundError:
                    continue
                self._durable.pop((bytes.fromhex(old.tip), group.group), None)
                self.stats.state_files_removed += 1
                removed_dirs.add(os.path.dirname(chunk))
        for d in removed_dirs:
            _fsync_dir(d)


@dataclass
class _StagedFile:
    ident: tuple[bytes, int]
    path: str
    tmp: str
    fd: int
    header: fmt.ChunkHeader
    size: int
    error: OSError | None = None


def _sync_and_rename(staged: Sequence[_StagedFile]) -> None:
    """fsync, close and rename each file, then sync their directories; a
    failure removes the file (temp or renamed).

    Pure I/O on the given files (runs on the writer's I/O thread); errors are
    recorded on each file for the writer thread to handle.
    """
    for f in staged:
        try:
            try:
                os.fsync(f.fd)
            finally:
                os.close(f.fd)
            os.rename(f.tmp, f.path)
        except OSError as e:
            f.error = e
            try:
                os.unlink(f.tmp)
            except OSError:
                pass
    # One sync per directory per batch, before the writer thread marks any
    # of these files durable (so before a manifest can name them).
    renamed: dict[str, list[_StagedFile]] = {}
    for f in staged:
        if f.error is None:
            renamed.setdefault(os.path.dirname(f.path), []).append(f)
    for directory, files in renamed.items():
        try:
            _fsync_dir(directory)
        except OSError as e:
            for f in files:
                f.error = e
                try:
                    os.unlink(f.path)
                except OSError:
                    pass


def write_chunk_file(path: str, header: bytes, payload: memoryview) -> tuple[int, str]:
    """Write a chunk's temp file and start its writeback; return (fd, temp).

    The caller fsyncs, closes and renames it (StoreWriter._commit). On error
    the temp file is removed and the error raised: no partial file is left.
    Split out so tests can inject faults.
    """
    directory, name = os.path.split(path)
    tmp = os.path.join(
        directory, fmt.temp_name(name, os.getpid(), threading.get_native_id())
    )
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        _write_all(fd, header)
        _write_all(fd, payload)
        _start_writeback(fd)
    except BaseException:
        os.close(fd)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return fd, tmp


_SYNC_FILE_RANGE_WRITE = 2


def _start_writeback(fd: int) -> None:
    """Ask Linux to start writing the file back now (no wait); best effort."""
    fn = _sync_file_range()
    if fn is not None:
        fn(fd, 0, 0, _SYNC_FILE_RANGE_WRITE)


_SFR: list[Any] = []


def _sync_file_range() -> Any:
    if not _SFR:
        try:
            fn = ctypes.CDLL(None, use_errno=True).sync_file_range
            fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
            fn.restype = ctypes.c_int
        except (OSError, AttributeError):
            fn = None
        _SFR.append(fn)
    return _SFR[0]


# --------------------------------------------------------------------------
# Namespace record
# --------------------------------------------------------------------------


def open_namespace(
    root: str,
    model: str,
    rank: int,
    fenced: Mapping[str, Any],
    info: Mapping[str, Any],
) -> fmt.StoreLayout:
    """Write the record once, or check an existing one; raise WriterDisabled.

    The fenced part must match exactly; info fields may differ (they are
    diagnostics, such as keep-K or where the rank came from).
    """
    record = fmt.NamespaceRecord(fenced=dict(fenced), info=dict(info))
    ns = record.namespace_hash
    layout = fmt.StoreLayout.create(root, model, ns, rank)
    os.makedirs(root, exist_ok=True)
    try:
        with open(layout.namespace_record, "rb") as f:
            existing = f.read(fmt.MAX_RECORD_BYTES + 1)
    except FileNotFoundError:
        existing = None
    if existing is None:
        write_file_durably(
            layout.namespace_record, [fmt.encode_namespace_record(record)]
        )
        return layout
    try:
        old = fmt.decode_namespace_record(existing)
    except fmt.FormatError as e:
        raise WriterDisabled(
            f"namespace record {layout.namespace_record} is unreadable: {e}"
        ) from e
    if fmt.canonical_json(dict(old.fenced)) != fmt.canonical_json(dict(fenced)):
        raise WriterDisabled(
            f"namespace record {layout.namespace_record} fences a different "
            "namespace (model, build, layout or format changed)"
        )
    return layout


def resolve_rank(
    config_rank: int, config_tp_size: int, tp: Callable[[], tuple[int, int]] | None
) -> tuple[int, str]:
    """The initialized TP rank, cross-checked with the connector config.

    Returns (rank, provenance); raises WriterDisabled on disagreement, so two
    ranks never share one directory.
    """
    if tp is None:
        return config_rank, "connector config (no TP group handle)"
    try:
        tp_rank, tp_size = tp()
    except (AssertionError, RuntimeError, ImportError) as e:  # no TP group yet
        reason = f"connector config (TP group unavailable: {e})"
        logger.info("KV store: rank from %s", reason)
        return config_rank, reason
    if tp_size != config_tp_size or config_rank % config_tp_size != tp_rank:
        raise WriterDisabled(
            f"TP rank {tp_rank}/{tp_size} disagrees with the connector config "
            f"(rank {config_rank}, TP size {config_tp_size})"
        )
    return tp_rank, "initialized TP group"


# --------------------------------------------------------------------------
# Worker glue
# --------------------------------------------------------------------------


@dataclass
class _Remembered:
    chunk_ids: list[int]
    group_sizes: list[int]
    block_indices: list[int]
    meta: Any


@dataclass
class WorkerSettings:
    """The facts the writer needs from vLLM, as plain values."""

    model: str
    vllm_version: str
    kv_dtype: str
    hash_algorithm: str
    num_speculative_tokens: int
    tp_size: int
    config_rank: int
    blocks_per_chunk: int
    groups: list[GroupLayout] = field(default_factory=list)
    mamba_types: dict[int, str] = field(default_factory=dict)
    unsupported: str | None = None  # why this layout cannot be written


class WorkerStore:
    """The worker-side object the hooks call; every failure disables it."""

    def __init__(
        self,
        knobs: StoreKnobs,
        settings: WorkerSettings,
        *,
        tp: Callable[[], tuple[int, int]] | None = None,
        capture_budget: int = DEFAULT_CAPTURE_BUDGET_BYTES,
        copy_engine: str | None = None,
        copy_threads: int = 4,
    ):
        self.knobs = knobs
        self.settings = settings
        self.stats = StoreStats()
        self._tp = tp
        self._budget = capture_budget
        self._engine = copy_engine
        self._copy_threads = copy_threads
        self._remembered: dict[int, _Remembered] = {}
        self._slots: dict[int, GroupLayout] = {}
        self._staging: list[StagingTensor] = []
        self.writer: StoreWriter | None = None
        self.copier: Copier | None = None
        self.disabled_reason: str | None = None
        self._drops_logged = 0

    # -- construction from vLLM ---------------------------------------------

    @classmethod
    def from_vllm(
        cls, spec: Any, vllm_config: Any, kv_cache_config: Any
    ) -> "WorkerStore":
        knobs = read_knobs()
        settings = _settings_from_vllm(spec, vllm_config, kv_cache_config)
        return cls(knobs, settings, tp=_initialized_tp)

    def attach(self, worker: Any, kv_caches: Any, is_store_writer: bool) -> None:
        """Called once the CPU offloading worker exists."""
        try:
            if not is_store_writer:
                raise WriterDisabled(
                    "this rank does not store (replicated layout: rank 0 writes "
                    "the single copy)"
                )
            staging = _staging_from_worker(worker, kv_caches)
            refs = [
                [(ref.tensor_idx, ref.page_size_bytes) for ref in group_refs]
                for group_refs in kv_caches.group_data_refs
            ]
            self.settings.groups = bind_layers(self.settings.groups, refs)
            self.start(staging)
        except WriterDisabled as e:
            self.disable(str(e))

    def start(self, staging: Sequence[StagingTensor], background: bool = True) -> None:
        """Resolve rank and namespace, open the store, start the thread.

        Without ``background`` jobs are written on the capturing thread
        (tests and the benchmark use this to measure each side alone).
        """
        s = self.settings
        if s.unsupported:
            raise WriterDisabled(s.unsupported)
        rank, provenance = resolve_rank(s.config_rank, s.tp_size, self._tp)
        fenced = fmt.make_fenced(
            model=s.model,
            vllm_version=s.vllm_version,
            build_id=self.knobs.build_id,
            tp_size=s.tp_size,
            kv_dtype=s.kv_dtype,
            hash_algorithm=s.hash_algorithm,
            num_speculative_tokens=s.num_speculative_tokens,
            page_sizes={g.group: g.block_bytes for g in s.groups},
            state_abi=_state_abi(s),
        )
        info = {
            "keep_boundaries": self.knobs.keep_boundaries,
            "rank_source": provenance,
            "cpu_gb": self.knobs.cpu_gb,
            "drafter": self.knobs.drafter,
            "blocks_per_chunk": s.blocks_per_chunk,
        }
        try:
            layout = open_namespace(self.knobs.root, s.model, rank, fenced, info)
            namespace = fmt.namespace_hash(fenced)
            pool = CapturePool(self._budget)
            self.writer = StoreWriter(
                layout,
                namespace,
                rank,
                pool,
                self.knobs.keep_boundaries,
                stats=self.stats,
            )
        except OSError as e:
            raise WriterDisabled(
                f"cannot open the store under {self.knobs.root}: {e}"
            ) from e
        self._staging = list(staging)
        self._slots = {g.slot: g for g in s.groups}
        for g in s.groups:
            for layer in g.layers:
                if not 0 <= layer.tensor < len(self._staging) or (
                    layer.real_bytes * s.blocks_per_chunk
                    > self._staging[layer.tensor].width
                ):
                    raise WriterDisabled(
                        f"group {g.group} does not fit its staging rows"
                    )
        engine = self._engine or _default_engine(self._staging)
        self.copier = Copier(pool, engine, self._copy_threads)
        if background:
            self.writer.start()
        logger.info(
            "KV store: writer up: rank %d/%d (%s), %s, groups %s, capture budget "
            "%d MiB, copy engine %s, keep %d boundaries",
            rank,
            s.tp_size,
            provenance,
            layout.base,
            [g.group for g in s.groups],
            self._budget >> 20,
            engine,
            self.knobs.keep_boundaries,
        )

    def disable(self, reason: str) -> None:
        self.disabled_reason = reason
        self._remembered.clear()
        logger.warning("KV store: writer disabled on this rank: %s", reason)

    @property
    def active(self) -> bool:
        return self.writer is not None and self.disabled_reason is None

    # -- hooks ---------------------------------------------------------------

    def remember(self, job_id: int, entry: Any) -> None:
        if not self.active:
            return
        src, dst = entry.src_spec, entry.dst_spec
        self._remembered[job_id] = _Remembered(
            chunk_ids=[int(c) for c in dst.block_ids],
            group_sizes=[int(n) for n in src.group_sizes],
            block_indices=[int(i) for i in src.block_indices],
            meta=getattr(entry, "kv_store_meta", None),
        )

    def capture_jobs(self, job_ids: Iterable[int]) -> None:
        for job_id in sorted(job_ids):
            self.capture(job_id)

    def capture(self, job_id: int) -> None:
        """Copy a completed store job's bytes out of staging. Never raises."""
        rec = self._remembered.pop(job_id, None)
        if rec is None or not self.active:
            return
        try:
            self._capture(job_id, rec)
        except ValueError as e:
            # The side channel does not describe this job's transfer: write
            # nothing rather than guess which bytes belong to which key.
            self.stats.jobs_mismatched += 1
            if self.stats.jobs_mismatched & (self.stats.jobs_mismatched - 1) == 0:
                logger.warning(
                    "KV store: job %d dropped (%s); %d such jobs so far",
                    job_id,
                    e,
                    self.stats.jobs_mismatched,
                )
        except Exception:
            logger.exception("KV store: capture of job %d failed; dropped", job_id)

    def _capture(self, job_id: int, rec: _Remembered) -> None:
        assert self.writer is not None and self.copier is not None
        meta = rec.meta
        if (
            not isinstance(meta, dict)
            or meta.get("version") != META_VERSION
            or (not meta.get("keys"))
        ):
            self.stats.jobs_without_meta += 1
            return
        plan = self._plan(rec, meta)
        candidates = [
            Candidate(
                boundary=c["boundary"],
                chunk_tokens=c["chunk_tokens"],
                chain=tuple(c["chain"]),
                full=tuple(c["full"]),
                state=tuple(c["state"]),
            )
            for c in meta.get("candidates") or ()
        ]
        if not self.writer.accepting:
            self.stats.keys_dropped_paused += len(plan)
            return
        start = time.perf_counter()
        runs = []
        keys = []
        pool = self.writer.pool
        for hash_, group_layout, token, chunk_id, first, count in plan:
            size = group_layout.block_bytes * count
            offset = pool.alloc(size)
            if offset is None:
                self.stats.keys_dropped_budget += 1
                self._log_drop()
                continue
            dst = offset
            for layer in group_layout.layers:
                t = self._staging[layer.tensor]
                page = t.width // self.settings.blocks_per_chunk
                row = t.offset + chunk_id * t.row_stride
                for j in range(first, first + count):
                    runs.append((t.source, row + j * page, dst, layer.real_bytes))
                    dst += layer.real_bytes
            keys.append(
                CapturedKey(
                    hash_,
                    group_layout.group,
                    token,
                    offset,
                    size,
                    group_layout.segments(count),
                )
            )
        self.copier.copy(coalesce(runs))
        self.stats.capture_seconds += time.perf_counter() - start
        self.stats.jobs_captured += 1
        self.stats.keys_captured += len(keys)
        self.stats.bytes_captured += sum(k.size for k in keys)
        self.writer.submit(CapturedJob(job_id, keys, candidates))

    def _plan(
        self, rec: _Remembered, meta: dict
    ) -> list[tuple[bytes, GroupLayout, int, int, int, int]]:
        """(hash, group, end token, chunk id, first sub-block, sub-blocks) per key.

        Cross-checks the side channel against the transfer spec; keys whose
        chunk the DMA did not fill completely are left out.
        """
        keys, groups, tokens = meta["keys"], meta["groups"], meta["tokens"]
        if not (len(keys) == len(groups) == len(tokens) == len(rec.chunk_ids)):
            raise ValueError("side channel does not match the job's chunk count")
        bpc = self.settings.blocks_per_chunk
        plan = []
        index = 0
        for slot, (blocks, block_idx) in enumerate(
            zip(rec.group_sizes, rec.block_indices, strict=True)
        ):
            if blocks == 0:
                continue
            layout = self._slots.get(slot)
            skip = block_idx % bpc
            chunks = -(-(blocks + skip) // bpc)
            for c in range(chunks):
                if index >= len(keys):
                    raise ValueError("side channel names fewer keys than the spec")
                if layout is None or groups[index] != layout.group:
                    raise ValueError(
                        f"key {index} is group {groups[index]}, spec slot {slot}"
                    )
                first = skip if c == 0 else 0
                last = min(bpc, skip + blocks - c * bpc)
                count = last - first
                complete = count == bpc or (layout.kind == "state" and count == 1)
                if complete:
                    plan.append(
                        (
                            key_hash(keys[index]),
                            layout,
                            tokens[index],
                            rec.chunk_ids[index],
                            first,
                            count,
                        )
                    )
                else:
                    self.stats.keys_dropped_incomplete += 1
                index += 1
        if index != len(keys):
            raise ValueError("side channel names more keys than the spec")
        return plan

    def _log_drop(self) -> None:
        dropped = self.stats.keys_dropped_budget
        if dropped & (dropped - 1) == 0:  # 1, 2, 4, 8, ...: loud but bounded
            logger.warning(
                "KV store: capture budget (%d MiB) full; %d stores dropped so far",
                self._budget >> 20,
                dropped,
            )

    def shutdown(self) -> None:
        self._remembered.clear()
        if self.writer is not None:
            self.writer.close()
        if self.copier is not None:
            self.copier.close()


def _default_engine(staging: Sequence[StagingTensor]) -> str:
    # Measured on an H200 host (bench/store_bench.py): threaded memmove out of
    # the pinned region beats per-layer torch copy_ by ~5x, and it does not
    # depend on the worker's torch thread count (vLLM sets it to 1).
    return "memmove"


def _state_abi(s: WorkerSettings) -> dict[str, Any]:
    groups = []
    for g in s.groups:
        if g.kind != "state":
            continue
        layer = g.layers[0]
        groups.append(
            {
                "group": g.group,
                "mamba_type": s.mamba_types.get(g.group, ""),
                "layers": len(g.layers),
                "states": [
                    {"dtype": p.dtype, "shape": list(p.shape)} for p in layer.state
                ],
            }
        )
    return {"groups": groups}


# --------------------------------------------------------------------------
# vLLM adapters (the only code that touches vLLM or torch objects)
# --------------------------------------------------------------------------


def _initialized_tp() -> tuple[int, int]:
    from vllm.distributed.parallel_state import get_tp_group

    group = get_tp_group()
    return group.rank_in_group, group.world_size


def _vllm_version() -> str:
    try:
        from vllm import __version__

        return str(__version__)
    except ImportError:
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("vllm")
        except PackageNotFoundError:
            return "unknown"


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def _settings_from_vllm(
    spec: Any, vllm_config: Any, kv_cache_config: Any
) -> WorkerSettings:
    from vllm.v1.kv_cache_interface import (
        AttentionSpec,
        MambaSpec,
        UniformTypeKVCacheSpecs,
    )

    config = spec.config
    parallel = config.parallel
    speculative = vllm_config.speculative_config
    settings = WorkerSettings(
        model=config.model.name,
        vllm_version=_vllm_version(),
        kv_dtype=config.model.dtype,
        hash_algorithm=str(vllm_config.cache_config.prefix_caching_hash_algo),
        num_speculative_tokens=(
            speculative.num_speculative_tokens or 0 if speculative is not None else 0
        ),
        tp_size=parallel.tp_size,
        config_rank=parallel.rank,
        blocks_per_chunk=spec.blocks_per_chunk,
    )
    if parallel.pp_size > 1 or parallel.pcp_size > 1 or parallel.dcp_size > 1:
        settings.unsupported = "only tensor parallelism is supported"
    if config.canonical_layout:
        settings.unsupported = "the canonical host layout is not supported"
    for slot, group_config in enumerate(config.groups):
        group = kv_cache_config.kv_cache_groups[group_config.group_id]
        group_spec = group.kv_cache_spec
        per_layer = (
            group_spec.kv_cache_specs
            if isinstance(group_spec, UniformTypeKVCacheSpecs)
            else {}
        )
        layers = []
        kind = (
            "full" if group_config.sliding_window_size_in_chunks is None else "window"
        )
        for name in group_config.layer_names:
            layer_spec = per_layer.get(name, group_spec)
            if isinstance(layer_spec, MambaSpec):
                kind = "state"
                parts = tuple(
                    StatePart(_dtype_name(d), tuple(int(x) for x in shape))
                    for shape, d in zip(
                        layer_spec.shapes, layer_spec.dtypes, strict=True
                    )
                )
                if any(p.dtype not in _DTYPES for p in parts):
                    settings.unsupported = f"state dtype of layer {name}"
                    parts = ()
                settings.mamba_types[group_config.group_id] = str(
                    getattr(layer_spec.mamba_type, "value", layer_spec.mamba_type)
                )
                layers.append(LayerLayout(-1, sum(p.nbytes for p in parts), parts))
            elif isinstance(layer_spec, AttentionSpec):
                layers.append(LayerLayout(-1, layer_spec.unpadded_page_size_bytes))
            else:
                settings.unsupported = f"layer {name} has an unsupported KV spec"
                layers.append(LayerLayout(-1, 0))
        settings.groups.append(
            GroupLayout(group_config.group_id, slot, kind, tuple(layers))
        )
    return settings


def _staging_from_worker(worker: Any, kv_caches: Any) -> list[StagingTensor]:
    """Find the staging tensors and bind each layer to its tensor.

    Reads the CPU offloading worker's store handler; anything unexpected
    disables the writer rather than risk writing the wrong bytes.
    """
    import torch

    handler = getattr(worker, "_store_handler", None)
    cpu_tensors = getattr(handler, "dst_tensors", None)
    if cpu_tensors is None or len(cpu_tensors) != len(kv_caches.tensors):
        raise WriterDisabled(
            "not a CPU offloading worker with one staging tensor per KV tensor"
        )
    flats: dict[int, Any] = {}
    staging = []
    for t in cpu_tensors:
        storage = t.untyped_storage()
        flat = flats.get(storage.data_ptr())
        if flat is None:
            flat = torch.empty(0, dtype=torch.uint8).set_(
                storage, 0, (storage.nbytes(),), (1,)
            )
            flats[storage.data_ptr()] = flat
        size = t.element_size()
        staging.append(
            StagingTensor(
                flat, t.storage_offset() * size, t.stride(0) * size, t.shape[1] * size
            )
        )
    return staging


def bind_layers(
    groups: Sequence[GroupLayout], refs: Sequence[Sequence[tuple[int, int]]]
) -> list[GroupLayout]:
    """Bind each layer to its staging tensor from the worker's per-group refs.

    refs[slot] lists (tensor index, unpadded page bytes) per layer, in the
    group's layer order. A layout that does not match one to one (packed
    layouts, for one) disables the writer.
    """
    bound = []
    for g in groups:
        if g.slot >= len(refs) or len(refs[g.slot]) != len(g.layers):
            raise WriterDisabled(
                f"group {g.group}: the worker's transfer refs do not map one to "
                "one onto its layers (packed layout?)"
            )
        layers = []
        for layer, (tensor, page_bytes) in zip(g.layers, refs[g.slot], strict=True):
            if page_bytes != layer.real_bytes:
                raise WriterDisabled(
                    f"group {g.group}: the DMA copies {page_bytes} bytes per page, "
                    f"the spec says {layer.real_bytes}"
                )
            layers.append(LayerLayout(tensor, layer.real_bytes, layer.state))
        bound.append(GroupLayout(g.group, g.slot, g.kind, tuple(layers)))
    return bound
