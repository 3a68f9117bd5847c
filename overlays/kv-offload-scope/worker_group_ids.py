# With the disk tier on, lay out exactly the groups the offloading config
# carries, in its order; with it off, upstream's own selection.
selected_group_ids = kv_offload_scope.worker_group_ids(
    self.spec.config, selected_group_ids
)
