# SPDX-License-Identifier: Apache-2.0
"""The segment table of a chunk header: which payload bytes hold what."""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .constants import MAX_LAYER_INDEX, MAX_NDIM, SEGMENT_ENTRY_SIZE
from .format_error import FormatError, Reason

# One segment table entry (little-endian), see docs/FORMAT.md "Chunk header".
_SEGMENT = struct.Struct("<IBBBBQQ6Q6Q")
assert _SEGMENT.size == SEGMENT_ENTRY_SIZE


class SegmentKind(enum.IntEnum):
    KV = 1  # an attention layer's page bytes
    CONV = 2  # a state layer's convolution state
    TEMPORAL = 3  # a state layer's recurrent (temporal) state


class DType(enum.IntEnum):
    UINT8 = 1
    INT8 = 2
    FLOAT16 = 3
    BFLOAT16 = 4
    FLOAT32 = 5
    FLOAT8_E4M3FN = 6
    FLOAT8_E5M2 = 7
    INT32 = 8
    FLOAT64 = 9


DTYPE_ITEMSIZE: dict[DType, int] = {
    DType.UINT8: 1,
    DType.INT8: 1,
    DType.FLOAT16: 2,
    DType.BFLOAT16: 2,
    DType.FLOAT32: 4,
    DType.FLOAT8_E4M3FN: 1,
    DType.FLOAT8_E5M2: 1,
    DType.INT32: 4,
    DType.FLOAT64: 8,
}


@dataclass(frozen=True)
class Segment:
    """One contiguous run of the payload: a layer's bytes or one state part.

    `part` (v2) numbers the tensors of one (layer, kind): a KDA-style layer
    has conv parts 0, 1, 2 (q, k, v). v1 has no part: it is always 0 there.
    """

    layer: int
    kind: SegmentKind
    dtype: DType
    offset: int
    length: int
    shape: tuple[int, ...] = ()
    stride: tuple[int, ...] = ()
    part: int = 0


def make_segments(
    specs: Iterable[tuple[Any, ...]],
) -> tuple[Segment, ...]:
    """Lay out (layer, kind, dtype, shape, stride[, part]) tuples back to back.

    Lengths come from shape and dtype; describe opaque bytes as shape (n,),
    stride (1,) with dtype UINT8. A 5-tuple is part 0.
    """
    out: list[Segment] = []
    offset = 0
    for spec in specs:
        layer, kind, dtype, shape, stride = spec[:5]
        part = spec[5] if len(spec) > 5 else 0
        length = DTYPE_ITEMSIZE[DType(dtype)]
        for dim in shape:
            length *= int(dim)
        out.append(
            Segment(
                layer=layer,
                kind=SegmentKind(kind),
                dtype=DType(dtype),
                offset=offset,
                length=length,
                shape=tuple(int(d) for d in shape),
                stride=tuple(int(s) for s in stride),
                part=int(part),
            )
        )
        offset += length
    return tuple(out)


def encode_segment(seg: Segment) -> bytes:
    shape = list(seg.shape) + [0] * (MAX_NDIM - len(seg.shape))
    stride = list(seg.stride) + [0] * (MAX_NDIM - len(seg.stride))
    return _SEGMENT.pack(
        seg.layer,
        int(seg.kind),
        int(seg.dtype),
        len(seg.shape),
        seg.part,  # v1: the reserved byte, 0 (checked by the header)
        seg.offset,
        seg.length,
        *shape,
        *stride,
    )


def decode_segment(buf: memoryview, offset: int, index: int, version: int) -> Segment:
    fields = _SEGMENT.unpack_from(buf, offset)
    layer, kind, dtype, ndim, part, seg_offset, length = fields[:7]
    shape_all = fields[7 : 7 + MAX_NDIM]
    stride_all = fields[7 + MAX_NDIM :]
    where = f"segment {index}"
    if version == 1 and part != 0:  # v1's reserved byte
        raise FormatError(Reason.RESERVED_NONZERO, f"{where}: reserved byte")
    if kind not in SegmentKind._value2member_map_:
        raise FormatError(Reason.BAD_SEGMENT_TABLE, f"{where}: kind {kind}")
    if dtype not in DType._value2member_map_:
        raise FormatError(Reason.BAD_SEGMENT_TABLE, f"{where}: dtype {dtype}")
    if ndim > MAX_NDIM:
        raise FormatError(Reason.BAD_SEGMENT_TABLE, f"{where}: ndim {ndim}")
    if any(shape_all[ndim:]) or any(stride_all[ndim:]):
        raise FormatError(Reason.BAD_SEGMENT_TABLE, f"{where}: unused dims not 0")
    return Segment(
        layer=layer,
        kind=SegmentKind(kind),
        dtype=DType(dtype),
        offset=seg_offset,
        length=length,
        shape=tuple(shape_all[:ndim]),
        stride=tuple(stride_all[:ndim]),
        part=part,
    )


def check_segment_table(segments: Sequence[Segment], payload_length: int) -> None:
    expected_offset = 0
    previous: tuple[int, int, int] | None = None
    for i, seg in enumerate(segments):
        where = f"segment {i}"
        if seg.layer > MAX_LAYER_INDEX:
            raise FormatError(Reason.BAD_SEGMENT_TABLE, f"{where}: layer {seg.layer}")
        # v1 parts are all 0, so this is v1's (layer, kind) rule there.
        order = (seg.layer, int(seg.kind), seg.part)
        if previous is not None and order <= previous:
            raise FormatError(
                Reason.BAD_SEGMENT_TABLE, f"{where}: not sorted by (layer, kind, part)"
            )
        previous = order
        if seg.kind in (SegmentKind.CONV, SegmentKind.TEMPORAL) and not seg.shape:
            raise FormatError(Reason.BAD_SEGMENT_TABLE, f"{where}: state needs shape")
        if seg.offset != expected_offset:
            raise FormatError(
                Reason.BAD_SEGMENT_TABLE,
                f"{where}: offset {seg.offset}, expected {expected_offset}",
            )
        if seg.length == 0 or seg.length > payload_length - expected_offset:
            raise FormatError(Reason.BAD_SEGMENT_TABLE, f"{where}: length {seg.length}")
        if seg.shape:
            elements = 1
            for dim in seg.shape:
                elements *= dim
            if elements * DTYPE_ITEMSIZE[seg.dtype] != seg.length:
                raise FormatError(
                    Reason.BAD_SEGMENT_TABLE, f"{where}: shape does not match length"
                )
        expected_offset += seg.length
    if expected_offset != payload_length:
        raise FormatError(
            Reason.BAD_SEGMENT_TABLE,
            f"segments cover {expected_offset} of {payload_length} payload bytes",
        )
