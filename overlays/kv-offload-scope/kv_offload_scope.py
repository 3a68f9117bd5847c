# SPDX-License-Identifier: Apache-2.0
"""Scope native KV offloading to the eligible KV cache groups.

Upstream already offloads only the prefix-cacheable groups and keys each
group config by its original index. This module adds the deployment policy on
top of that selection:

- draft-model attention groups (an EAGLE group, or an exact
  ``SlidingWindowSpec`` group under an EAGLE-style speculative config) are not
  offloaded unless ``GLM53_KV_OFFLOAD_DRAFTER=1``;
- ``UniformTypeKVCacheSpecs`` wrappers are classified through their single
  member type, and a wrapper with more than one member type is a startup
  error rather than a guess;
- the worker builds its transfer layout from exactly the groups the
  offloading config carries, so scheduler and worker agree position by
  position;
- partial tails are claimed only when every KV cache group is offloaded.
"""

from typing import TYPE_CHECKING

from vllm.distributed.kv_transfer.kv_connector.v1.offloading import kv_offload_knobs
from vllm.logger import init_logger
from vllm.v1.kv_cache_interface import (
    KVCacheSpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
)

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.kv_offload.config import OffloadingConfig

logger = init_logger(__name__)

DRAFTER_ENV = kv_offload_knobs.DRAFTER


def offload_drafter_enabled() -> bool:
    """Read ``GLM53_KV_OFFLOAD_DRAFTER`` by its rule in ``kv_offload_knobs``.

    Unset or "0" keeps draft-model groups out of the offload set, "1" offloads
    them; any other value is a startup error so a typo never flips the policy.
    """
    return kv_offload_knobs.drafter_enabled()


def unwrap_group_spec(group_id: int, spec: KVCacheSpec) -> KVCacheSpec:
    """Return the per-layer spec that classifies a group, failing closed.

    Upstream picks the first member of a ``UniformTypeKVCacheSpecs`` as the
    group's representative. That is only sound when every member has the
    same type, so anything else stops the boot instead of classifying the
    group by whichever layer happens to come first.
    """
    if not isinstance(spec, UniformTypeKVCacheSpecs):
        return spec
    member_types = {type(member) for member in spec.kv_cache_specs.values()}
    if len(member_types) != 1:
        names = sorted(member_type.__name__ for member_type in member_types)
        raise ValueError(
            f"KV offloading cannot classify KV cache group {group_id}: its "
            f"UniformTypeKVCacheSpecs holds {len(names)} spec types {names}, "
            "expected exactly one."
        )
    return spec.first_spec


def uses_eagle_speculation(vllm_config: "VllmConfig") -> bool:
    speculative_config = vllm_config.speculative_config
    return speculative_config is not None and speculative_config.use_eagle()


def is_drafter_group(
    group: "KVCacheGroupSpec", spec: KVCacheSpec, eagle_speculation: bool
) -> bool:
    """Whether a group holds draft-model attention KV.

    ``spec`` is the unwrapped group spec. Only an exact ``SlidingWindowSpec``
    counts: subclasses such as ``SlidingWindowMLASpec`` are target-model
    layers.

    vLLM flags a group ``is_eagle_group`` when ANY of its layers is a draft
    layer. A drafter whose spec equals the target's (an EAGLE head on a plain
    Llama, say) is grouped with the target's attention layers; that group
    holds target KV and its spec is a target layer's (``is_draft`` unset), so
    it stays eligible. Otherwise the target's KV would never be offloaded.
    """
    if group.is_eagle_group and _only_draft_layers(group):
        return True
    return eagle_speculation and type(spec) is SlidingWindowSpec


def _only_draft_layers(group: "KVCacheGroupSpec") -> bool:
    spec = group.kv_cache_spec
    if isinstance(spec, UniformTypeKVCacheSpecs):
        return all(member.is_draft for member in spec.kv_cache_specs.values())
    return spec.is_draft


def select_eligible_groups(
    vllm_config: "VllmConfig",
    kv_cache_config: "KVCacheConfig",
    candidates: tuple[tuple[int, "KVCacheGroupSpec"], ...],
) -> tuple[tuple[int, "KVCacheGroupSpec"], ...]:
    """Filter upstream's offload candidates down to the eligible groups.

    ``candidates`` are (original group index, group) pairs; the original
    index is kept so every later pairing still goes through it.
    """
    offload_drafter = offload_drafter_enabled()
    eagle_speculation = uses_eagle_speculation(vllm_config)
    eligible: list[tuple[int, KVCacheGroupSpec]] = []
    drafters: list[int] = []
    for group_id, group in candidates:
        spec = unwrap_group_spec(group_id, group.kv_cache_spec)
        if is_drafter_group(group, spec, eagle_speculation):
            drafters.append(group_id)
            if not offload_drafter:
                continue
        eligible.append((group_id, group))

    logger.info(
        "KV offloading eligible groups: %s of %d (draft-model groups %s, %s=%d)",
        [group_id for group_id, _ in eligible],
        len(kv_cache_config.kv_cache_groups),
        drafters,
        DRAFTER_ENV,
        offload_drafter,
    )
    return tuple(eligible)


def offloaded_group_ids(config: "OffloadingConfig") -> tuple[int, ...]:
    """Original indices of the groups an offloading config carries, in order.

    The worker's transfer layout is positional: entry i of a transfer spec
    belongs to ``config.groups[i]``. Deriving the worker's groups from the
    same config keeps both sides in step whatever the selection policy is.
    """
    return tuple(group.group_id for group in config.groups)


def all_groups_offloaded(
    config: "OffloadingConfig", kv_cache_config: "KVCacheConfig"
) -> bool:
    """Whether every KV cache group is in the offload set.

    A partial tail loads to a boundary inside a block; a group outside the
    offload set has nothing to refill that block from.
    """
    num_groups = len(kv_cache_config.kv_cache_groups)
    return set(offloaded_group_ids(config)) == set(range(num_groups))
