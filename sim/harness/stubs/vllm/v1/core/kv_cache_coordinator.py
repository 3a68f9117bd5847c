"""Stands for vllm.v1.core.kv_cache_coordinator: a type name for isinstance.

Tests that reach code asserting a HybridKVCacheCoordinator subclass this.
"""


class HybridKVCacheCoordinator:
    pass
