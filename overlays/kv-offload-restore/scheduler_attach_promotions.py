if self._kv_restore is not None:
    self._kv_restore.attach(meta, scheduler_output, self._req_status)
