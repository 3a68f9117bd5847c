# SPDX-License-Identifier: Apache-2.0
"""Restore, scheduler side: a secondary tier over the workers' local stores.

``LocalStoreTier`` is loaded by vLLM's tiering manager from the connector's
extra config, with no patch to the manager::

    "secondary_tiers": [{"type": "LocalStoreTier", "module_path":
        "vllm.distributed.kv_transfer.kv_connector.v1.offloading.kv_restore_tier"}]

It never touches a disk and never copies a byte (its ``primary_kv_view`` is
the scheduler node's mmap, the wrong bytes for a multi-node TP pair):

- ``lookup`` answers from an in-memory index: a key hits only when every TP
  rank reported that one of its manifests proves it (the intersection, as
  counts of KEY_UP minus KEY_DOWN reports summed over ranks). Until every
  rank's READY arrived it answers RETRY (after ``ready_timeout_s``, MISS).
- ``submit_load`` queues the promotion; the scheduler hook attaches queued
  promotions to the step's connector metadata and every worker fills its own
  slot of the CPU rows from its own disk, on its promotion thread, while the
  engine steps on (the request waits: its keys are HIT_PENDING in the CPU
  tier). The job, and with it its rows, stays in flight until every rank
  reported: success only when all reported PROMOTE_OK; any PROMOTE_FAIL
  fails it for all, the keys are
  held as misses until a rank proves them again or ``failed_hold_s`` passed
  (a bad chunk's manifests are dropped by its rank meanwhile, so only keys
  still proven everywhere are tried again), and the request recomputes.
- ``submit_store`` completes at once: the worker-local writer stores.
- ``drain_jobs`` (a prefix-cache reset) fails every queued or in-flight
  promotion at once (vLLM's reset then frees every CPU row); a worker's late
  report for it is ignored. The ids of the ones already sent go out with the
  next step's metadata (``kv_restore_fence``): every worker cancels or waits
  for their reads before it submits any transfer of that step, so no late
  read lands in a row the reset handed to someone else.
- Restore only when it pays: before a request's lookup the scheduler hook
  weighs the prefix the store would restore (kv_restore_cost: every rank's
  measured read rate against the engine's measured prefill rate for that
  context); when reading is predicted slower, every lookup of that request
  in our tier answers MISS and the decision is counted and logged.
"""

import logging
import os
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vllm.v1.kv_offload.base import (
    LookupResult,
    Medium,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
)
from vllm.v1.kv_offload.tiering.base import (
    JobResult,
    SecondaryTierManager,
    TransferJob,
)

from . import kv_restore_cost as cost
from . import kv_restore_reports as reports
from . import kv_store_format as fmt
from .kv_restore_worker import RestoreRefused, restore_requested
from .kv_store_local import exported, store_perms
from .kv_store_local.vllm_scheduler import release_manager
from .metrics import _ConnectorMetricName

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_offload.tiering.manager import TieringOffloadingManager
    from vllm.v1.request import Request

    from .common import OffloadingConnectorMetadata, OffloadingWorkerMetadata
    from .scheduler import (
        OffloadingConnectorScheduler,
        RequestOffloadState,
    )

logger = logging.getLogger(__name__)

DEFAULT_READY_TIMEOUT_S = 120.0
FAILED_HOLD_S = 60.0
MODULE_PATH = __name__


@dataclass
class TierStats:
    lookups: Counter = field(default_factory=Counter)  # hit / miss / retry
    promotions_ok: int = 0
    promotions_failed: int = 0
    promotions_fenced: int = 0  # failed by a cache reset while in flight
    keys_promoted: int = 0
    keys_failed: int = 0
    # Restore only when it pays: prefixes weighed (both rates measured),
    # declined (reading predicted slower than recomputing: a miss), and not
    # weighed for want of a measured rate (restored, as before).
    restores_weighed: int = 0
    restores_declined: int = 0
    restores_unmeasured: int = 0
    last_estimate: dict | None = None  # the last weighed one (Estimate)


@dataclass
class _Promotion:
    keys: list[OffloadKey]
    ok: int = 0
    failed: int = 0


