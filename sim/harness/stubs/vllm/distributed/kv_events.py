"""Stands for vllm.distributed.kv_events: KV-cache event records.

Plain dataclasses with the fields the offloading event tracker fills in, so
emitted events can be inspected. Does not serialize (vLLM uses msgspec) or
publish them (vLLM uses ZMQ).
"""

from dataclasses import dataclass, field
from typing import Any

MEDIUM_GPU = "GPU"
MEDIUM_CPU = "CPU"
MEDIUM_STORAGE = "STORAGE"


class KVCacheEvent:
    """Base type of every KV cache event."""


@dataclass
class BlockStored(KVCacheEvent):
    block_hashes: list[Any]
    parent_block_hash: Any
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: Any = None
    kv_cache_spec_sliding_window: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class BlockRemoved(KVCacheEvent):
    block_hashes: list[Any]
    medium: str | None = None
    group_idx: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
