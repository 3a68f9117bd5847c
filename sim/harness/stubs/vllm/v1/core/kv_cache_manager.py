"""Stands for vllm.v1.core.kv_cache_manager: only KVCacheBlocks.

KVCacheBlocks holds blocks[group][i]; get_block_ids returns their block_id per
group (optionally only some groups), as vLLM's does. No allocation logic.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any


@dataclass
class KVCacheBlocks:
    blocks: tuple[Sequence[Any], ...]

    def __add__(self, other: "KVCacheBlocks") -> "KVCacheBlocks":
        return KVCacheBlocks(
            tuple(
                list(chain(a, b))
                for a, b in zip(self.blocks, other.blocks, strict=False)
            )
        )

    def get_block_ids(
        self, allow_none: bool = False, *, group_ids: Sequence[int] | None = None
    ) -> tuple[list[int], ...] | None:
        if allow_none and all(len(group) == 0 for group in self.blocks):
            return None
        groups = (
            self.blocks if group_ids is None else [self.blocks[i] for i in group_ids]
        )
        return tuple([blk.block_id for blk in group] for group in groups)

    def get_unhashed_block_ids(self) -> list[int]:
        assert len(self.blocks) == 1, "Only one group is supported"
        return [blk.block_id for blk in self.blocks[0] if blk.block_hash is None]

    def new_empty(self) -> "KVCacheBlocks":
        return KVCacheBlocks(tuple(() for _ in range(len(self.blocks))))
