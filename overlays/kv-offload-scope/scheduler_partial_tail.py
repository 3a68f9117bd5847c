# A group outside the offload set cannot be refilled up to a partial tail.
supports_partial_tail = supports_partial_tail and (
    kv_offload_scope.all_groups_offloaded(spec.config, kv_cache_config)
)
