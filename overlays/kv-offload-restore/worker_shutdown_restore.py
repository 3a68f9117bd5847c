if self._kv_restore is not None:
    # No promotion may still write the CPU rows once the worker lets them go.
    self._kv_restore.shutdown()
