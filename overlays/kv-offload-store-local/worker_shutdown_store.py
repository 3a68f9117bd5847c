if self._kv_store is not None:
    # vLLM defers each step's store jobs to the next step, which a stopping
    # engine never takes: submit, wait for and capture them first.
    self._kv_store.drain(self)
    self._kv_store.shutdown()
