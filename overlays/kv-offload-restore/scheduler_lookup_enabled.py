if self._kv_restore is not None:
    # Restore on: vLLM's own lookup runs, weighed first (restore only when it pays).
    req_status.num_locally_computed_tokens = num_computed_tokens
    return self._kv_restore.matched_tokens(
        self, request, req_status, num_computed_tokens, max_num_new_tokens
    )
