if self._kv_store is not None and not is_load:
    # The job's capture has landed (or is copied out of staging now): hand it
    # to the writer before this rank acks the store.
    self._kv_store.capture(job_id)
