"""Stands for vllm.config.cache: the KV-cache dtype handler lookup.

Not implemented: quantized KV-cache dtypes need vLLM's handler registry. Calling
it raises, so a test that needs one must provide its own.
"""


def get_kv_cache_dtype_handler(kv_cache_dtype):
    raise NotImplementedError(
        f"vllm.config.cache stub: no dtype handler for {kv_cache_dtype!r}"
    )
