"""Stands for vllm.utils.hashing: the xxhash-based block hash functions.

Not implemented (they need the xxhash/cbor2 packages): calling one raises. They
exist so kv_cache_utils can name them in its non-crypto-hash table.
"""


def xxhash(data) -> bytes:
    raise NotImplementedError("vllm.utils.hashing stub: xxhash is not available")


def xxhash_cbor(data) -> bytes:
    raise NotImplementedError("vllm.utils.hashing stub: xxhash_cbor is not available")
