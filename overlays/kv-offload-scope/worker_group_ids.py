# Lay out exactly the groups the offloading config carries, in its order.
selected_group_ids = kv_offload_scope.offloaded_group_ids(self.spec.config)
