def get_loaded_kv_cache_group_ids(self, request: "Request") -> tuple[int, ...]:
    # kv-offload-restore: a restore fills the offloaded groups only; any other
    # group (a drafter left out of offload) gets zeroed blocks, never stale ones.
    scheduler = self.connector_scheduler
    if scheduler is not None and scheduler._kv_restore is not None:
        return scheduler._kv_restore.loaded_group_ids
    return super().get_loaded_kv_cache_group_ids(request)

