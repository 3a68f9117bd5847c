# With the disk tier on, a group outside the offload set cannot be refilled up
# to a partial tail.
supports_partial_tail = supports_partial_tail and (
    kv_offload_scope.partial_tail_allowed(spec.config, kv_cache_config)
)