class LocalStoreTier(SecondaryTierManager):
    medium = Medium.STORAGE

    def __init__(
        self,
        offloading_spec: Any,
        primary_kv_view: memoryview,
        tier_type: str,
        backpressure_detector: Any = None,
        ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S,
    ):
        super().__init__(
            offloading_spec, primary_kv_view, tier_type, backpressure_detector
        )
        self.num_workers: int | None = None  # bound by the scheduler hook
        self.ready_timeout_s = float(ready_timeout_s)
        self.stats = TierStats()
        self._exported = exported.Exporter()
        self._born = time.monotonic()
        self._ready = 0
        self._timed_out = False
        self._provable: dict[int, int] = {}  # key digest -> ranks proving it
        # Digests held as misses after a failed promotion, until a monotonic
        # time: long enough for the ranks' KEY_DOWN of a bad chunk to arrive,
        # short enough that a passing failure (a gc sweep holding the lock)
        # does not keep a prefix from restoring for the life of the engine.
        self._failed: dict[int, float] = {}
        self.failed_hold_s = FAILED_HOLD_S
        self.clock = time.monotonic
        self._queued: list[TransferJob] = []
        self._inflight: dict[int, _Promotion] = {}
        self._finished: list[JobResult] = []
        # Sent promotions a reset failed: the workers wait for their reads
        # at the start of the next step (kv_restore_fence).
        self._fence: list[int] = []
        # Requests whose restore was declined, during their lookup.
        self.declined: set[str] = set()
        self.rates = cost.ReadRates()
        self.prefill = cost.PrefillRate()

    # -- readiness -------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return self.num_workers is not None and self._ready >= self.num_workers

    def _not_ready_result(self) -> LookupResult:
        if time.monotonic() - self._born < self.ready_timeout_s:
            return LookupResult.RETRY
        if not self._timed_out:
            self._timed_out = True
            logger.warning(
                "KV restore: %d of %s ranks reported their inventory after %.0f s; "
                "lookups miss until all have",
                self._ready,
                self.num_workers,
                self.ready_timeout_s,
            )
        return LookupResult.MISS

    # -- SecondaryTierManager ----------------------------------------------------

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        if not self.ready:
            result = self._not_ready_result()
        elif req_context.req_id in self.declined:
            result = LookupResult.MISS  # recomputing is predicted faster
        else:
            digest = reports.key_digest(key)
            until = self._failed.get(digest)
            if until is not None and self.clock() >= until:
                del self._failed[digest]
                until = None
            hit = until is None and self._provable.get(digest, 0) >= self.num_workers
            result = LookupResult.HIT if hit else LookupResult.MISS
        self.stats.lookups[result.name.lower()] += 1
        return result

    def provable(self, key: OffloadKey) -> bool:
        """Whether a lookup of ``key`` would hit now (no side effects)."""
        if not self.ready:
            return False
        digest = reports.key_digest(key)
        until = self._failed.get(digest)
        if until is not None and self.clock() < until:
            return False
        assert self.num_workers is not None
        return self._provable.get(digest, 0) >= self.num_workers

    def submit_load(self, job_metadata: TransferJob) -> None:
        self._queued.append(job_metadata)
        self._inflight[job_metadata.job_id] = _Promotion(list(job_metadata.keys))

    def submit_store(self, job_metadata: TransferJob) -> None:
        # The worker-local writer stores each rank's own bytes; nothing to do.
        self._finished.append(JobResult(job_id=job_metadata.job_id, success=True))

    def get_finished_jobs(self) -> Iterable[JobResult]:
        finished, self._finished = self._finished, []
        return finished

    def has_pending_work(self) -> bool:
        waiting = not self.ready and not self._timed_out
        return bool(
            waiting or self._queued or self._inflight or self._finished or self._fence
        )

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def drain_jobs(self) -> None:
        """A cache reset: every promotion not yet confirmed fails now.

        vLLM's contract is to block until no tier I/O touches the CPU rows;
        ours runs in the workers, whose reports only come with a step, so the
        wait moves there: the sent ones are fenced in the next step's
        metadata, and each worker waits for their reads before any transfer.
        """
        queued = {job.job_id for job in self._queued}
        for job_id, promotion in self._inflight.items():
            self._finished.append(JobResult(job_id=job_id, success=False))
            self.stats.promotions_fenced += 1
            self.stats.keys_failed += len(promotion.keys)
            if job_id not in queued:
                self._fence.append(job_id)
        self._inflight.clear()
        self._queued.clear()

    def get_stats(self) -> Any:
        """vLLM's tiering manager sums this into the scheduler's payload: the
        increase of our counters since its last call (kv_store_local/exported)."""
        return self._exported.take([(exported.TIER, self.stats)])

    def config_info(self):
        return {}

    # -- scheduler hooks -----------------------------------------------------------

    def take_requests(self) -> list[dict[str, Any]]:
        """The promotions to send with this step's connector metadata."""
        out = [
            {
                "job": job.job_id,
                "keys": [bytes(k) for k in job.keys],
                "chunks": [int(c) for c in job.chunk_ids],
            }
            for job in self._queued
            if job.job_id in self._inflight
        ]
        self._queued.clear()
        return out

    def take_fence(self) -> list[int]:
        """Promotions a reset failed after they were sent: the workers wait
        for their reads before this step's transfers."""
        fence, self._fence = self._fence, []
        return fence

    def on_reports(self, items: Iterable[tuple[int, int, int]]) -> None:
        for kind, value, ranks in items:
            if kind == reports.READY:
                self._ready += ranks
            elif kind == reports.KEY_UP:
                self._provable[value] = self._provable.get(value, 0) + ranks
                self._failed.pop(value, None)
            elif kind == reports.KEY_DOWN:
                left = self._provable.get(value, 0) - ranks
                if left > 0:
                    self._provable[value] = left
                else:
                    self._provable.pop(value, None)
            elif kind in (reports.PROMOTE_OK, reports.PROMOTE_FAIL):
                self._on_result(value, kind == reports.PROMOTE_OK, ranks)
            elif kind in (reports.READ_RATE, reports.KEY_BYTES):
                self.rates.on_report(kind, value)

    def _on_result(self, job_id: int, ok: bool, ranks: int) -> None:
        promotion = self._inflight.get(job_id)
        if promotion is None:
            return  # fenced by a reset, or not ours
        if ok:
            promotion.ok += ranks
        else:
            promotion.failed += ranks
        assert self.num_workers is not None
        if promotion.ok + promotion.failed < self.num_workers:
            return  # a rank may still be writing its rows: wait for everyone
        del self._inflight[job_id]
        success = promotion.failed == 0
        self._finished.append(JobResult(job_id=job_id, success=success))
        if success:
            self.stats.promotions_ok += 1
            self.stats.keys_promoted += len(promotion.keys)
            return
        self.stats.promotions_failed += 1
        self.stats.keys_failed += len(promotion.keys)
        until = self.clock() + self.failed_hold_s
        self._failed.update((reports.key_digest(k), until) for k in promotion.keys)
        logger.warning(
            "KV restore: promotion %d failed on %d of %d ranks; %d keys miss and "
            "recompute",
            job_id,
            promotion.failed,
            self.num_workers,
            len(promotion.keys),
        )


