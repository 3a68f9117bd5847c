"""Stands for vllm.utils.torch_utils: dtype sizes and the pin-memory flag.

get_dtype_size gives the element size of a (stub) torch dtype, as vLLM's does
for real dtypes. PIN_MEMORY is False: there is no accelerator.
"""

PIN_MEMORY = False


def get_dtype_size(dtype) -> int:
    return dtype.itemsize
