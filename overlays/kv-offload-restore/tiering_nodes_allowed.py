# kv-offload-restore: the local store tier reads in each worker, never this
# node's CPU region, so its workers may span nodes (kv_restore_nodes).
if (
    self.secondary_tier_configs
    and self.config.parallel.world_size > 1
    and not kv_restore_nodes.reads_in_workers_only(self.secondary_tier_configs)
):