def find_tier(manager: "TieringOffloadingManager") -> LocalStoreTier | None:
    for tier in getattr(manager, "secondary_tiers", ()):
        if isinstance(tier, LocalStoreTier):
            return tier
    return None


def binding_problem(scheduler: "OffloadingConnectorScheduler") -> str | None:
    """What matched_tokens needs of vLLM's scheduler side that this one
    lacks (None: everything is there): checked at boot, so a vLLM whose
    internals moved refuses restore instead of raising on every lookup."""
    from vllm.v1.request import Request

    from .scheduler import RequestOffloadState

    for name in ("_lookup", "_maybe_observe_lookup_async_delay"):
        if not callable(getattr(scheduler, name, None)):
            return f"vLLM's offloading scheduler has no {name}()"
    if getattr(scheduler, "_connector_stats", None) is None:
        return "vLLM's offloading scheduler has no _connector_stats"
    if not callable(getattr(RequestOffloadState, "update_num_hit_chunks", None)):
        return "vLLM's RequestOffloadState has no update_num_hit_chunks()"
    # 0.34.0: a property; 0.33.0 sets an attribute from this method.
    if not (
        hasattr(Request, "skip_reading_external_kv")
        or hasattr(Request, "get_skip_reading_prefix_cache")
    ):
        return "vLLM's Request has no skip_reading_external_kv or skip_reading_prefix_cache"
    return None


