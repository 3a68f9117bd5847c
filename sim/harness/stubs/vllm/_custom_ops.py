"""Stands for vllm._custom_ops (compiled CUDA kernels): nothing is implemented.

Any attribute raises on use, so GPU copy paths fail loudly in the harness.
"""


def __getattr__(name: str):
    raise AttributeError(f"vllm._custom_ops stub: {name} needs compiled kernels")
