# SPDX-License-Identifier: Apache-2.0
"""Where one rank's KV bytes are: groups, layers, staging rows, segments."""

from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

from .deps import fmt
from .errors import WriterDisabled

DTYPES = {
    "uint8": fmt.DType.UINT8,
    "int8": fmt.DType.INT8,
    "float16": fmt.DType.FLOAT16,
    "bfloat16": fmt.DType.BFLOAT16,
    "float32": fmt.DType.FLOAT32,
    "float8_e4m3fn": fmt.DType.FLOAT8_E4M3FN,
    "float8_e5m2": fmt.DType.FLOAT8_E5M2,
    "int32": fmt.DType.INT32,
    "float64": fmt.DType.FLOAT64,
}


@dataclass(frozen=True)
class StatePart:
    """One state tensor of a state layer, as laid out in its page."""

    dtype: str  # e.g. "bfloat16"
    shape: tuple[int, ...]
    # Element strides as the tensor lies in vLLM's page (state_strides);
    # None: not read yet, contiguous assumed.
    stride: tuple[int, ...] | None = None

    @property
    def nbytes(self) -> int:
        n = fmt.DTYPE_ITEMSIZE[DTYPES[self.dtype]]
        for dim in self.shape:
            n *= dim
        return n


@dataclass(frozen=True)
class LayerLayout:
    tensor: int  # index into the staging tensors
    real_bytes: int  # unpadded page bytes: what the DMA wrote
    state: tuple[StatePart, ...] = ()  # empty for attention layers
    # The model's layer index (the header's layer_index); None only for
    # hand-made layouts, which number their layers by position.
    index: int | None = None
    # Which cache of that model layer (the segment's part): GLM-5.3's kpool
    # indexer keys (0) and its MLA (1) share one group and one layer index.
    part: int = 0
    # Byte offset of the layer's page within the block's row: 0, or where a
    # block-outermost (packed) layout puts it (every layer of a group in one
    # row, KVCacheTensor.offset + i * layer_stride).
    offset: int = 0


@dataclass(frozen=True)
class GroupLayout:
    group: int  # original KV cache group index
    slot: int  # position in the offloading config / transfer spec
    kind: str  # "full", "window" or "state"
    layers: tuple[LayerLayout, ...]

    @cached_property  # on every key's path; the layout never changes
    def block_bytes(self) -> int:
        return sum(layer.real_bytes for layer in self.layers)

    def segments(self, blocks: int) -> tuple[fmt.Segment, ...]:
        specs = []
        for position, layer in enumerate(self.layers):
            index = position if layer.index is None else layer.index
            if not layer.state:
                n = layer.real_bytes * blocks
                specs.append(
                    (index, fmt.SegmentKind.KV, fmt.DType.UINT8, (n,), (1,), layer.part)
                )
                continue
            if blocks != 1:
                raise ValueError("a state payload holds exactly one block")
            *conv, temporal = layer.state
            # One conv segment per conv state (KDA: q, k, v = parts 0, 1, 2),
            # each with its own dtype, shape and strides (format v2).
            for part, state in enumerate(conv):
                specs.append(
                    (
                        index,
                        fmt.SegmentKind.CONV,
                        DTYPES[state.dtype],
                        state.shape,
                        state.stride or contiguous(state.shape),
                        part,
                    )
                )
            specs.append(
                (
                    index,
                    fmt.SegmentKind.TEMPORAL,
                    DTYPES[temporal.dtype],
                    temporal.shape,
                    temporal.stride or contiguous(temporal.shape),
                )
            )
        return fmt.make_segments(specs)


def model_layer_index(name: str) -> int | None:
    """The model's layer index in a layer name ("model.layers.12.mixer" ->
    12): its only all-digit component, or None (not one, or several)."""
    numbers = [part for part in name.split(".") if part.isdigit()]
    return int(numbers[0]) if len(numbers) == 1 else None