class SchedulerRestore:
    """What the scheduler hooks call when GLM53_KV_OFFLOAD_RESTORE=1."""

    def __init__(
        self, tier: LocalStoreTier, num_workers: int, loaded_group_ids: tuple[int, ...]
    ):
        self.tier = tier
        tier.num_workers = num_workers
        # The groups a restore fills: the offloaded ones, original indices.
        self.loaded_group_ids = loaded_group_ids
        self.steps = cost.StepClock(tier.prefill)
        self.now = time.perf_counter

    @classmethod
    def from_vllm(
        cls, scheduler: "OffloadingConnectorScheduler", vllm_config: "VllmConfig"
    ) -> "SchedulerRestore | None":
        """None unless restore is requested; a refused boot shuts the manager
        down first, so vLLM's CPU region does not stay behind in /dev/shm."""
        try:
            return cls._checked(scheduler, vllm_config)
        except BaseException:
            release_manager(scheduler.manager)
            raise

    @classmethod
    def _checked(
        cls, scheduler: "OffloadingConnectorScheduler", vllm_config: "VllmConfig"
    ) -> "SchedulerRestore | None":
        if not restore_requested():
            return None
        manager, config = scheduler.manager, scheduler.config
        missing = binding_problem(scheduler)
        if missing is not None:
            raise RestoreRefused(f"GLM53_KV_OFFLOAD_RESTORE=1 is refused: {missing}")
        if os.environ.get("GLM53_KV_OFFLOAD", "0") != "1":
            raise RestoreRefused(
                "GLM53_KV_OFFLOAD_RESTORE=1 needs GLM53_KV_OFFLOAD=1: restore reads "
                "the store the worker-local writer keeps."
            )
        root = os.environ.get("GLM53_KV_OFFLOAD_DIR", "")
        unsafe = store_perms.store_problem(root) if root else None
        if unsafe is not None:
            raise RestoreRefused(
                f"GLM53_KV_OFFLOAD_RESTORE=1 is refused: store folder not safe: {unsafe}"
            )
        key_file = os.environ.get("GLM53_KV_OFFLOAD_KEY_FILE")
        if key_file:
            # The workers read with the writer's key; a key file they would
            # refuse (others may read it, wrong owner, size) fails the boot here.
            try:
                fmt.load_key(key_file, root)
            except fmt.KeyFileError as e:
                raise RestoreRefused(
                    f"GLM53_KV_OFFLOAD_RESTORE=1 is refused: {e}"
                ) from None
        algorithm = str(vllm_config.cache_config.prefix_caching_hash_algo)
        if algorithm.startswith("xxhash") and "PYTHONHASHSEED" not in os.environ:
            raise RestoreRefused(
                f"GLM53_KV_OFFLOAD_RESTORE=1 is refused: {algorithm} block hashes "
                "(the store's keys) are seeded per process unless PYTHONHASHSEED "
                "is set, so they change at every restart."
            )
        tier = find_tier(manager)  # type: ignore[arg-type]
        if tier is None:
            raise RestoreRefused(
                "GLM53_KV_OFFLOAD_RESTORE=1 needs the secondary tier "
                f'{{"type": "LocalStoreTier", "module_path": "{MODULE_PATH}"}} '
                "in kv_connector_extra_config.secondary_tiers."
            )
        logger.info(
            "KV restore: on; lookups answer from the ranks' manifests (%d ranks)",
            config.num_workers,
        )
        # The cost guard predicts a recompute step by step: a step holds at
        # most this many tokens.
        tier.prefill.chunk = vllm_config.scheduler_config.max_num_batched_tokens
        return cls(
            tier,
            config.num_workers,
            tuple(g.group_idx for g in config.kv_group_configs),
        )

    def matched_tokens(
        self,
        sched: "OffloadingConnectorScheduler",
        request: "Request",
        req_status: "RequestOffloadState",
        num_computed_tokens: int,
        max_num_new_tokens: int | None,
    ) -> tuple[int | None, bool]:
        """The upstream tail of get_num_new_matched_tokens, lookup enabled.

        With restore on this runs instead of vLLM's own tail, exactly as the
        installed vLLM (0.33.0 or 0.34.0) would run it.
        """
        # vLLM 0.34.0 renamed the request's flag (now a property) and skips
        # the offloaded cache for good once a load of the request failed;
        # 0.33.0 reads the attribute only.
        if hasattr(request, "skip_reading_external_kv"):
            skip = request.skip_reading_external_kv or req_status.load_failed
        else:
            skip = request.skip_reading_prefix_cache
        if skip:
            num_hit_tokens: int | None = 0
        else:
            lookup_start = time.monotonic()
            try:
                declined = not self._pays(
                    sched, request, req_status, num_computed_tokens
                )
            except Exception:  # no estimate: restore, as without one
                logger.exception("KV restore: the restore was not weighed")
                declined = False
            if declined:
                self.tier.declined.add(req_status.req_context.req_id)
            try:
                num_hit_tokens = sched._lookup(req_status, max_num_new_tokens)
            finally:
                self.tier.declined.discard(req_status.req_context.req_id)
            sched._connector_stats.observe_histogram(
                _lookup_sync_metric(sched),
                time.monotonic() - lookup_start,
            )
            if num_hit_tokens is None:
                if req_status.deferred_lookup_start_time is None:
                    req_status.deferred_lookup_start_time = lookup_start
            else:
                sched._maybe_observe_lookup_async_delay(req_status)
        req_status.update_num_hit_chunks(num_computed_tokens + (num_hit_tokens or 0))
        # A vLLM without sync loads (before 0.33.0) loads every hit asynchronously.
        reserve = getattr(sched, "_reserve_sync_load", None)
        sync_load = reserve is not None and reserve(
            req_status, num_computed_tokens, num_hit_tokens
        )
        return num_hit_tokens, bool(num_hit_tokens) and not sync_load

    def _pays(
        self,
        sched: "OffloadingConnectorScheduler",
        request: "Request",
        req_status: "RequestOffloadState",
        num_computed_tokens: int,
    ) -> bool:
        """Weigh what the store would restore for this request (False: miss).

        The prefix ends at the deepest key of the request our tier would hit
        (a manifest boundary; vLLM may stop a little earlier); the keys to
        read are the tier's keys up to it that the CPU tier does not hold.
        """
        tier = self.tier
        manager: TieringOffloadingManager = sched.manager  # type: ignore[assignment]
        primary = getattr(manager, "primary_tier", None)
        context = req_status.req_context
        found: list[tuple[int, Any]] = []
        for config, state in zip(
            sched.config.kv_group_configs, req_status.group_states, strict=False
        ):
            for i, key in enumerate(state.offload_keys):
                end = (i + 1) * config.tokens_per_chunk
                if end > num_computed_tokens and tier.provable(key):
                    found.append((end, key))
        end = min(max((e for e, _ in found), default=0), request.num_prompt_tokens - 1)
        if end <= num_computed_tokens:
            return True  # nothing of the store to weigh
        keys = sum(
            1
            for e, key in found
            if e <= end
            and (primary is None or primary.lookup(key, context) is LookupResult.MISS)
        )
        if keys == 0:
            return True  # held in the CPU tier already (or being promoted)
        estimate = cost.weigh(
            tier.rates, tier.prefill, tier.num_workers or 1, keys,
            num_computed_tokens, end,
        )  # fmt: skip
        if estimate is None:
            tier.stats.restores_unmeasured += 1
            return True
        tier.stats.restores_weighed += 1
        tier.stats.restores_declined += not estimate.restore
        tier.stats.last_estimate = estimate.as_dict()
        logger.info(
            "KV restore: request %s: %d tokens from the store (%d keys a rank, "
            "%.1f MB at %.3g GB/s: %.3f s) vs recompute %.3f s: %s",
            request.request_id,
            estimate.tokens,
            keys,
            estimate.read_bytes / 1e6,
            estimate.read_rate / 1e9,
            estimate.read_s,
            estimate.recompute_s,
            "restore" if estimate.restore else "miss (recompute is faster)",
        )
        return estimate.restore

    def attach(
        self,
        meta: "OffloadingConnectorMetadata",
        scheduler_output: "SchedulerOutput | None" = None,
        req_status: "Mapping[str, RequestOffloadState] | None" = None,
    ) -> None:
        if scheduler_output is not None and req_status is not None:
            try:
                self.steps.on_step(self.now(), _scheduled(scheduler_output, req_status))
            except Exception:  # a missed measurement never fails a step
                logger.debug("KV restore: step not timed", exc_info=True)
        fence = self.tier.take_fence()
        if fence:
            meta.kv_restore_fence = fence
        requests = self.tier.take_requests()
        if requests:
            meta.kv_restore = requests

    def on_worker_meta(self, meta: "OffloadingWorkerMetadata") -> None:
        items = reports.take(meta.completed_jobs)
        if items:
            self.tier.on_reports(items)


def _scheduled(
    scheduler_output: "SchedulerOutput",
    req_status: "Mapping[str, RequestOffloadState]",
) -> Iterator[tuple[str, int, int, int]]:
    """(request, tokens scheduled, tokens computed before, prompt tokens)."""
    for req_id, n in (scheduler_output.num_scheduled_tokens or {}).items():
        status = req_status.get(req_id)
        if status is not None:
            req = status.req
            yield req_id, n, req.num_computed_tokens, req.num_prompt_tokens


def _lookup_sync_metric(sched: "OffloadingConnectorScheduler") -> str:
    """The scheduler module's LOOKUP_SYNC_DELAY metric name."""
    return _ConnectorMetricName.LOOKUP_SYNC_DELAY
