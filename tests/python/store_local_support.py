"""A miniature of the 7-group hybrid layout for the store-local writer tests.

g0 full attention, g1 scratch (not offloaded), g2-g5 state groups (one conv
and one temporal state per layer), g6 the drafter (not offloaded). Offloaded
slots: g0 -> 0, g2 -> 1, ..., g5 -> 4. As on a real hybrid model, layer i of
every group aliases staging tensor i; each row of a tensor is one padded page
of which only the first ``real_bytes`` are written by the DMA.

The staging region mimics 0.33.0's SharedOffloadRegion: rows of
``ROW_STRIDE`` bytes, each holding every worker's slot; this rank's tensors
sit at ``RANK * SLOT`` within a row.
"""

from __future__ import annotations

import hashlib
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from overlay_modules import chunk_fmt, fmt, hybrid_groups, ksl, kv_offload_knobs  # noqa: F401

RANK = 1
TP_SIZE = 2
PAGE = 128  # padded page bytes per block of every tensor
NUM_LAYERS = 2
SLOT = PAGE * NUM_LAYERS  # one worker's share of a row (blocks_per_chunk = 1)
ROW_STRIDE = 4096  # page-aligned row: both workers' slots + padding
NUM_CHUNKS = 64
NUM_BLOCKS = 256  # GPU KV blocks per layer tensor
TOKENS_PER_CHUNK = 16
TOKENS_PER_HASH = 16
FULL_REAL = 96  # attention pages: 96 real bytes, 32 bytes of padding
CONV = ksl.layout.StatePart("bfloat16", (4, 3))  # 24 bytes
TEMPORAL = ksl.layout.StatePart("float32", (2, 4))  # 32 bytes
STATE_GROUPS = (2, 3, 4, 5)
OFFLOADED = (0, *STATE_GROUPS)


def group_layouts() -> list[ksl.layout.GroupLayout]:
    return hybrid_groups(NUM_LAYERS, FULL_REAL, NUM_LAYERS, CONV, TEMPORAL)


def settings(**overrides) -> ksl.worker_store.WorkerSettings:
    values = dict(
        model="test/Mini-7g",
        vllm_version="0.0.test",
        kv_dtype="bfloat16",
        hash_algorithm="sha256",
        num_speculative_tokens=1,
        tp_size=TP_SIZE,
        config_rank=RANK,
        blocks_per_chunk=1,
        groups=group_layouts(),
        mamba_types={g: "mamba2" for g in STATE_GROUPS},
    )
    values.update(overrides)
    return ksl.worker_store.WorkerSettings(**values)


def knobs(root: Path, **overrides) -> kv_offload_knobs.Knobs:
    values = dict(
        enabled=True,
        root=str(root),
        cpu_gb=None,
        drafter=False,
        keep_boundaries=2,
        build_id="test-build",
    )
    values.update(overrides)
    return kv_offload_knobs.Knobs(**values)


class Staging:
    """The shared staging region (bytearray) and this rank's tensor views."""

    def __init__(self) -> None:
        self.region = bytearray(NUM_CHUNKS * ROW_STRIDE)
        self.tensors = [
            ksl.layout.StagingTensor(
                self.region, RANK * SLOT + i * PAGE, ROW_STRIDE, PAGE
            )
            for i in range(NUM_LAYERS)
        ]

    def page(self, tensor: int, chunk: int) -> memoryview:
        start = chunk * ROW_STRIDE + RANK * SLOT + tensor * PAGE
        return memoryview(self.region)[start : start + PAGE]

    def dma(self, chunk: int, group: ksl.layout.GroupLayout, seed: bytes) -> bytes:
        """Write a key's pages like the DMA: real bytes, padding untouched.

        Returns the real bytes the disk payload must hold, layer by layer.
        """
        real = b""
        for i, layer in enumerate(group.layers):
            data = pattern(seed + bytes([i]), layer.real_bytes)
            page = self.page(layer.tensor, chunk)
            page[: layer.real_bytes] = data
            page[layer.real_bytes :] = b"\xee" * (PAGE - layer.real_bytes)
            real += data
        return real

    def zero(self) -> None:
        self.region[:] = bytes(len(self.region))


class KvBlocks:
    """The GPU KV cache as vLLM's store copy reads it, in host memory: one
    tensor per layer of NUM_BLOCKS pages (block b's page at b * PAGE)."""

    def __init__(self) -> None:
        self.region = bytearray(NUM_LAYERS * NUM_BLOCKS * PAGE)
        base = ksl.capture_device.host_address(self.region)
        self.tensors = [
            ksl.capture_device.BlockTensor(
                base + i * NUM_BLOCKS * PAGE, PAGE, NUM_BLOCKS
            )
            for i in range(NUM_LAYERS)
        ]

    def page(self, tensor: int, block: int) -> memoryview:
        start = (tensor * NUM_BLOCKS + block) * PAGE
        return memoryview(self.region)[start : start + PAGE]

    def zero(self) -> None:
        self.region[:] = bytes(len(self.region))


