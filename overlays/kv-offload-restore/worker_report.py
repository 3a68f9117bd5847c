if self._kv_restore is not None:
    self._kv_restore.report(
        self._connector_worker_meta.completed_jobs, self._kv_store
    )
