# SPDX-License-Identifier: Apache-2.0
"""Restore, worker side: where each chunk file's payload lands in the job's CPU rows.

The inverse of the writer's capture: per layer of the chunk's group, per
sub-block, the unpadded page bytes, at the layer's place in the staging
tensor of the row. A state group's chunk fills one sub-block (the one its
boundary ends), an attention chunk all of them. The runs of row 0 are planned
once per (group, first sub-block, sub-blocks) and shifted by the row's stride
for each file, so a promotion's per-file Python work is one comprehension.
"""

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

try:
    from . import kv_restore_read as chunk_read
    from . import kv_store_format as fmt
except ImportError:  # loaded as a top-level module: tests, tools
    import kv_restore_read as chunk_read  # type: ignore[no-redef]
    import kv_store_format as fmt  # type: ignore[no-redef]

if TYPE_CHECKING:
    from .kv_restore_inventory import Proof
    from .kv_store_format import native
    from .kv_store_local.layout import GroupLayout, StagingTensor
    from .kv_store_local.restore_access import RestoreAccess


class RowPlans:
    def __init__(self, access: "RestoreAccess") -> None:
        self._access = access
        self.groups: dict[int, GroupLayout] = {g.group: g for g in access.groups}
        self._plans: dict[tuple[int, int, int], tuple[Any, list]] = {}
        self._plans_of: Any = None  # the staging list the plans were made for

    def request(
        self, chunk: int, proof: "Proof", path: str, namespace: bytes
    ) -> "native.ReadRequest":
        """What the file must be and where its payload goes in CPU row ``chunk``."""
        layout, first, count = self.geometry(proof)
        segments, plan = self.plan(layout, first, count)
        runs = [(address + chunk * stride, n) for address, stride, n in plan]
        return chunk_read.request(proof, path, namespace, segments, runs)

    def geometry(self, proof: "Proof") -> tuple["GroupLayout", int, int]:
        """(group layout, first sub-block, sub-blocks) of a key's CPU row."""
        layout = self.groups[proof.group]
        bpc = self._access.blocks_per_chunk
        if proof.kind == fmt.GROUP_KIND_STATE:
            block_tokens = proof.chunk_tokens // bpc
            return layout, (proof.boundary // block_tokens - 1) % bpc, 1
        return layout, 0, bpc

    def runs(self, layout: "GroupLayout", chunk: int, first: int, count: int) -> list:
        """Where the payload goes, in payload order (CPU row ``chunk``)."""
        _, plan = self.plan(layout, first, count)
        return [(address + chunk * stride, n) for address, stride, n in plan]

    def plan(self, layout: "GroupLayout", first: int, count: int) -> tuple[Any, list]:
        """(segment table, runs of CPU row 0 as (address, row stride, length)).

        Runs are merged only where they follow each other in memory and move
        with the same row stride, so they stay adjacent in every row. The
        plans hold while the store's staging list is the same one."""
        key = (layout.group, first, count)
        staging: Sequence[StagingTensor] = self._access.staging()
        if self._plans_of is not staging:
            self._plans = {}
            self._plans_of = staging
        plan = self._plans.get(key)
        if plan is None:
            bpc = self._access.blocks_per_chunk
            runs: list[list[int]] = []
            for layer in layout.layers:
                t = staging[layer.tensor]
                page = t.width // bpc
                row = chunk_read.buffer_address(t.source) + t.offset + layer.offset
                for j in range(first, first + count):
                    address = row + j * page
                    last = runs[-1] if runs else None
                    if (
                        last
                        and last[1] == t.row_stride
                        and last[0] + last[2] == address
                    ):
                        last[2] += layer.real_bytes
                    else:
                        runs.append([address, t.row_stride, layer.real_bytes])
            plan = self._plans[key] = (
                layout.segments(count),
                [(a, s, n) for a, s, n in runs],
            )
        return plan
