# SPDX-License-Identifier: Apache-2.0
"""The worker-side object the hooks call: remember, capture, shut down.

Plain values in (the settings, staging tensors and per-layer refs that
``vllm_worker`` reads from vLLM). At boot a writer that cannot start refuses
the boot (StoreRefused: the knob asked for the tier); once serving it never
raises into vLLM: a failed job is logged and dropped, its keys counted.

One state machine per store job (remembered -> queued on the device -> acked
-> handed to the writer, or owed and recaptured), every step of which reads and
changes the same per-rank state under one lock (``_remembered``, ``_queued``,
the owed keys by staging row, the pool). What needs none of it lives apart:
the boot (boot), which keys a job holds (job_plan), the moves of a first
capture out of the KV blocks (block_moves), the owed keys' own bookkeeping
(recapture), capture_device, capture_pool, copier.
"""

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import boot, job_plan
from .block_moves import BlockMoves
from .boot import WorkerSettings
from .capture_device import BlockTensor, CaptureDevice, Fence, Moves, TransferFailed
from .captured import Candidate, CapturedJob, CapturedKey
from .copier import Copier, coalesce
from .deps import fmt, init_logger, knobs
from .errors import StoreRefused, WriterDisabled
from .job_plan import Remembered, plan_job
from .layout import GroupLayout, StagingTensor, bind_layers
from .recapture import Owed, OwedKeys
from .restore_access import RestoreAccess, StoreNotOpen
from .stats import StoreStats
from .writer import StoreWriter

if TYPE_CHECKING:
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
        TransferJob,
    )

logger = init_logger(__name__)


@dataclass
class QueuedCapture:
    """A first capture queued on the device, until this rank acks the job."""

    keys: list[CapturedKey]
    candidates: list[Candidate]
    fence: Fence


