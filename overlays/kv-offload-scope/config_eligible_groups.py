# With the disk tier on, drop draft-model groups (unless
# GLM53_KV_OFFLOAD_DRAFTER=1) before the divisibility check, so it guards
# exactly the groups that are offloaded.
selected_groups = kv_offload_scope.select_eligible_groups(
    kv_cache_config, selected_groups
)
