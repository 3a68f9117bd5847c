if self._kv_store is not None:
    # The flushed jobs' bytes are in staging now; a reset may hand their rows
    # to new stores before get_finished reports them, so copy them out here.
    self._kv_store.capture_jobs(kv_connector_metadata.jobs_to_flush)
