"""Stands for vllm.v1.hisparse.layout (vLLM 0.32.0's kv_cache_utils imports it).

The overlays never configure HiSparse attention, so the layout helpers are
only names here; a call means a test reached a path they do not cover.
"""


def _not_stubbed(name: str):
    def call(*args, **kwargs):
        raise NotImplementedError(f"stub vllm.v1.hisparse.layout.{name}")

    call.__name__ = name
    return call


get_hisparse_host_pool_bytes = _not_stubbed("get_hisparse_host_pool_bytes")
get_hisparse_kv_cache_config = _not_stubbed("get_hisparse_kv_cache_config")
get_hisparse_kv_cache_groups = _not_stubbed("get_hisparse_kv_cache_groups")
