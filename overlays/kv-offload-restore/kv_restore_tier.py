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
  slot of the CPU rows from its own disk, on the store library's thread,
  while the engine steps on (the request waits: its keys are HIT_PENDING in
  the CPU tier). The job, and with it its rows, stays in flight until every rank
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
- Restore only when it pays: the tier keeps the ranks' measured read rates
  and the engine's prefill rate (kv_restore_cost); a request whose restore
  the scheduler side declined (``declined``, during its lookup) misses in
  every lookup of our tier, and the decisions are counted here.
- ``on_reports`` takes the ranks' reports (kv_restore_reports): the key
  inventory across ranks, their readiness, the promotions' results, the
  read rates.

The scheduler hooks call kv_restore_scheduler, which binds this tier at
boot, weighs each request's restore and carries the tier's promotions to
the workers and their reports back.
"""

import logging
import time
from collections import Counter
from collections.abc import Iterable
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
from .kv_store_local import exported

if TYPE_CHECKING:
    from vllm.v1.kv_offload.tiering.manager import TieringOffloadingManager

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

    # -- what the scheduler side carries to and from the workers ---------------

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
