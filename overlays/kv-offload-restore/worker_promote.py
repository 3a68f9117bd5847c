if self._kv_restore is not None:
    # Fill this rank's slots of the CPU rows before any load of this step.
    self._kv_restore.promote(metadata, self._kv_store)
