if self._kv_store is not None:
    # vLLM queued this job's copy to staging: queue our capture behind it.
    self._kv_store.submitted(job_id)