def pattern(seed: bytes, n: int) -> bytes:
    """n deterministic pseudo-random bytes for a seed."""
    return random.Random(seed).randbytes(n)


def block_hash(i: int, branch: int = 0) -> bytes:
    """Hash of the prefix ending at chunk i (32 bytes), per conversation branch."""
    return hashlib.sha256(f"{branch}:{i}".encode()).digest()


def offload_key(hash_: bytes, group: int) -> bytes:
    return hash_ + group.to_bytes(4, "big")


@dataclass
class Job:
    """A store job as the worker sees it after `remember`: specs + side channel."""

    job_id: int
    chunk_ids: list[int]
    group_sizes: list[int]
    block_indices: list[int]
    meta: dict
    expected: dict[tuple[bytes, int], bytes] = field(default_factory=dict)
    gpu_blocks: list[int] = field(default_factory=list)

    def entry(self):
        return SimpleNamespace(
            src_spec=SimpleNamespace(
                group_sizes=self.group_sizes,
                block_indices=self.block_indices,
                block_ids=self.gpu_blocks,
            ),
            dst_spec=SimpleNamespace(block_ids=self.chunk_ids),
            kv_store_meta=self.meta,
        )


class JobMaker:
    """Builds store jobs for chunks of a conversation, filling staging."""

    def __init__(self, staging: Staging, kv: KvBlocks | None = None) -> None:
        """kv: the GPU blocks the keys are computed into (each key's block,
        then the DMA's copy in its staging row)."""
        self.staging = staging
        self.kv = kv
        self.next_block = 0
        self.layouts = {g.group: g for g in group_layouts()}
        self.next_chunk = 0
        self.next_job = 0
        self.meta = ksl.side_channel.SchedulerStoreMeta(
            [ksl.side_channel.SchedulerGroup(0, TOKENS_PER_CHUNK, "full")]
            + [
                ksl.side_channel.SchedulerGroup(g, TOKENS_PER_CHUNK, "state")
                for g in STATE_GROUPS
            ],
            TOKENS_PER_HASH,
        )

    def _chunk(self) -> int:
        chunk = self.next_chunk % NUM_CHUNKS
        self.next_chunk += 1
        return chunk

    def full_chunks(self, first: int, count: int, branch: int = 0) -> Job:
        """Full-attention chunks first..first+count-1 of a branch (one job)."""
        keys = [
            offload_key(block_hash(i, branch), 0) for i in range(first, first + count)
        ]
        return self._job(keys, branch, [count, 0, 0, 0, 0], [first, 0, 0, 0, 0])

    def state(self, boundary_chunk: int, group: int, branch: int = 0) -> Job:
        """The state payload of one group at the end of chunk boundary_chunk."""
        slot = self.layouts[group].slot
        sizes = [0] * 5
        sizes[slot] = 1
        indices = [0] * 5
        indices[slot] = boundary_chunk
        keys = [offload_key(block_hash(boundary_chunk, branch), group)]
        return self._job(keys, branch, sizes, indices)

    def _job(self, keys, branch, sizes, indices) -> Job:
        state = FakeReqState(branch, max(k_index(k) for k in keys) + 1)
        for k in keys:
            state.positions[k] = (k_index(k) + 1) * TOKENS_PER_CHUNK
        meta = self.meta.build(set(keys), state)
        job = Job(self.next_job, [], sizes, indices, meta)
        self.next_job += 1
        for k in meta["keys"]:
            chunk = self._chunk()
            job.chunk_ids.append(chunk)
            group = ksl.side_channel.key_group(k)
            real = self.staging.dma(chunk, self.layouts[group], k)
            job.expected[(ksl.side_channel.key_hash(k), group)] = real
            block = self.next_block % NUM_BLOCKS
            self.next_block += 1
            job.gpu_blocks.append(block)
            if self.kv is not None:
                for layer in self.layouts[group].layers:
                    src = self.staging.page(layer.tensor, chunk)
                    self.kv.page(layer.tensor, block)[:] = src
        return job


_INDEX: dict[bytes, int] = {}


def k_index(key: bytes) -> int:
    """Chunk index of a key built by block_hash (looked up, not derived)."""
    h = ksl.side_channel.key_hash(key)
    if h not in _INDEX:
        for branch in range(4):
            for i in range(512):
                _INDEX.setdefault(block_hash(i, branch), i)
    return _INDEX[h]


class FakeReqState:
    """The slice of RequestOffloadState that SchedulerStoreMeta reads."""

    def __init__(self, branch: int, num_chunks: int) -> None:
        self.positions: dict[bytes, int] = {}
        self.req_context = SimpleNamespace(
            get_offload_key_position=lambda key: self.positions.get(key)
        )
        self.req = SimpleNamespace(
            block_hashes=[block_hash(i, branch) for i in range(num_chunks)]
        )


