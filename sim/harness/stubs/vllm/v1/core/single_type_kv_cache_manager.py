"""Stands for vllm.v1.core.single_type_kv_cache_manager (block-pool heavy).

SingleTypeKVCacheManager is a type name (the scheduler keeps manager classes
per group). register_all_kvcache_specs raises: vLLM's spec->manager table is
not reproduced, so code needing the registry fails loudly. A test that needs it
registers specs itself through the REAL KVCacheSpecRegistry.register().
"""


class SingleTypeKVCacheManager:
    pass


def register_all_kvcache_specs(vllm_config) -> None:
    raise NotImplementedError(
        "single_type_kv_cache_manager stub: register the specs your test needs"
        " with KVCacheSpecRegistry.register(...)"
    )
