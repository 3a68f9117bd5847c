if self._kv_store is not None:
    self._kv_store.remember(job_id, entry)
