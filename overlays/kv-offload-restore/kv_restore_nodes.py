# SPDX-License-Identifier: Apache-2.0
"""Whether an engine's secondary tiers all read in the workers (ours only).

vLLM 0.34.0 refuses secondary tiers on an engine whose workers span nodes:
its tiers run in the engine core and read only that node's CPU region, which
lacks the other nodes' workers' slots. The local store tier never reads that
region: each worker reads its own disk into its own slot (kv_restore_worker),
and the engine core's tier only answers lookups from the workers' reports.
So an engine whose secondary tiers are all ours may span nodes (the
tensor-parallel pair across two nodes this tier exists for); any other tier
keeps vLLM's refusal. No import: vLLM's spec module imports this one.
"""

TIER_TYPE = "LocalStoreTier"
MODULE_PATH = "vllm.distributed.kv_transfer.kv_connector.v1.offloading.kv_restore_tier"


def reads_in_workers_only(tier_configs: object) -> bool:
    """True when ``tier_configs`` (kv_connector_extra_config.secondary_tiers)
    is a non-empty list of local store tiers and nothing else."""
    return (
        isinstance(tier_configs, list)
        and bool(tier_configs)
        and all(
            isinstance(c, dict)
            and c.get("type") == TIER_TYPE
            and c.get("module_path") == MODULE_PATH
            for c in tier_configs
        )
    )
