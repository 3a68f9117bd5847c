"""Stands for vllm.fs_io_C (a compiled extension for file-tier I/O).

Every function raises: the native file tier is not exercised by the harness.
"""


def _native(*args, **kwargs):
    raise NotImplementedError("vllm.fs_io_C stub: native file I/O is not available")


batch_load_block = batch_store_block = batch_lookup = _native
