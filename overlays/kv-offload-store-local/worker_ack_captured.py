if self._kv_store is not None:
    # Stores whose copy out of staging is done: ack them now.
    for job_id in self._kv_store.acks_ready():
        self._connector_worker_meta.mark_completed(job_id)
