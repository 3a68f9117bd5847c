"""Stands for the CUDA runtime wrapper; constructing it raises (no GPU)."""


class CudaRTLibrary:
    def __init__(self, *args, **kwargs) -> None:
        raise RuntimeError("cuda_wrapper stub: the CUDA runtime is not available")
