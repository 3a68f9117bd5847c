# SPDX-License-Identifier: Apache-2.0
"""Scheduler-side adapter: builds the side channel from vLLM's config.

The only scheduler-side module that reads vLLM objects; the hook in
``OffloadingConnectorScheduler.__init__`` calls ``store_meta``.
"""

from typing import TYPE_CHECKING

from .deps import init_logger, knobs
from .side_channel import SchedulerGroup, SchedulerStoreMeta

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler import (
        GroupOffloadConfig,
        SchedulerOffloadConfig,
    )
    from vllm.v1.kv_offload.base import OffloadingManager

logger = init_logger(__name__)


def store_meta(
    config: "SchedulerOffloadConfig",
    manager: "OffloadingManager",
    vllm_config: "VllmConfig",
) -> SchedulerStoreMeta:
    """Validate the knobs (a bad one fails the boot), then build from
    vLLM's ``SchedulerOffloadConfig``. A failed boot shuts ``manager`` down
    first (``release_manager``)."""
    try:
        settings = knobs.read_knobs()
        meta = from_config(config, lookahead_hashes(vllm_config))
    except BaseException:
        release_manager(manager)
        raise
    # One line per boot about restore: with RESTORE=1 the restore overlay's
    # scheduler hook says "KV restore: on" (or refuses the boot), so this line
    # says nothing about it then.
    if settings.restore:
        logger.info(
            "KV store: scheduler attaches store metadata; disk tier under %s",
            settings.root,
        )
    else:
        logger.info(
            "KV store: scheduler attaches store metadata; restore is off "
            "(GLM53_KV_OFFLOAD_RESTORE unset or 0: hits come from vLLM's CPU tier "
            "only); disk tier under %s",
            settings.root,
        )
    if meta.eagle and settings.keep_boundaries == 1:
        # The drafter's end manifest is the newest of its chain: kept alone,
        # it supersedes the state boundary a restore needs.
        logger.warning(
            "KV store: drafter layers share an offloaded full group and "
            "GLM53_KV_OFFLOAD_KEEP_BOUNDARIES=1: each chain keeps only the "
            "manifest past its state boundary, so restores miss; keep 2 (the "
            "default) or more."
        )
    return meta


def release_manager(manager: "OffloadingManager") -> None:
    """Before a boot we refuse: vLLM has already made the CPU tier's shared
    region in /dev/shm, a file that outlives the process (and holds its
    memory) unless the manager's shutdown unlinks it."""
    try:
        manager.shutdown()
    except Exception:
        logger.exception("KV store: the offloading manager did not shut down")


def lookahead_hashes(vllm_config: "VllmConfig") -> bool:
    """vLLM 0.34.0 hashes each block with the tokens a drafter reads past it
    (num_hash_lookahead_tokens) when EAGLE/MTP runs with this connector; it
    then stores and looks up a drafter group's trailing chunk like any other
    (no EAGLE drop, no popped chunk). 0.33.0 always drops it."""
    tokens = getattr(vllm_config, "num_hash_lookahead_tokens", 0)
    return isinstance(tokens, int) and tokens > 0


def from_config(
    config: "SchedulerOffloadConfig", lookahead: bool = False
) -> SchedulerStoreMeta:
    """``lookahead``: the drafter's trailing chunk is not dropped, so no
    EAGLE end manifest is needed (side_channel.py)."""
    return SchedulerStoreMeta(
        [
            SchedulerGroup(
                group=g.group_idx,
                tokens_per_chunk=g.tokens_per_chunk,
                kind=group_kind(g),
                eagle=bool(getattr(g, "is_eagle_group", False)) and not lookahead,
            )
            for g in config.kv_group_configs
        ],
        config.tokens_per_hash,
    )


def group_kind(group_config: "GroupOffloadConfig") -> str:
    from vllm.v1.kv_cache_interface import MambaSpec

    if getattr(group_config, "requires_cow_source", False) or isinstance(
        group_config.kv_cache_spec, MambaSpec
    ):
        return "state"
    if group_config.sliding_window_size_in_chunks is None:
        return "full"
    return "window"
