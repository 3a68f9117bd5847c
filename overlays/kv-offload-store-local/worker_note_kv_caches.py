if self._kv_store is not None:
    # The state layers' views: their strides go into the chunk headers.
    self._kv_store.note_kv_caches(kv_caches)
