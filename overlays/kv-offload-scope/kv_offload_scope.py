# SPDX-License-Identifier: Apache-2.0
"""Scope native KV offloading to the groups the disk tier keeps.

Upstream already offloads only the prefix-cacheable groups and keys each
group config by its original index. With the disk tier off
(``GLM53_KV_OFFLOAD`` unset or 0) every hook hands back upstream's own
values, so vLLM's CPU offloading behaves as stock vLLM. With the tier on
(``GLM53_KV_OFFLOAD=1``) this module adds the deployment policy:

- draft-model attention groups (every layer a draft layer,
  ``KVCacheSpec.is_draft``) are not offloaded unless
  ``GLM53_KV_OFFLOAD_DRAFTER=1``; where vLLM marks no draft layers
  (before 0.33.0), a group flagged ``is_eagle_group`` stops the boot unless
  ``GLM53_KV_OFFLOAD_DRAFTER=1``;
- a ``UniformTypeKVCacheSpecs`` group with more than one member type is a
  startup error: the chunk store describes a group by one layer type;
- the worker builds its transfer layout from exactly the groups the
  offloading config carries, so scheduler and worker agree position by
  position;
- partial tails are claimed only when every KV cache group is offloaded.
"""

from typing import TYPE_CHECKING

from vllm.distributed.kv_transfer.kv_connector.v1.offloading import kv_offload_knobs
from vllm.logger import init_logger
from vllm.v1.kv_cache_interface import KVCacheSpec, UniformTypeKVCacheSpecs

if TYPE_CHECKING:
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.kv_offload.config import OffloadingConfig

logger = init_logger(__name__)

TIER_ENV = kv_offload_knobs.ENABLE
DRAFTER_ENV = kv_offload_knobs.DRAFTER


def tier_enabled() -> bool:
    """Whether the disk tier is on (``GLM53_KV_OFFLOAD=1``, strict 0/1)."""
    return kv_offload_knobs.tier_enabled()


def offload_drafter_enabled() -> bool:
    """Read ``GLM53_KV_OFFLOAD_DRAFTER`` by its rule in ``kv_offload_knobs``.

    Unset or "0" keeps draft-model groups out of the offload set, "1" offloads
    them; any other value is a startup error so a typo never flips the policy.
    """
    return kv_offload_knobs.drafter_enabled()


def unwrap_group_spec(group_id: int, spec: KVCacheSpec) -> KVCacheSpec:
    """Return the per-layer spec that classifies a group, failing closed.

    Upstream picks the first member of a ``UniformTypeKVCacheSpecs`` as the
    group's representative (MLA + an indexer, MLA + hidden states). vLLM's
    CPU tier copies such a group page by page; the chunk store's header
    describes a group by one layer type, so with the tier on a group of
    several types stops the boot, saying how to serve the model without it.
    """
    if not isinstance(spec, UniformTypeKVCacheSpecs):
        return spec
    member_types = {type(member) for member in spec.kv_cache_specs.values()}
    if len(member_types) != 1:
        names = sorted(member_type.__name__ for member_type in member_types)
        raise ValueError(
            f"KV offloading cannot classify KV cache group {group_id}: its "
            f"UniformTypeKVCacheSpecs holds {len(names)} spec types {names}, "
            f"expected exactly one. The disk tier ({TIER_ENV}=1) stores a group "
            f"of one layer type only: set {TIER_ENV}=0 to serve this model with "
            "vLLM's own CPU offloading and no disk tier."
        )
    return spec.first_spec


def is_drafter_group(group: "KVCacheGroupSpec") -> bool | None:
    """Whether a group holds draft-model attention KV only; None: cannot tell.

    vLLM flags a group ``is_eagle_group`` when ANY of its layers is a draft
    layer, and marks each draft layer's spec ``is_draft`` (not compared, so a
    drafter whose spec equals the target's joins the target's group). Only a
    group whose every layer is a draft layer is a drafter group; a shared
    group (an MTP or EAGLE head beside target layers) holds target KV and
    stays eligible, and so does a target model's own sliding-window group.
    A vLLM before 0.33.0 marks no draft layer, so there a flagged group is None: a
    drafter-only group and a shared MTP group look alike.
    """
    if not group.is_eagle_group:
        return False
    spec = group.kv_cache_spec
    members = (
        list(spec.kv_cache_specs.values())
        if isinstance(spec, UniformTypeKVCacheSpecs)
        else [spec]
    )
    if not all(hasattr(member, "is_draft") for member in members):
        return None
    return all(member.is_draft for member in members)


def select_eligible_groups(
    kv_cache_config: "KVCacheConfig",
    candidates: tuple[tuple[int, "KVCacheGroupSpec"], ...],
) -> tuple[tuple[int, "KVCacheGroupSpec"], ...]:
    """Filter upstream's offload candidates down to the eligible groups.

    ``candidates`` are (original group index, group) pairs; the original
    index is kept so every later pairing still goes through it. With the
    tier off they come back unchanged (the knobs are still validated).
    """
    offload_drafter = offload_drafter_enabled()
    if not tier_enabled():
        return candidates
    eligible: list[tuple[int, KVCacheGroupSpec]] = []
    drafters: list[int] = []
    for group_id, group in candidates:
        unwrap_group_spec(group_id, group.kv_cache_spec)
        drafter = is_drafter_group(group)
        if drafter is None and not offload_drafter:
            # Guessing either way is wrong for someone: dropping a shared
            # group loses target KV, keeping a drafter ignores the knob.
            raise ValueError(
                f"KV offloading cannot tell whether KV cache group {group_id} "
                "holds draft-model layers only: this vLLM marks no draft "
                f"layers (KVCacheSpec.is_draft). Set {DRAFTER_ENV}=1 to "
                f"offload it as upstream does, or {TIER_ENV}=0 to serve "
                "without the disk tier."
            )
        if drafter is not False:
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


def worker_group_ids(
    config: "OffloadingConfig", upstream_ids: tuple[int, ...]
) -> tuple[int, ...]:
    """The groups the worker registers: upstream's with the tier off, else
    exactly the groups the offloading config carries (the scheduler's)."""
    return offloaded_group_ids(config) if tier_enabled() else upstream_ids


def partial_tail_allowed(
    config: "OffloadingConfig", kv_cache_config: "KVCacheConfig"
) -> bool:
    """With the tier on, whether every KV cache group is in the offload set.

    A partial tail loads to a boundary inside a block; a group outside the
    offload set has nothing to refill that block from. With the tier off
    upstream's own rule stands alone.
    """
    if not tier_enabled():
        return True
    num_groups = len(kv_cache_config.kv_cache_groups)
    return set(offloaded_group_ids(config)) == set(range(num_groups))
