if self._kv_store is not None and not is_load:
    # vLLM's copy of this store job failed: nothing of it is written.
    self._kv_store.transfer_failed(job_id)
