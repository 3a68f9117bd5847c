if self._kv_store is not None and not is_load:
    # Copy the job's bytes out of staging before this rank acks the store.
    self._kv_store.capture(job_id)
