if self._kv_restore is not None:
    # Before any load or store of this step: fenced promotions finished, then
    # this step's promotions' reads queued in the store library.
    self._kv_restore.promote(metadata, self._kv_store)
