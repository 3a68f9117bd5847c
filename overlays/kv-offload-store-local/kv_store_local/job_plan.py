# SPDX-License-Identifier: Apache-2.0
"""Which bytes of a completed store job belong to which key.

The side channel names the job's keys in block order; the transfer spec
says how many blocks of each slot the DMA copied. They must agree key for
key, or the job is dropped rather than guessed at.
"""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .captured import Candidate
from .layout import GroupLayout
from .recapture import Owed
from .side_channel import META_VERSION, key_hash
from .stats import StoreStats

if TYPE_CHECKING:
    import numpy as np
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
        TransferJob,
    )
    from vllm.v1.kv_offload.base import BlockIDsLoadStoreSpec, GPULoadStoreSpec


@dataclass
class Remembered:
    """A store job between its submission and its completion."""

    chunk_ids: list[int]
    group_sizes: list[int]
    block_indices: list[int]
    meta: Any
    # The job's GPU block ids (slot by slot, one per block); empty when the
    # first capture reads staging instead.
    gpu_blocks: list[int] = field(default_factory=list)


def remembered(entry: "TransferJob", gpu_blocks: bool) -> Remembered:
    """A store job as vLLM submits it: the CPU rows its DMA writes, the GPU
    blocks per group it copies (``gpu_blocks``: their ids too, for a first
    capture that reads the GPU), the side channel's keys."""
    src: GPULoadStoreSpec = entry.src_spec  # type: ignore[assignment]
    dst: BlockIDsLoadStoreSpec = entry.dst_spec  # type: ignore[assignment]
    return Remembered(
        chunk_ids=_ints(dst.block_ids),
        group_sizes=_ints(src.group_sizes),
        block_indices=_ints(src.block_indices),
        meta=getattr(entry, "kv_store_meta", None),
        gpu_blocks=_ints(src.block_ids) if gpu_blocks else [],
    )


def _ints(values: "np.ndarray | Sequence[int]") -> list[int]:
    """A spec's ids as Python ints (numpy integer arrays in vLLM, whose
    tolist already gives Python ints: no second pass)."""
    if getattr(getattr(values, "dtype", None), "kind", None) in ("i", "u"):
        return values.tolist()
    return [int(v) for v in values]


def plan_job(
    rec: Remembered,
    slots: Mapping[int, GroupLayout],
    blocks_per_chunk: int,
    generation: Callable[[int], int],
    stats: StoreStats,
) -> tuple[list[Owed], list[Candidate]] | None:
    """The job's keys (plan_keys) and the boundary manifests they may
    complete; None: the job has no side channel (counted). Raises
    ValueError when it does not match the transfer spec."""
    meta = rec.meta
    if (
        not isinstance(meta, dict)
        or meta.get("version") != META_VERSION
        or (not meta.get("keys"))
    ):
        stats.jobs_without_meta += 1
        return None
    plan = plan_keys(rec, meta, slots, blocks_per_chunk, generation, stats)
    candidates = [
        Candidate(
            boundary=c["boundary"],
            chunk_tokens=c["chunk_tokens"],
            chain=tuple(c["chain"]),
            full=tuple(c["full"]),
            state=tuple(c["state"]),
        )
        for c in meta.get("candidates") or ()
    ]
    return plan, candidates


def plan_keys(
    rec: Remembered,
    meta: dict,
    slots: Mapping[int, GroupLayout],
    blocks_per_chunk: int,
    generation: Callable[[int], int],
    stats: StoreStats,
) -> list[Owed]:
    """One entry per key whose chunk the DMA filled completely.

    Cross-checks the side channel against the transfer spec; keys whose
    chunk the DMA did not fill completely are left out.
    """
    keys, groups, tokens = meta["keys"], meta["groups"], meta["tokens"]
    if not (len(keys) == len(groups) == len(tokens) == len(rec.chunk_ids)):
        raise ValueError("side channel does not match the job's chunk count")
    bpc = blocks_per_chunk
    gpu = rec.gpu_blocks
    if gpu and len(gpu) != sum(rec.group_sizes):
        raise ValueError("the GPU spec's block count does not match its groups")
    chunk_ids = rec.chunk_ids
    plan: list[Owed] = []
    index = 0
    gpu_offset = 0  # the slot's first GPU block in the spec (one per block)
    for slot, (blocks, block_idx) in enumerate(
        zip(rec.group_sizes, rec.block_indices, strict=True)
    ):
        if blocks == 0:
            continue
        slot_first = gpu_offset
        gpu_offset += blocks
        layout = slots.get(slot)
        if bpc == 1 and layout is not None and layout.kind != "window":
            # One block a chunk (the deployed plan): every chunk is complete
            # and key i is block i, so the keys are taken slot by slot.
            end = index + blocks
            if end > len(keys):
                raise ValueError("side channel names fewer keys than the spec")
            for i in range(index, end):
                if groups[i] != layout.group:
                    raise ValueError(f"key {i} is group {groups[i]}, spec slot {slot}")
            rows = chunk_ids[index:end]
            for key, token, chunk_id, block in zip(
                keys[index:end],
                tokens[index:end],
                rows,
                gpu[slot_first : slot_first + blocks] if gpu else rows,
                strict=True,
            ):
                plan.append(
                    Owed(
                        key_hash(key),
                        layout,
                        token,
                        chunk_id,
                        0,
                        1,
                        generation(chunk_id),
                        blocks=(block,) if gpu else (),
                    )
                )
            index = end
            continue
        skip = block_idx % bpc
        chunks = -(-(blocks + skip) // bpc)
        for c in range(chunks):
            if index >= len(keys):
                raise ValueError("side channel names fewer keys than the spec")
            if layout is None or groups[index] != layout.group:
                raise ValueError(
                    f"key {index} is group {groups[index]}, spec slot {slot}"
                )
            first = skip if c == 0 else 0
            last = min(bpc, skip + blocks - c * bpc)
            count = last - first
            complete = count == bpc or (layout.kind == "state" and count == 1)
            chunk_id = chunk_ids[index]
            if layout.kind == "window":
                # No manifest kind names a sliding-window group, so
                # `kvstore gc` would delete its chunks as orphans.
                stats.keys_dropped_window += 1
            elif complete:
                # Sub-block j of chunk c is the spec's block c * bpc + j - skip.
                at = slot_first + c * bpc - skip
                plan.append(
                    Owed(
                        key_hash(keys[index]),
                        layout,
                        tokens[index],
                        chunk_id,
                        first,
                        count,
                        generation(chunk_id),
                        blocks=tuple(gpu[at + first : at + last]) if gpu else (),
                    )
                )
            else:
                stats.keys_dropped_incomplete += 1
            index += 1
    if index != len(keys):
        raise ValueError("side channel names more keys than the spec")
    return plan
