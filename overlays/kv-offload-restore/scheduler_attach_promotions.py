if self._kv_restore is not None:
    self._kv_restore.attach(meta)
