# SPDX-License-Identifier: Apache-2.0
"""The worker-side object the hooks call: remember, capture, shut down.

Plain values in (the settings, staging tensors and per-layer refs that
``vllm_worker`` reads from vLLM), never raises into vLLM: every failure
disables the writer on this rank with one log line.
"""

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .capture_pool import CapturePool
from .captured import Candidate, CapturedJob, CapturedKey
from .copier import Copier, coalesce
from .deps import fmt, init_logger, knobs
from .errors import WriterDisabled
from .layout import GroupLayout, StagingTensor, bind_layers
from .namespace import key_scheme, open_namespace, resolve_rank
from .side_channel import META_VERSION, key_hash
from .stats import StoreStats
from .writer import StoreWriter

logger = init_logger(__name__)


@dataclass
class Remembered:
    """A store job between its submission and its completion."""

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


# (hash, group layout, end token, chunk id, first sub-block, sub-blocks)
PlannedKey = tuple[bytes, GroupLayout, int, int, int, int]


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
            page_sizes={g.group: g.block_bytes for g in s.groups},
            state_abi=state_abi(s),
        )
        # Restore reads a store only under the key scheme it was written with.
        fenced["key_scheme"] = key_scheme(s.hash_algorithm)
        info = {
            "keep_boundaries": self.knobs.keep_boundaries,
            "rank_source": provenance,
            "cpu_gb": self.knobs.cpu_gb,
            "drafter": self.knobs.drafter,
            "blocks_per_chunk": s.blocks_per_chunk,
        }
        try:
            layout = open_namespace(self.knobs.root, s.model, rank, fenced, info)
            pool = CapturePool(self._budget)
            self.writer = StoreWriter(
                layout,
                fmt.namespace_hash(fenced),
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
        self._remembered[job_id] = Remembered(
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

    def _plan(self, rec: Remembered, meta: dict) -> list[PlannedKey]:
        """One entry per key whose chunk the DMA filled completely.

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
        if _power_of_two(dropped):  # 1, 2, 4, 8, ...: loud but bounded
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


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def state_abi(s: WorkerSettings) -> dict[str, Any]:
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