def contiguous(shape: Sequence[int]) -> tuple[int, ...]:
    strides = []
    step = 1
    for dim in reversed(shape):
        strides.append(step)
        step *= dim
    return tuple(reversed(strides))


# One state tensor of a layer as vLLM holds it: shape and element strides
# without the block dimension, and its byte offset within the block's page.
StateView = tuple[tuple[int, ...], tuple[int, ...], int]


def state_strides(
    parts: Sequence[StatePart], views: Sequence[StateView]
) -> tuple[StatePart, ...]:
    """The parts with the strides vLLM's views have; WriterDisabled when the
    header cannot describe them: the payload is the page's bytes as they lie,
    so every part must be dense in its shape's order, back to back in the
    spec's order."""
    if len(views) != len(parts):
        raise WriterDisabled(f"{len(views)} state tensors, the spec has {len(parts)}")
    out = []
    offset = 0
    for i, (part, (shape, stride, start)) in enumerate(zip(parts, views, strict=True)):
        if tuple(shape) != part.shape:
            raise WriterDisabled(
                f"state part {i}: shape {tuple(shape)}, spec {part.shape}"
            )
        if start != offset:
            raise WriterDisabled(
                f"state part {i} starts at byte {start} of the page, not {offset}"
            )
        if tuple(stride) != contiguous(shape):
            raise WriterDisabled(
                f"state part {i}: strides {tuple(stride)} are not the dense layout "
                f"{contiguous(shape)} a chunk header describes"
            )
        out.append(StatePart(part.dtype, part.shape, tuple(stride)))
        offset += part.nbytes
    return tuple(out)


@dataclass(frozen=True)
class StagingTensor:
    """One staging tensor: rows of ``width`` bytes, ``row_stride`` apart."""

    source: Any  # writable buffer or a flat torch uint8 tensor
    offset: int  # byte offset of row 0 within source
    row_stride: int
    width: int  # bytes of one row that belong to this tensor


def bind_layers(
    groups: Sequence[GroupLayout], refs: Sequence[Sequence[tuple[int, int]]]
) -> list[GroupLayout]:
    """Bind each layer to its staging tensor from the worker's per-group refs.

    refs[slot] lists (tensor index, unpadded page bytes) per layer, in the
    group's layer order; or, for a block-outermost (packed) layout, one ref
    for the whole block, each layer at its own offset in it. Anything else
    raises WriterDisabled (the boot is refused).
    """
    bound = []
    for g in groups:
        group_refs = refs[g.slot] if g.slot < len(refs) else ()
        if len(group_refs) == 1 and _packed(g.layers, group_refs[0][1]):
            tensor, row = group_refs[0]
            end = 0
            for layer in sorted(g.layers, key=lambda x: x.offset):
                if layer.offset < end or layer.offset + layer.real_bytes > row:
                    raise WriterDisabled(
                        f"group {g.group}: its layers do not lie apart within the "
                        f"packed {row}-byte block"
                    )
                end = layer.offset + layer.real_bytes
            layers = [replace(layer, tensor=tensor) for layer in g.layers]
        elif len(group_refs) == len(g.layers):
            layers = []
            for layer, (tensor, page_bytes) in zip(g.layers, group_refs, strict=True):
                if page_bytes != layer.real_bytes:
                    raise WriterDisabled(
                        f"group {g.group}: the DMA copies {page_bytes} bytes per page, "
                        f"the spec says {layer.real_bytes}"
                    )
                layers.append(replace(layer, tensor=tensor, offset=0))
        else:
            raise WriterDisabled(
                f"group {g.group}: the worker's transfer refs do not map one to "
                "one onto its layers, nor one packed block"
            )
        bound.append(GroupLayout(g.group, g.slot, g.kind, tuple(layers)))
    return bound


def _packed(layers: Sequence[LayerLayout], row: int) -> bool:
    """One ref for a group whose layers it holds side by side: a packed block
    (more than one layer, or one layer smaller than the block)."""
    return len(layers) > 1 or (len(layers) == 1 and layers[0].real_bytes < row)
