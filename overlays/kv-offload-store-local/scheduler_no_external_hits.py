if self._kv_store_meta is not None:
    # Store-only stage: no external hits, and the manager's lookup is never
    # called. The store bookkeeping above is kept as it is.
    req_status.update_num_hit_chunks(num_computed_tokens)
    return 0, False
