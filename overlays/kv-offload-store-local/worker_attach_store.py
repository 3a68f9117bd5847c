if self._kv_store is not None:
    self._kv_store.attach_worker(self.worker, kv_caches, self._is_store_writer)
