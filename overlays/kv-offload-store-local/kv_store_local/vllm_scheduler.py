# SPDX-License-Identifier: Apache-2.0
"""Scheduler-side adapter: builds the side channel from vLLM's config.

The only scheduler-side module that reads vLLM objects; the hook in
``OffloadingConnectorScheduler.__init__`` calls ``store_meta``.
"""

from typing import Any

from .deps import init_logger, knobs
from .side_channel import SchedulerGroup, SchedulerStoreMeta

logger = init_logger(__name__)


def store_meta(config: Any) -> SchedulerStoreMeta:
    """Validate the knobs (a bad one fails the boot), then build from
    vLLM's ``SchedulerOffloadConfig``."""
    settings = knobs.read_knobs()
    meta = from_config(config)
    logger.info(
        "KV store: scheduler attaches store metadata; restore is off (no "
        "external hits); disk tier under %s",
        settings.root,
    )
    return meta


def from_config(config: Any) -> SchedulerStoreMeta:
    return SchedulerStoreMeta(
        [
            SchedulerGroup(
                group=g.group_idx,
                tokens_per_chunk=g.tokens_per_chunk,
                kind=group_kind(g),
            )
            for g in config.kv_group_configs
        ],
        config.tokens_per_hash,
    )


def group_kind(group_config: Any) -> str:
    from vllm.v1.kv_cache_interface import MambaSpec

    if getattr(group_config, "requires_cow_source", False) or isinstance(
        group_config.kv_cache_spec, MambaSpec
    ):
        return "state"
    if group_config.sliding_window_size_in_chunks is None:
        return "full"
    return "window"
