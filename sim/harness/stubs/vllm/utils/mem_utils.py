"""Stands for vllm.utils.mem_utils (vLLM 0.32.0's kv_cache_utils imports it).

format_gib renders a byte count in GiB for error messages, as vLLM's does.
"""

GiB = 1 << 30


def format_gib(num_bytes: int) -> str:
    return f"{num_bytes / GiB:.2f}"
