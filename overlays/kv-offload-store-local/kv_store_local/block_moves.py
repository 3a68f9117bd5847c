# SPDX-License-Identifier: Apache-2.0
"""A first capture's moves: which bytes of the KV blocks go where in the pool.

A key's payload holds, per layer, the real (unpadded) page bytes of its
sub-blocks back to back: the order a chunk's payload holds them and vLLM's
store copy reads them. This module plans those (source address, pool address,
bytes) moves from the KV tensors the store copy reads; a device copies them
(capture_device).
"""

from array import array
from collections.abc import Sequence
from typing import Any

import numpy as np

from .capture_device import BlockTensor, Moves
from .captured import CapturedKey
from .layout import GroupLayout
from .recapture import Owed


class BlockMoves:
    """The KV tensors a first capture reads (indexed like the staging
    tensors), and where each group's layers lie in them."""

    def __init__(self, blocks: Sequence[BlockTensor]):
        self.blocks = list(blocks)
        # A GPU block id must name a block of every tensor.
        self.num_blocks = min(b.num_blocks for b in self.blocks)
        # Per group: the same for every key, so computed once (_sources).
        self._layer_sources: dict[int, tuple[list, list[int], array]] = {}
        # The same per group, as int64 arrays (_one_block_moves).
        self._layer_arrays: dict[int, tuple[Any, Any, Any, Any]] = {}

    def check(self, entries: Sequence[Owed]) -> None:
        """ValueError unless each key names one GPU block a sub-block, all of
        them blocks of the KV tensors: the moves never check a bound."""
        for entry in entries:
            if len(entry.blocks) != entry.count:
                raise ValueError(f"GPU blocks {entry.blocks} out of range")
        if entries:
            blocks = [b for entry in entries for b in entry.blocks]
            if min(blocks) < 0 or max(blocks) >= self.num_blocks:
                raise ValueError(f"GPU blocks {blocks} out of range")

    def plan(self, taken: Sequence[tuple[Owed, CapturedKey]], base: int) -> Moves:
        """The moves of keys the pool took (at ``base`` + each key's offset):
        per layer, per sub-block, the unpadded page bytes."""
        moves = Moves()
        run: list[tuple[Owed, CapturedKey]] = []  # one-sub-block keys, one layout
        for entry, key in taken:
            if entry.count == 1:  # one sub-block: one run a layer
                if run and run[-1][0].layout.group != entry.layout.group:
                    self._one_block_moves(run, base, moves)
                    run = []
                run.append((entry, key))
                continue
            if run:
                self._one_block_moves(run, base, moves)
                run = []
            pairs, starts, sizes = self._sources(entry.layout)
            dst = base + key.offset
            # Per layer, its sub-blocks back to back.
            for (address, stride), size in zip(pairs, sizes, strict=True):
                for block in entry.blocks:
                    moves.add(address + block * stride, dst, size)
                    dst += size
        if run:
            self._one_block_moves(run, base, moves)
        return moves

    def _one_block_moves(
        self, run: Sequence[tuple[Owed, CapturedKey]], base: int, moves: Moves
    ) -> None:
        """The moves of keys of one sub-block of one layout, key by key and
        layer by layer, as whole-job array arithmetic (16 moves a key on
        the deployed shape: per key in Python they cost more than the rest
        of the job's planning)."""
        layout = run[0][0].layout
        tables = self._layer_arrays.get(layout.group)
        if tables is None:
            pairs, starts, sizes = self._sources(layout)
            tables = (
                np.array([a for a, _ in pairs], dtype=np.int64),
                np.array([s for _, s in pairs], dtype=np.int64),
                np.array(starts, dtype=np.int64),
                np.array(sizes, dtype=np.int64),
            )
            self._layer_arrays[layout.group] = tables
        addresses, strides, starts, sizes = tables
        n = len(run)
        blocks = np.fromiter((e.blocks[0] for e, _ in run), dtype=np.int64, count=n)
        dsts = np.fromiter((base + k.offset for _, k in run), dtype=np.int64, count=n)
        moves.extend_int64(
            blocks[:, None] * strides + addresses,
            dsts[:, None] + starts,
            np.broadcast_to(sizes, (n, len(sizes))),
        )

    def _sources(self, layout: GroupLayout) -> tuple[list, list[int], array]:
        """Per layer of the group: (tensor address, block stride), the
        layer's offset in a one-sub-block payload, its real bytes."""
        out = self._layer_sources.get(layout.group)
        if out is None:
            pairs = [
                (
                    self.blocks[x.tensor].address + x.offset,
                    self.blocks[x.tensor].block_stride,
                )
                for x in layout.layers
            ]
            starts, at = [], 0
            for layer in layout.layers:
                starts.append(at)
                at += layer.real_bytes
            out = (pairs, starts, array("q", [x.real_bytes for x in layout.layers]))
            self._layer_sources[layout.group] = out
        return out
