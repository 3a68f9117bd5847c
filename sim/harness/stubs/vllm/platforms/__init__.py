"""Stands for vllm.platforms: a platform with no accelerator.

current_platform answers "no" to every is_*() question and raises on anything
that would need a device (streams, device names).
"""


class _NoAcceleratorPlatform:
    device_name = "cpu"
    device_type = "cpu"

    def is_cuda_alike(self) -> bool:
        return False

    def is_cuda(self) -> bool:
        return False

    def is_rocm(self) -> bool:
        return False

    def is_xpu(self) -> bool:
        return False

    def is_cpu(self) -> bool:
        return True

    def __getattr__(self, name: str):
        raise AttributeError(f"vllm.platforms stub: {name} needs a device")


current_platform = _NoAcceleratorPlatform()
