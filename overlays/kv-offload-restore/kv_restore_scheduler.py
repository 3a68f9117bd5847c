# SPDX-License-Identifier: Apache-2.0
"""Restore, scheduler side: what vLLM's scheduler hooks call.

``SchedulerRestore`` is built at the scheduler's boot (the
scheduler-restore-init hook) when GLM53_KV_OFFLOAD_RESTORE=1: it refuses a
deployment restore cannot serve safely (``binding_problem``, the store
knob, the store folder, the key file, per-process hash seeds, no
``LocalStoreTier`` configured) and binds the tier (kv_restore_tier) to the
number of ranks. Then, each step:

- ``matched_tokens``: vLLM's own tail of a request's lookup, with the
  restore weighed first (``_pays``). Restore only when it pays: the prefix
  the store would restore is priced with kv_restore_cost (every rank's
  measured read rate against the engine's measured prefill rate for that
  context); when reading is predicted slower, the request is declined and
  every lookup of it in the tier answers MISS.
- ``attach``: times the step for the prefill rate and puts the tier's
  promotions (``kv_restore``) and fenced jobs (``kv_restore_fence``) on the
  step's connector metadata.
- ``on_worker_meta``: hands the ranks' reports to the tier.
"""

import logging
import os
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from vllm.v1.kv_offload.base import LookupResult

from . import kv_restore_cost as cost
from . import kv_restore_reports as reports
from . import kv_store_format as fmt
from .kv_restore_tier import MODULE_PATH, LocalStoreTier, find_tier
from .kv_restore_worker import RestoreRefused, load_native, restore_requested
from .kv_store_local import store_perms
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
        # The manifests this side reads and the key file are judged by the
        # store library (kv_store_format.codec, .mac): missing, the boot fails.
        load_native()
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
