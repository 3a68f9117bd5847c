# SPDX-License-Identifier: Apache-2.0
"""The worker-side object the hooks call: remember, capture, shut down.

Plain values in (the settings, staging tensors and per-layer refs that
``vllm_worker`` reads from vLLM), never raises into vLLM: every failure
disables the writer on this rank with one log line.
"""

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .capture_pool import CapturePool
from .captured import Candidate, CapturedJob, CapturedKey
from .copier import Copier, coalesce
from .deps import fmt, init_logger, knobs
from .errors import WriterDisabled
from .job_plan import Remembered, plan_keys
from .layout import GroupLayout, StagingTensor, bind_layers
from .namespace import (
    folder_model_name,
    key_scheme,
    open_namespace,
    resolve_rank,
    state_abi,
)
from .recapture import Owed, OwedKeys
from .side_channel import META_VERSION
from .stats import StoreStats
from .writer import StoreWriter

logger = init_logger(__name__)


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
    # What decides the KV values beside the layout (vllm_worker.model_identity).
    model_identity: dict[str, str] = field(default_factory=dict)
    served_name: str = ""  # --served-model-name, when set: names the folder
    layer_names: dict[int, list[str]] = field(default_factory=dict)  # per group
    unsupported: str | None = None  # why this layout cannot be written


