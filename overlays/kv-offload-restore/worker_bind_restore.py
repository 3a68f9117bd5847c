if self._kv_restore is not None:
    # Restore reads this rank's store: bound now, so a rank that cannot read
    # it refuses the boot instead of serving with restore off.
    self._kv_restore.bind(self._kv_store)
