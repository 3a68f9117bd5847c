if (
    self._kv_store is not None
    and not is_load
    and self._kv_store.capture_later(job_id)
):
    # Copied out of staging on the writer's capture thread; acked below once
    # the copy is done (vLLM reuses the rows as soon as every rank acked).
    continue
