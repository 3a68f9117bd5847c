if self._kv_store is not None:
    self._kv_store.shutdown()