class WorkerStore:
    # How long a clean shutdown waits for the writer to finish its queue.
    SHUTDOWN_SECONDS = 30.0
    # Bytes the engine thread may copy out of staging as a row's last chance
    # per remember (or promotion) call: owed keys beyond it are lost
    # (counted), so a backlog of owed keys never stalls a step.
    last_chance_bytes = 16 << 20

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
        store_lib: Any = None,
    ):
        """store_lib: the native store library (kv_store_format.native) that
        writes the chunk files; None: the one ``native.load()`` finds, loaded
        at ``start`` (missing or unusable: the boot is refused)."""
        self.knobs = settings_knobs
        self._store_lib = store_lib
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
        # First captures queued on the device (GPU blocks -> pool), by job.
        self._queued: dict[int, QueuedCapture] = {}
        self._device: CaptureDevice | None = None
        # The KV blocks the device's first captures read (with a device).
        self._block_moves: BlockMoves | None = None
        # Segment tables by (group, sub-blocks): the same for every key.
        self._segments: dict[tuple[int, int], tuple[fmt.Segment, ...]] = {}
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

    # -- start ---------------------------------------------------------------

    def attach(
        self,
        staging: Sequence[StagingTensor],
        refs: Sequence[Sequence[tuple[int, int]]],
        *,
        background: bool = True,
        blocks: Sequence[BlockTensor] = (),
        device: CaptureDevice | None = None,
        allocate: Any = None,
    ) -> None:
        """Bind the layers to their staging tensors and start. The knob asked
        for the tier: anything that stops the writer refuses the boot."""
        try:
            self.settings.groups = bind_layers(self.settings.groups, refs)
            self.start(
                staging, background, blocks=blocks, device=device, allocate=allocate
            )
        except WriterDisabled as e:
            self._remembered.clear()
            raise StoreRefused(str(e)) from None

    def start(
        self,
        staging: Sequence[StagingTensor],
        background: bool = True,
        *,
        blocks: Sequence[BlockTensor] = (),
        device: CaptureDevice | None = None,
        allocate: Any = None,
    ) -> None:
        """Open the store (boot: rank, namespace, writer), start the thread.

        Without ``background`` jobs are written on the capturing thread
        (tests and the benchmark use this to measure each side alone).
        With ``blocks`` (the KV tensors the store copy reads, indexed like
        ``staging``) and a ``device``, a job's first capture is queued on
        the device when vLLM submits its store copy (``submitted``) and
        copied from the KV blocks; otherwise it is copied out of staging
        when the job completes. ``allocate``: the capture pool's memory
        (CapturePool).
        """
        s = self.settings
        opened = boot.open_store(
            self.knobs,
            s,
            self._budget,
            self.stats,
            tp=self._tp,
            store_lib=self._store_lib,
            allocate=allocate,
            on_lost=self._on_lost,
            recapture=self._recapture_idle,
        )
        self.writer = opened.writer
        self._staging = list(staging)
        self._slots = {g.slot: g for g in s.groups}
        on_device = device is not None and bool(blocks)
        boot.check_fits(
            s.groups, s.blocks_per_chunk, self._staging, blocks if on_device else ()
        )
        if on_device:
            self._block_moves = BlockMoves(blocks)
            self._device = device
        self.copier = Copier(self.writer.pool, self._engine, self._copy_threads)
        if background:
            self.writer.start()
        logger.info(
            "KV store: writer up: rank %d/%d (%s), %s, groups %s, capture budget "
            "%d MiB, first capture %s, keep %d boundaries",
            self.writer.rank,
            s.tp_size,
            opened.rank_source,
            self.writer.layout.base,
            [g.group for g in s.groups],
            self._budget >> 20,
            "from the KV blocks on the device"
            if self._device is not None
            else f"from staging ({self._engine})",
            self.knobs.keep_boundaries,
        )

    def restore_access(self) -> RestoreAccess:
        """This rank's store as the restore overlay may use it; StoreNotOpen
        (with the reason) when it is not open."""
        if not self.active:
            raise StoreNotOpen(self.disabled_reason or "no active writer")
        assert self.writer is not None
        return RestoreAccess(
            layout=self.writer.layout,
            namespace=self.writer.namespace,
            key=self.writer.key,
            rank=self.writer.rank,
            groups=tuple(self.settings.groups),
            blocks_per_chunk=self.settings.blocks_per_chunk,
            staging=lambda: self._staging,
            rows_taken=self.rows_taken,
            distrust=self.writer.distrust,
            budget=self.writer.budget,
        )

    def stand_by(self, reason: str) -> None:
        """This rank writes nothing by design (not a failure: the replicated
        layout stores its one copy from rank 0)."""
        self.disabled_reason = reason
        self._remembered.clear()
        logger.info("KV store: %s", reason)

    def transfer_failed(self, job_id: int) -> None:
        """vLLM reported this store job's copy failed (its failure channel,
        vLLM 0.34.0): the staging rows, and a capture queued behind the copy,
        hold no valid KV, so nothing of the job is written. Its keys are
        counted lost; the scheduler drops them from the CPU tier too."""
        self.stats.jobs_failed_transfer += 1
        queued = self._queued.pop(job_id, None)
        rec = self._remembered.pop(job_id, None)
        if queued is not None and self.writer is not None:
            if not queued.fence.done():
                queued.fence.wait()  # the pool's rows are ours again only after it
            for key in queued.keys:
                self.writer.pool.free(key.offset)
            self.stats.keys_lost_transfer_failed += len(queued.keys)
        elif rec is not None and isinstance(rec.meta, dict):
            self.stats.keys_lost_transfer_failed += len(rec.meta.get("keys") or ())
        logger.warning("KV store: store job %d failed in vLLM; not written", job_id)

    @property
    def active(self) -> bool:
        return self.writer is not None and self.disabled_reason is None

    # -- hooks ---------------------------------------------------------------

    def remember(self, job_id: int, entry: "TransferJob") -> None:
        if not self.active:
            return
        rec = job_plan.remembered(entry, gpu_blocks=self._device is not None)
        try:
            # This job's DMA will overwrite these rows (it is submitted
            # after this returns): a key still owed from them gets its
            # last chance now.
            self._last_chance(rec.chunk_ids)
        except Exception:
            logger.exception("KV store: recapture before job %d failed", job_id)
        self._remembered[job_id] = rec

    def rows_taken(self, chunk_ids: Iterable[int]) -> None:
        """Staging rows about to be filled by something other than a store
        job (a restore promotion): owed keys on them get their last chance,
        then go stale. Engine thread; never raises."""
        if not self.active:
            return
        try:
            self._last_chance([int(c) for c in chunk_ids])
        except Exception:
            logger.exception("KV store: recapture before a promotion failed")

    def _last_chance(self, chunk_ids: list[int]) -> None:
        """Copy owed keys off rows about to be overwritten, at most
        ``last_chance_bytes``; the rest are lost (counted)."""
        start = time.perf_counter()
        with self._lock:
            self._owed.take_returned()
            owed = self._owed.on_rows(chunk_ids)
            keys: list[CapturedKey] = []
            if owed:
                pool = self.writer.pool
                room = pool.capacity - pool.used if self.writer.accepting else 0
                keys = self._recapture(owed, limit=self.last_chance_bytes)
                taken = sum(k.size for k in keys)
                self._owed.lose_left_behind(owed, room - taken)
                self.stats.keys_recaptured_last_chance += len(keys)
                self.stats.bytes_recaptured_last_chance += sum(k.size for k in keys)
            self._owed.rows_reused(chunk_ids)
        self._submit_recaptured(keys)
        self.stats.last_chance_seconds += time.perf_counter() - start

    def capture_jobs(self, job_ids: Iterable[int]) -> None:
        for job_id in sorted(job_ids):
            self.capture(job_id)

    def submitted(self, job_id: int) -> None:
        """vLLM just queued this store job's copy (GPU -> staging): queue its
        first capture behind it on the device, from the same KV blocks.
        Without a device, nothing: capture() copies out of staging."""
        if self._device is None or not self.active:
            return
        rec = self._remembered.get(job_id)
        if rec is None:
            return
        start = time.perf_counter()
        try:
            self._queue_capture(job_id, rec)
        except ValueError as e:
            self._remembered.pop(job_id, None)
            self._mismatched(job_id, e)
        except Exception:
            self._remembered.pop(job_id, None)
            logger.exception("KV store: capture of job %d failed; dropped", job_id)
        finally:
            self.stats.capture_seconds += time.perf_counter() - start

    def _queue_capture(self, job_id: int, rec: Remembered) -> None:
        assert self._device is not None and self.writer is not None
        planned = self._plan(rec)
        if planned is None:
            del self._remembered[job_id]
            return
        entries, candidates = planned
        keys, moves = self._alloc_moves(entries)
        try:
            fence = self._device.queue(job_id, moves)
        except TransferFailed:
            # vLLM's own copy failed; it reports the job failed next, and
            # transfer_failed() forgets it. The device stays in use.
            self._unalloc(keys)
            return
        except Exception:
            # Correct without it: this job and every later one are copied
            # out of staging before their acks (capture()).
            logger.exception(
                "KV store: the capture device failed on job %d; first captures "
                "copy out of staging from now on",
                job_id,
            )
            self._device = None
            self._unalloc(keys)
            return
        del self._remembered[job_id]
        self._queued[job_id] = QueuedCapture(keys, candidates, fence)
        self.stats.jobs_queued_on_device += 1

    def _unalloc(self, keys: list[CapturedKey]) -> None:
        """Give back a capture that was never queued."""
        assert self.writer is not None
        for key in keys:
            self.writer.pool.free(key.offset)
        self.stats.keys_captured -= len(keys)
        self.stats.bytes_captured -= sum(k.size for k in keys)

    def capture(self, job_id: int) -> None:
        """The job's store copy completed and this rank has not acked: hand
        its captured keys to the writer (queued on the device), or copy them
        out of staging now. Never raises."""
        queued = self._queued.pop(job_id, None)
        if queued is not None:
            self._finish_queued(job_id, queued)
            return
        rec = self._remembered.pop(job_id, None)
        if rec is None or not self.active:
            return
        try:
            self._capture(job_id, rec)
        except ValueError as e:
            self._mismatched(job_id, e)
        except Exception:
            logger.exception("KV store: capture of job %d failed; dropped", job_id)

    def _mismatched(self, job_id: int, e: ValueError) -> None:
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

    def _finish_queued(self, job_id: int, queued: QueuedCapture) -> None:
        """The ack of a job captured on the device. vLLM's completion event
        is recorded after our copy on the same stream, so the fence is done
        by now; wait for it anyway if not (counted), never ack earlier."""
        assert self.writer is not None
        start = time.perf_counter()
        try:
            if not queued.fence.done():
                self.stats.capture_fence_waits += 1
                queued.fence.wait()
        finally:
            self.stats.capture_seconds += time.perf_counter() - start
        if not self.active:
            return
        self.stats.jobs_captured += 1
        self.writer.submit(CapturedJob(job_id, queued.keys, queued.candidates))

    def _plan(self, rec: Remembered) -> tuple[list[Owed], list[Candidate]] | None:
        """The job's keys and candidates (job_plan.plan_job); None: no side
        channel. Raises ValueError when it does not match the transfer spec."""
        return plan_job(
            rec,
            self._slots,
            self.settings.blocks_per_chunk,
            self._owed.generation,
            self.stats,
        )

    def _capture(self, job_id: int, rec: Remembered) -> None:
        """First capture out of staging (no device), before the ack."""
        assert self.writer is not None
        start = time.perf_counter()
        planned = self._plan(rec)
        if planned is None:
            return
        plan, candidates = planned
        with self._lock:
            self._owed.take_returned()
            keys = self._copy(plan, "budget")
        self.stats.capture_seconds += time.perf_counter() - start
        self.stats.jobs_captured += 1
        self.writer.submit(CapturedJob(job_id, keys, candidates))

    def _alloc(
        self, entries: Sequence[Owed], reason: str | None
    ) -> list[tuple[Owed, CapturedKey]]:
        """Pool room for what fits; owe the rest (counted as ``reason``, or
        as "paused" while the writer is paused; None: not counted again).

        The pool is a FIFO ring: once a key does not fit, the job's later
        keys are owed without asking it again (the writer frees its room a
        job at a time, so a later key of the same job would rarely fit)."""
        assert self.writer is not None
        pool = self.writer.pool
        out = []
        accepting = self.writer.accepting
        segments_by = self._segments
        taken = 0
        for entry in entries if accepting else ():
            size = entry.size
            offset = pool.alloc(size)
            if offset is None:
                break
            layout = entry.layout
            segments = segments_by.get((layout.group, entry.count))
            if segments is None:
                segments = layout.segments(entry.count)
                segments_by[(layout.group, entry.count)] = segments
            out.append(
                (
                    entry,
                    CapturedKey(
                        entry.hash,
                        layout.group,
                        entry.token,
                        offset,
                        size,
                        segments,
                        origin=entry,
                    ),
                )
            )
            taken += size
        if len(out) < len(entries):
            left = entries[len(out) :]
            self._owed.owe_many(left, reason if accepting else "paused")
            if accepting and reason is not None:
                self._log_drop(len(left))
        self.stats.keys_captured += len(out)
        self.stats.bytes_captured += taken
        return out

    def _alloc_moves(self, entries: Sequence[Owed]) -> tuple[list[CapturedKey], Moves]:
        """Pool room and the device's moves (KV block -> pool) of a first
        capture (block_moves)."""
        assert self.writer is not None and self._block_moves is not None
        self._block_moves.check(entries)
        with self._lock:
            taken = self._alloc(entries, "budget")
        moves = self._block_moves.plan(taken, self.writer.pool.address)
        return [key for _, key in taken], moves

    def _copy(self, entries: Sequence[Owed], reason: str | None) -> list[CapturedKey]:
        """Copy what fits out of staging into the pool; owe the rest (see
        ``_alloc``). Called with the lock held."""
        assert self.writer is not None and self.copier is not None
        runs = []
        keys = []
        for entry, key in self._alloc(entries, reason):
            dst = key.offset
            for layer in entry.layout.layers:
                t = self._staging[layer.tensor]
                page = t.width // self.settings.blocks_per_chunk
                row = t.offset + entry.chunk_id * t.row_stride + layer.offset
                for j in range(entry.first, entry.first + entry.count):
                    runs.append((t.source, row + j * page, dst, layer.real_bytes))
                    dst += layer.real_bytes
            keys.append(key)
        self.copier.copy(coalesce(runs))
        return keys

    def _recapture(
        self, owed: Iterable[Owed], limit: int | None = None
    ) -> list[CapturedKey]:
        """Capture owed keys again out of staging, oldest first, while the
        pool has room (and at most ``limit`` bytes).

        Called with the lock held; the caller submits what it returns after
        letting go of the lock (a writer without a thread writes in submit).
        """
        assert self.writer is not None
        if not self.writer.accepting:
            return []
        free = self.writer.pool.capacity - self.writer.pool.used
        if limit is not None:
            free = min(free, limit)
        keys = self._copy(self._owed.take(owed, free), None)
        self.stats.keys_recaptured += len(keys)
        return keys

    def _submit_recaptured(self, keys: list[CapturedKey]) -> None:
        if keys:
            assert self.writer is not None
            self.writer.submit(CapturedJob(-1, keys, []))

    def _recapture_idle(self) -> None:
        """Writer thread, after each job and when its queue runs empty: take
        owed keys again while the pool has room, so neither the engine
        thread nor an idle server leaves chains waiting. One key per lock
        hold (remember waits for the lock), one job for them all."""
        keys: list[CapturedKey] = []
        while self.active:
            with self._lock:
                self._owed.take_returned()
                entry = self._owed.next_due()
                got = self._recapture([entry]) if entry is not None else []
            if not got:
                break  # nothing owed, or no room yet
            keys += got
        self.stats.keys_recaptured_writer += len(keys)
        self._submit_recaptured(keys)

    def _on_lost(self, origin: Owed | None, reason: str) -> None:
        """Writer thread: a captured key was not written (counted there)."""
        if origin is not None:
            self._owed.returned(origin, reason)

    def _log_drop(self, count: int = 1) -> None:
        dropped = self.stats.keys_dropped_budget
        # Each time the count passes 1, 2, 4, 8, ...: loud but bounded.
        if dropped.bit_length() != (dropped - count).bit_length():
            logger.warning(
                "KV store: capture budget (%d MiB) full; %d stores dropped so far",
                self._budget >> 20,
                dropped,
            )

    def shutdown(self) -> None:
        """Stop the writer and let go of every view of vLLM's staging memory,
        so the region can be unmapped right after (no BufferError)."""
        self._remembered.clear()
        if self._device is not None:
            self._device.close()
        self._queued.clear()  # never acked: vLLM drops the jobs too
        self._block_moves = None
        if self.writer is not None:
            # The tail of the last requests is often still queued (drained
            # just before): give the disk time for it, within a bound.
            self.writer.close(self.SHUTDOWN_SECONDS)
            if self.writer.running:
                logger.warning(
                    "KV store: the writer did not finish within %d s of shutdown; "
                    "what it had not written is not in the store",
                    self.SHUTDOWN_SECONDS,
                )
        if self.copier is not None:
            self.copier.close()
        self._staging = []
        self._owed = OwedKeys(self.stats, keep=self._recapture_on)


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0
