"""Stands for vllm.distributed.device_communicators.shm_broadcast.

check_shm_free_space is not implemented: it raises, so shared-memory region
sizing is not silently approved.
"""


def check_shm_free_space(*args, **kwargs):
    raise NotImplementedError("shm_broadcast stub: check_shm_free_space")
