# SPDX-License-Identifier: Apache-2.0
"""The segment table of a chunk header: which payload bytes hold what
(plain data; the table is encoded and checked by the native codec)."""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


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


def make_segments(specs: Iterable[tuple[Any, ...]]) -> tuple[Segment, ...]:
    """Lay out (layer, kind, dtype, shape, stride[, part]) tuples back to back.

    Lengths come from shape and dtype; describe opaque bytes as shape (n,),
    stride (1,) with dtype UINT8. A 5-tuple is part 0.
    """
    out: list[Segment] = []
    offset = 0
    for spec in specs:
        layer, kind, dtype, shape, stride = spec[:5]
        dtype, shape = DType(dtype), tuple(map(int, shape))
        length = DTYPE_ITEMSIZE[dtype] * math.prod(shape)
        kind, stride = SegmentKind(kind), tuple(map(int, stride))
        part = int(spec[5]) if len(spec) > 5 else 0
        out.append(Segment(layer, kind, dtype, offset, length, shape, stride, part))
        offset += length
    return tuple(out)