class WorkerStore:
    def __init__(
        self,
        settings_knobs: knobs.Knobs,
        settings: WorkerSettings,
        *,
        tp: Callable[[], tuple[int, int]] | None = None,
        capture_budget: int | None = None,
        copy_engine: str = "memmove",
        copy_threads: int = 4,
        recapture: bool = True,
    ):
        self.knobs = settings_knobs
        self.settings = settings
        self.stats = StoreStats()
        self._tp = tp
        self._budget = (
            capture_budget
            if capture_budget is not None
            else settings_knobs.capture_bytes
        )
        # Measured on an H200 host (bench/store_bench.py): threaded memmove
        # out of the pinned region beats per-layer torch copy_ by ~5x, and it
        # does not depend on the worker's torch thread count (vLLM sets 1).
        self._engine = copy_engine
        self._copy_threads = copy_threads
        self._remembered: dict[int, Remembered] = {}
        self._slots: dict[int, GroupLayout] = {}
        self._staging: list[StagingTensor] = []
        self.writer: StoreWriter | None = None
        self.copier: Copier | None = None
        self.disabled_reason: str | None = None
        # Keys not written yet whose bytes may still be in staging.
        self._recapture_on = recapture
        self._owed = OwedKeys(self.stats, keep=recapture)
        # Owed keys, row generations and every copy out of staging: the
        # serving thread (capture, remember) and the writer thread (idle
        # recapture) take turns, key by key.
        self._lock = threading.Lock()
        # (origin, reason) of keys the writer thread could not write.
        self._returned: deque[tuple[Owed, str]] = deque()

    # -- start ---------------------------------------------------------------

    def attach(
        self,
        staging: Sequence[StagingTensor],
        refs: Sequence[Sequence[tuple[int, int]]],
        *,
        background: bool = True,
    ) -> None:
        """Bind the layers to their staging tensors and start; or disable."""
        try:
            self.settings.groups = bind_layers(self.settings.groups, refs)
            self.start(staging, background)
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
            # Window (drafter) groups are never written: not part of the layout
            # a reader needs, so the drafter knob does not fork the namespace.
            page_sizes={g.group: g.block_bytes for g in s.groups if g.kind != "window"},
            state_abi=state_abi(s),
            # Restore reads a store only under the key scheme it was written with.
            key_scheme=key_scheme(s.hash_algorithm),
            # Headers name layers by the model's layer index (earlier writers put
            # the position within the group there): never mix the two in one store.
            layer_index="model",
            # KV computed by other weights, quantization or config overrides
            # must never be restored: they fork the namespace too.
            model_identity=s.model_identity or None,
        )
        info = {
            "keep_boundaries": self.knobs.keep_boundaries,
            "rank_source": provenance,
            "cpu_gb": self.knobs.cpu_gb,
            "drafter": self.knobs.drafter,
            "blocks_per_chunk": s.blocks_per_chunk,
            "capture_bytes": self._budget,
        }
        try:
            folder = folder_model_name(s.model, s.served_name)
            layout = open_namespace(self.knobs.root, folder, rank, fenced, info)
            pool = CapturePool(self._budget)
            self.writer = StoreWriter(
                layout,
                fmt.namespace_hash(fenced),
                rank,
                pool,
                self.knobs.keep_boundaries,
                stats=self.stats,
                on_lost=self._on_lost,
                on_idle=self._recapture_idle,
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
        self.copier = Copier(pool, self._engine, self._copy_threads)
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
            self._engine,
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
        chunk_ids = [int(c) for c in dst.block_ids]
        try:
            with self._lock:
                # This job's DMA will overwrite these rows (it is submitted
                # after this returns): a key still owed from them gets its
                # last chance now.
                self._take_returned()
                keys = self._recapture(self._owed.on_rows(chunk_ids))
                self._owed.rows_reused(chunk_ids)
            self._submit_recaptured(keys)
        except Exception:
            logger.exception("KV store: recapture before job %d failed", job_id)
        self._remembered[job_id] = Remembered(
            chunk_ids=chunk_ids,
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
            if _power_of_two(self.stats.jobs_mismatched):
                logger.warning(
                    "KV store: job %d dropped (%s); %d such jobs so far",
                    job_id,
                    e,
                    self.stats.jobs_mismatched,
                )
        except Exception:
            logger.exception("KV store: capture of job %d failed; dropped", job_id)

    def _capture(self, job_id: int, rec: Remembered) -> None:
        assert self.writer is not None and self.copier is not None
        meta = rec.meta
        if (
            not isinstance(meta, dict)
            or meta.get("version") != META_VERSION
            or (not meta.get("keys"))
        ):
            self.stats.jobs_without_meta += 1
            return
        plan = plan_keys(
            rec,
            meta,
            self._slots,
            self.settings.blocks_per_chunk,
            self._owed.generation,
            self.stats,
        )
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
        start = time.perf_counter()
        with self._lock:
            # Earlier drops first: their chains are older.
            self._take_returned()
            again = self._recapture(self._owed.pending())
            keys = self._copy(plan, "budget")
        self.stats.capture_seconds += time.perf_counter() - start
        self._submit_recaptured(again)
        self.stats.jobs_captured += 1
        self.writer.submit(CapturedJob(job_id, keys, candidates))

    def _copy(self, entries: Sequence[Owed], reason: str | None) -> list[CapturedKey]:
        """Copy what fits into the pool; owe the rest (counted as ``reason``,
        or as "paused" while the writer is paused; None: not counted again)."""
        assert self.writer is not None and self.copier is not None
        pool = self.writer.pool
        runs = []
        keys = []
        for entry in entries:
            layout = entry.layout
            size = layout.block_bytes * entry.count
            offset = pool.alloc(size) if self.writer.accepting else None
            if offset is None:
                paused = not self.writer.accepting
                self._owed.owe(entry, "paused" if paused else reason)
                if not paused and reason is not None:
                    self._log_drop()
                continue
            dst = offset
            for layer in layout.layers:
                t = self._staging[layer.tensor]
                page = t.width // self.settings.blocks_per_chunk
                row = t.offset + entry.chunk_id * t.row_stride
                for j in range(entry.first, entry.first + entry.count):
                    runs.append((t.source, row + j * page, dst, layer.real_bytes))
                    dst += layer.real_bytes
            keys.append(
                CapturedKey(
                    entry.hash,
                    layout.group,
                    entry.token,
                    offset,
                    size,
                    layout.segments(entry.count),
                    origin=entry,
                )
            )
        self.copier.copy(coalesce(runs))
        self.stats.keys_captured += len(keys)
        self.stats.bytes_captured += sum(k.size for k in keys)
        return keys

    def _recapture(self, owed: Iterable[Owed]) -> list[CapturedKey]:
        """Capture owed keys again, oldest first, while the pool has room.

        Called with the lock held; the caller submits what it returns after
        letting go of the lock (a writer without a thread writes in submit).
        """
        assert self.writer is not None
        if not self.writer.accepting:
            return []
        fits = []
        free = self.writer.pool.capacity - self.writer.pool.used
        for entry in owed:
            size = entry.layout.block_bytes * entry.count
            if size > free:
                break
            if self._owed.valid(entry):
                free -= size
                fits.append(entry)
        for entry in fits:
            self._owed.settle(entry)
        keys = self._copy(fits, None)
        self.stats.keys_recaptured += len(keys)
        return keys

    def _submit_recaptured(self, keys: list[CapturedKey]) -> None:
        if keys:
            assert self.writer is not None
            self.writer.submit(CapturedJob(-1, keys, []))

    def _recapture_idle(self) -> None:
        """Writer thread, queue empty: take owed keys again, one at a time,
        so an idle server does not leave chains waiting for the next step."""
        while self.active:
            with self._lock:
                self._take_returned()
                entry = next(self._owed.pending(), None)
                keys = self._recapture([entry]) if entry is not None else []
            if not keys:
                return  # nothing owed, or no room yet
            self._submit_recaptured(keys)

    def _on_lost(self, origin: Owed | None, reason: str) -> None:
        """Writer thread: a captured key was not written (counted there)."""
        if origin is not None:
            self._returned.append((origin, reason))

    def _take_returned(self) -> None:
        while self._returned:
            origin, reason = self._returned.popleft()
            if reason == "write_failed":
                self._owed.owe_failed(origin)
            else:
                self._owed.owe(origin, None)

    def _log_drop(self) -> None:
        dropped = self.stats.keys_dropped_budget
        if _power_of_two(dropped):  # 1, 2, 4, 8, ...: loud but bounded
            logger.warning(
                "KV store: capture budget (%d MiB) full; %d stores dropped so far",
                self._budget >> 20,
                dropped,
            )

    def shutdown(self) -> None:
        """Stop the writer and let go of every view of vLLM's staging memory,
        so the region can be unmapped right after (no BufferError)."""
        self._remembered.clear()
        if self.writer is not None:
            self.writer.close()
        if self.copier is not None:
            self.copier.close()
        self._staging = []
        self._owed = OwedKeys(self.stats, keep=self._recapture_on)
        self._returned.clear()


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0
