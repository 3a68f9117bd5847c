if self._kv_store_meta is not None:
    self._kv_store_meta.attach(meta.store_jobs, self._jobs, self._req_status)