def store_library():
    """The build's libkvtier_store.so (conftest points KVTIER_STORE_LIB at
    it), the writer's only path to chunk files; the test is skipped when it
    is not built."""
    native = fmt.native
    path = native.library_path()
    if not os.path.isfile(path):
        import pytest  # only here: the demo imports this module without it

        pytest.skip(f"{path} is not built (set KVTIER_BUILD_DIR or build kvtier_store)")
    return native.load(path)


def make_store(root: Path, *, tp=lambda: (RANK, TP_SIZE), budget=1 << 20, **kw):
    """A started WorkerStore on the miniature layout, writing through the
    build's store library (``store_lib=`` another, or a spy around it)."""
    staging = kw.pop("staging", None) or Staging()
    store = ksl.worker_store.WorkerStore(
        kw.pop("knobs", None) or knobs(root),
        kw.pop("settings", None) or settings(),
        tp=tp,
        capture_budget=budget,
        copy_engine="memmove",
        copy_threads=1,
        store_lib=kw.pop("store_lib", None) or store_library(),
    )
    kv = kw.pop("kv", None)
    try:
        store.start(
            staging.tensors,
            background=kw.pop("background", False),
            blocks=kv.tensors if kv is not None else (),
            device=kw.pop("device", None),
        )
    except ksl.errors.WriterDisabled as e:
        # As WorkerStore.attach does: the knob asked for the tier, so a
        # problem at boot refuses it (fail closed), never a store that
        # quietly writes nothing.
        raise ksl.errors.StoreRefused(str(e)) from None
    return store, staging


class FailingPaths:
    """The store library, but every write of a chunk at one of ``paths``
    fails through the library's own fault seam (``Library.test_fault``):
    each such file is written in a call of its own with ``op`` armed to
    fail once with ``err``, the other files of the job in one plain call.
    ``paths`` may change between jobs (empty: nothing fails)."""

    def __init__(self, lib, paths, op: int, err: int) -> None:
        self.lib = lib
        self.paths = set(paths)
        self.op = op
        self.err = err

    def __getattr__(self, name):
        return getattr(self.lib, name)

    def write_chunks(self, requests, threads, **kw):
        results = [None] * len(requests)
        plain = [i for i, r in enumerate(requests) if r.path not in self.paths]
        for i, result in zip(
            plain,
            self.lib.write_chunks([requests[i] for i in plain], threads, **kw),
            strict=True,
        ):
            results[i] = result
        for i, request in enumerate(requests):
            if results[i] is None:
                self.lib.test_fault(self.op, self.err, 0, 1)
                try:
                    (results[i],) = self.lib.write_chunks([request], 1, **kw)
                finally:
                    self.lib.test_fault(fmt.native.FAULT_NONE)
        return results


def run_job(store: ksl.worker_store.WorkerStore, job: Job) -> None:
    """remember, vLLM's submit (the device's capture is queued), the ack."""
    store.remember(job.job_id, job.entry())
    store.submitted(job.job_id)
    store.capture(job.job_id)


def rank_bases(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.is_dir())


def chunk_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.bin"))


def temp_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if ".tmp." in p.name)


def manifests(base: Path, key: bytes | None = None) -> dict[str, fmt.BoundaryManifest]:
    out = {}
    mdir = base / fmt.MANIFEST_DIR
    for p in sorted(mdir.iterdir()) if mdir.is_dir() else ():
        if p.name.endswith(".json"):
            out[p.name] = fmt.decode_manifest(p.read_bytes(), key)
    return out


def verify_store(root: Path, key: bytes | None = None) -> list[str]:
    """Python-side check that every live manifest names only good files
    (a keyed store's: every MAC checked too).

    Returns the problems found (empty when the store is consistent).
    """
    problems = []
    for base in rank_bases(root):
        layout = fmt.StoreLayout(str(root), base.name)
        record = fmt.decode_namespace_record(Path(layout.namespace_record).read_bytes())
        ns = record.namespace_hash
        for name, m in manifests(base, key).items():
            for g in m.groups:
                for e in g.entries:
                    path = layout.chunk(e.key, g.group)
                    try:
                        header = chunk_fmt.verify_chunk_file(path, key=key, rank=m.rank)
                    except (OSError, fmt.FormatError) as err:
                        problems.append(f"{name}: {path}: {err}")
                        continue
                    if (
                        header.namespace_hash != ns
                        or header.group != g.group
                        or header.key_hex != e.key
                        or (header.payload_length, header.payload_checksum)
                        != (e.length, e.checksum)
                    ):
                        problems.append(f"{name}: {path}: identity mismatch")
    return problems


def environ_without_knobs() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("GLM53_KV_OFFLOAD")}
