# SPDX-License-Identifier: Apache-2.0
"""Chunk store format v2: the on-disk contract of the worker-local KV tier.

This module is the Python half of the codec described in docs/FORMAT.md of the
kvtier project; `kvstore` (C++) implements the other half. Both are checked
against the same test vectors, so any change here must change the spec, the C++
codec and the vectors together. Standard library only: it runs inside vLLM.

Everything a reader rejects raises `FormatError` carrying a `Reason`; the
reason values are the names the C++ codec reports for the same bytes.

Why one file over 500 lines: the codec travels as one standard-library module, into the
engine tree and into the tools and tests that read a store, and it must change as a whole
with docs/FORMAT.md and the C++ codec.
"""

from __future__ import annotations

import enum
import hashlib
import json
import os
import re
import struct
import zlib
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

FORMAT_VERSION = 2  # what encoders write
READABLE_VERSIONS = (1, 2)  # what readers accept (v1: no segment part)
PENDING_FORMAT_VERSION = 1  # the pending record (9.1) did not change in v2
MAGIC = b"KVTCHUNK"
DEFAULT_PREFIX = "glm53kv"

CHECKSUM_CRC32 = 1  # zlib's CRC-32 (reflected 0xEDB88320, init/xorout 0xFFFFFFFF)
CHECKSUM_CRC32C = 2  # reserved for a later version; v1/v2 readers reject it

FIXED_HEADER_SIZE = 144
SEGMENT_ENTRY_SIZE = 120
HEADER_CHECKSUM_SIZE = 4
MAX_SEGMENTS = 4096
MIN_HEADER_LENGTH = FIXED_HEADER_SIZE + SEGMENT_ENTRY_SIZE + HEADER_CHECKSUM_SIZE
MAX_HEADER_LENGTH = (
    FIXED_HEADER_SIZE + MAX_SEGMENTS * SEGMENT_ENTRY_SIZE + HEADER_CHECKSUM_SIZE
)
MIN_KEY_HASH_BYTES = 8
MAX_KEY_HASH_BYTES = 64
MAX_GROUP_INDEX = 1023
MAX_LAYER_INDEX = 65535
MAX_TOKEN_INDEX = 1 << 40
MAX_PAYLOAD_LENGTH = 1 << 34
MAX_NDIM = 6
MAX_PART = 255
MAX_CHAIN_LENGTH = 1 << 18
MAX_MANIFEST_GROUPS = MAX_GROUP_INDEX + 1
MAX_MANIFEST_BYTES = 64 << 20
MAX_RECORD_BYTES = 1 << 20
MAX_RANK = 65535
MAX_KEEP_BOUNDARIES = 1024
NS_SHORT_HEX = 16
MODEL_NAME_MAX = 64

# Header field offsets (little-endian), see docs/FORMAT.md "Chunk header".
_FIXED = struct.Struct("<8sHHIBBHIQQII32s64s")
_SEGMENT = struct.Struct("<IBBBBQQ6Q6Q")
assert _FIXED.size == FIXED_HEADER_SIZE
assert _SEGMENT.size == SEGMENT_ENTRY_SIZE


class Reason(str, enum.Enum):
    """Why a reader rejected a file. Values equal the C++ `reason_name()`."""

    TRUNCATED = "truncated"
    BAD_MAGIC = "bad_magic"
    UNSUPPORTED_VERSION = "unsupported_version"
    BAD_HEADER_LENGTH = "bad_header_length"
    UNSUPPORTED_CHECKSUM_ALGORITHM = "unsupported_checksum_algorithm"
    HEADER_CHECKSUM_MISMATCH = "header_checksum_mismatch"
    RESERVED_NONZERO = "reserved_nonzero"
    BAD_KEY_HASH = "bad_key_hash"
    FIELD_OUT_OF_RANGE = "field_out_of_range"
    BAD_SEGMENT_TABLE = "bad_segment_table"
    TRAILING_BYTES = "trailing_bytes"
    PAYLOAD_CHECKSUM_MISMATCH = "payload_checksum_mismatch"
    BAD_JSON = "bad_json"
    BAD_FIELD = "bad_field"
    MANIFEST_CHECKSUM_MISMATCH = "manifest_checksum_mismatch"
    MANIFEST_INCONSISTENT = "manifest_inconsistent"
    BAD_NAME = "bad_name"


class FormatError(ValueError):
    """A file or name that does not follow the format (v1 or v2)."""

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(f"{reason.value}: {message}")
        self.reason = reason
        self.message = message


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


def crc32(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    """CRC-32 (algorithm id 1). Pass the previous value to continue a stream."""
    return zlib.crc32(data, value) & 0xFFFFFFFF


# --------------------------------------------------------------------------
# Chunk header
# --------------------------------------------------------------------------


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


@dataclass(frozen=True)
class ChunkHeader:
    namespace_hash: bytes
    group: int
    key_hash: bytes
    boundary: int
    segments: tuple[Segment, ...]
    payload_length: int
    payload_checksum: int
    checksum_algorithm: int = CHECKSUM_CRC32
    format_version: int = FORMAT_VERSION

    @property
    def header_length(self) -> int:
        return header_length_for(len(self.segments))

    @property
    def key_hex(self) -> str:
        return self.key_hash.hex()


def header_length_for(num_segments: int) -> int:
    return FIXED_HEADER_SIZE + num_segments * SEGMENT_ENTRY_SIZE + HEADER_CHECKSUM_SIZE


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


def encode_header(header: ChunkHeader) -> bytes:
    """Serialize a header; raises FormatError if it would not parse back."""
    _check_header_fields(header)
    parts = [
        _FIXED.pack(
            MAGIC,
            header.format_version,
            0,
            header.header_length,
            header.checksum_algorithm,
            len(header.key_hash),
            len(header.segments),
            header.group,
            header.boundary,
            header.payload_length,
            header.payload_checksum,
            0,
            header.namespace_hash,
            header.key_hash.ljust(MAX_KEY_HASH_BYTES, b"\0"),
        )
    ]
    for seg in header.segments:
        shape = list(seg.shape) + [0] * (MAX_NDIM - len(seg.shape))
        stride = list(seg.stride) + [0] * (MAX_NDIM - len(seg.stride))
        parts.append(
            _SEGMENT.pack(
                seg.layer,
                int(seg.kind),
                int(seg.dtype),
                len(seg.shape),
                seg.part,  # v1: the reserved byte, 0 (checked above)
                seg.offset,
                seg.length,
                *shape,
                *stride,
            )
        )
    body = b"".join(parts)
    return body + struct.pack("<I", crc32(body))


def encode_chunk(
    namespace_hash: bytes,
    group: int,
    key_hash: bytes,
    boundary: int,
    segments: Sequence[Segment],
    payload: bytes | bytearray | memoryview,
    format_version: int = FORMAT_VERSION,
) -> bytes:
    """Header + payload in one buffer (tests and small writers)."""
    header = make_header(
        namespace_hash, group, key_hash, boundary, segments, payload, format_version
    )
    return encode_header(header) + bytes(payload)


def make_header(
    namespace_hash: bytes,
    group: int,
    key_hash: bytes,
    boundary: int,
    segments: Sequence[Segment],
    payload: bytes | bytearray | memoryview,
    format_version: int = FORMAT_VERSION,
) -> ChunkHeader:
    return ChunkHeader(
        namespace_hash=bytes(namespace_hash),
        group=group,
        key_hash=bytes(key_hash),
        boundary=boundary,
        segments=tuple(segments),
        payload_length=len(memoryview(payload).cast("B")),
        payload_checksum=crc32(payload),
        format_version=format_version,
    )


def decode_header(data: bytes | bytearray | memoryview) -> ChunkHeader:
    """Parse and check a header from the start of a chunk file.

    `data` must hold the first min(file size, MAX_HEADER_LENGTH) bytes of the
    file (more is fine). The payload is not checked here; see verify_chunk.
    """
    buf = memoryview(data).cast("B")
    size = len(buf)
    if size < len(MAGIC):
        raise FormatError(Reason.TRUNCATED, f"{size} bytes, magic needs 8")
    if bytes(buf[:8]) != MAGIC:
        raise FormatError(Reason.BAD_MAGIC, "not a kvtier chunk (magic)")
    if size < 10:
        raise FormatError(Reason.TRUNCATED, f"{size} bytes, version needs 10")
    (version,) = struct.unpack_from("<H", buf, 8)
    if version not in READABLE_VERSIONS:
        raise FormatError(Reason.UNSUPPORTED_VERSION, f"format version {version}")
    if size < FIXED_HEADER_SIZE:
        raise FormatError(
            Reason.TRUNCATED, f"{size} bytes, fixed header needs {FIXED_HEADER_SIZE}"
        )
    (
        _magic,
        _version,
        flags,
        header_length,
        algorithm,
        key_len,
        nseg,
        group,
        boundary,
        payload_length,
        payload_checksum,
        reserved,
        ns_hash,
        key_field,
    ) = _FIXED.unpack_from(buf, 0)
    if (
        header_length < MIN_HEADER_LENGTH
        or header_length > MAX_HEADER_LENGTH
        or (header_length - FIXED_HEADER_SIZE - HEADER_CHECKSUM_SIZE)
        % SEGMENT_ENTRY_SIZE
    ):
        raise FormatError(Reason.BAD_HEADER_LENGTH, f"header length {header_length}")
    if algorithm != CHECKSUM_CRC32:
        raise FormatError(
            Reason.UNSUPPORTED_CHECKSUM_ALGORITHM, f"checksum algorithm {algorithm}"
        )
    if size < header_length:
        raise FormatError(
            Reason.TRUNCATED, f"{size} bytes, header needs {header_length}"
        )
    (stored,) = struct.unpack_from("<I", buf, header_length - 4)
    actual = crc32(buf[: header_length - 4])
    if stored != actual:
        raise FormatError(
            Reason.HEADER_CHECKSUM_MISMATCH,
            f"header checksum {stored:08x}, computed {actual:08x}",
        )
    # The header is authentic from here on; what follows catches writer bugs.
    if flags != 0 or reserved != 0:
        raise FormatError(Reason.RESERVED_NONZERO, "flags/reserved must be 0")
    if not MIN_KEY_HASH_BYTES <= key_len <= MAX_KEY_HASH_BYTES or any(
        key_field[key_len:]
    ):
        raise FormatError(Reason.BAD_KEY_HASH, f"key hash length {key_len}")
    if group > MAX_GROUP_INDEX:
        raise FormatError(Reason.FIELD_OUT_OF_RANGE, f"group index {group}")
    if not 0 < boundary <= MAX_TOKEN_INDEX:
        raise FormatError(Reason.FIELD_OUT_OF_RANGE, f"boundary {boundary}")
    if not 0 < payload_length <= MAX_PAYLOAD_LENGTH:
        raise FormatError(Reason.FIELD_OUT_OF_RANGE, f"payload length {payload_length}")
    if nseg < 1 or header_length_for(nseg) != header_length:
        raise FormatError(
            Reason.BAD_SEGMENT_TABLE,
            f"{nseg} segments do not fill header length {header_length}",
        )
    segments = tuple(
        _decode_segment(buf, FIXED_HEADER_SIZE + i * SEGMENT_ENTRY_SIZE, i, version)
        for i in range(nseg)
    )
    _check_segment_table(segments, payload_length)
    return ChunkHeader(
        namespace_hash=bytes(ns_hash),
        group=group,
        key_hash=bytes(key_field[:key_len]),
        boundary=boundary,
        segments=segments,
        payload_length=payload_length,
        payload_checksum=payload_checksum,
        checksum_algorithm=algorithm,
        format_version=version,
    )


def check_file_size(header: ChunkHeader, file_size: int) -> None:
    expected = header.header_length + header.payload_length
    if file_size < expected:
        raise FormatError(
            Reason.TRUNCATED, f"{file_size} bytes, chunk needs {expected}"
        )
    if file_size > expected:
        raise FormatError(
            Reason.TRAILING_BYTES, f"{file_size} bytes, chunk is {expected}"
        )


def check_payload_checksum(header: ChunkHeader, computed: int) -> None:
    if computed != header.payload_checksum:
        raise FormatError(
            Reason.PAYLOAD_CHECKSUM_MISMATCH,
            f"payload checksum {header.payload_checksum:08x}, computed {computed:08x}",
        )


def verify_chunk(data: bytes | bytearray | memoryview) -> ChunkHeader:
    """Full check of a whole chunk file held in memory."""
    buf = memoryview(data).cast("B")
    header = decode_header(buf)
    check_file_size(header, len(buf))
    check_payload_checksum(header, crc32(buf[header.header_length :]))
    return header


def read_chunk_header(path: str) -> ChunkHeader:
    """Parse the header of a chunk file and check its size (not the payload)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        header = decode_header(f.read(min(size, MAX_HEADER_LENGTH)))
    check_file_size(header, size)
    return header


def verify_chunk_file(path: str, block_size: int = 8 << 20) -> ChunkHeader:
    """Header, size and payload checksum of a chunk file, read in blocks."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(min(size, MAX_HEADER_LENGTH))
        header = decode_header(head)
        check_file_size(header, size)
        value = crc32(memoryview(head)[header.header_length :])
        while block := f.read(block_size):
            value = crc32(block, value)
    check_payload_checksum(header, value)
    return header


def _check_header_fields(header: ChunkHeader) -> None:
    if header.format_version not in READABLE_VERSIONS:
        raise FormatError(
            Reason.UNSUPPORTED_VERSION, f"format version {header.format_version}"
        )
    if header.checksum_algorithm != CHECKSUM_CRC32:
        raise FormatError(
            Reason.UNSUPPORTED_CHECKSUM_ALGORITHM,
            f"checksum algorithm {header.checksum_algorithm}",
        )
    if len(header.namespace_hash) != 32:
        raise FormatError(Reason.BAD_FIELD, "namespace hash must be 32 bytes")
    if not MIN_KEY_HASH_BYTES <= len(header.key_hash) <= MAX_KEY_HASH_BYTES:
        raise FormatError(Reason.BAD_KEY_HASH, f"key hash {len(header.key_hash)} B")
    if not 0 <= header.group <= MAX_GROUP_INDEX:
        raise FormatError(Reason.FIELD_OUT_OF_RANGE, f"group index {header.group}")
    if not 0 < header.boundary <= MAX_TOKEN_INDEX:
        raise FormatError(Reason.FIELD_OUT_OF_RANGE, f"boundary {header.boundary}")
    if not 0 < header.payload_length <= MAX_PAYLOAD_LENGTH:
        raise FormatError(
            Reason.FIELD_OUT_OF_RANGE, f"payload length {header.payload_length}"
        )
    if not 0 <= header.payload_checksum <= 0xFFFFFFFF:
        raise FormatError(Reason.FIELD_OUT_OF_RANGE, "payload checksum")
    if not 1 <= len(header.segments) <= MAX_SEGMENTS:
        raise FormatError(Reason.BAD_SEGMENT_TABLE, f"{len(header.segments)} segments")
    for seg in header.segments:
        if len(seg.shape) != len(seg.stride) or len(seg.shape) > MAX_NDIM:
            raise FormatError(Reason.BAD_SEGMENT_TABLE, "shape/stride rank")
        if any(not 0 <= v < 1 << 64 for v in (*seg.shape, *seg.stride)):
            raise FormatError(Reason.BAD_SEGMENT_TABLE, "shape/stride range")
        if not 0 <= seg.layer <= MAX_LAYER_INDEX:
            raise FormatError(Reason.BAD_SEGMENT_TABLE, f"layer {seg.layer}")
        if not 0 <= seg.part <= MAX_PART:
            raise FormatError(Reason.BAD_SEGMENT_TABLE, f"part {seg.part}")
        if seg.part and header.format_version == 1:
            raise FormatError(Reason.RESERVED_NONZERO, "v1 has no segment part")
    _check_segment_table(header.segments, header.payload_length)


def _decode_segment(buf: memoryview, offset: int, index: int, version: int) -> Segment:
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


def _check_segment_table(segments: Sequence[Segment], payload_length: int) -> None:
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


# --------------------------------------------------------------------------
# Canonical JSON (namespace hash, manifest checksum)
# --------------------------------------------------------------------------

_INT_MIN = -(1 << 63)
_INT_MAX = (1 << 63) - 1
MAX_JSON_DEPTH = 64


def canonical_json(value: Any) -> bytes:
    """Sorted keys, no whitespace, ASCII only; integers, no floats."""
    _check_canonical(value)
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=True
    ).encode("ascii")


def _check_canonical(value: Any, depth: int = 1) -> None:
    if depth > MAX_JSON_DEPTH:
        raise FormatError(Reason.BAD_JSON, f"nesting deeper than {MAX_JSON_DEPTH}")
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, int):
        if not _INT_MIN <= value <= _INT_MAX:
            raise FormatError(Reason.BAD_JSON, f"integer {value} out of range")
        return
    if isinstance(value, str):
        _check_text(value)
        return
    if isinstance(value, (list, tuple)):
        for item in value:
            _check_canonical(item, depth + 1)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise FormatError(Reason.BAD_JSON, "object keys must be strings")
            _check_text(key)
            _check_canonical(item, depth + 1)
        return
    raise FormatError(Reason.BAD_JSON, f"{type(value).__name__} is not allowed")


def _check_text(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise FormatError(Reason.BAD_JSON, "string is not valid Unicode") from e


def _reject_float(text: str) -> Any:
    raise FormatError(Reason.BAD_JSON, f"non-integer number {text}")


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise FormatError(Reason.BAD_JSON, f"duplicate key {key!r}")
        out[key] = value
    return out


def parse_json(data: bytes | bytearray | memoryview, limit: int) -> Any:
    """Strict JSON: UTF-8, no duplicate keys, no floats or NaN."""
    raw = bytes(data)
    if len(raw) > limit:
        raise FormatError(Reason.BAD_JSON, f"{len(raw)} bytes, limit {limit}")
    try:
        text = raw.decode("utf-8")
        value = json.loads(
            text,
            object_pairs_hook=_unique_pairs,
            parse_float=_reject_float,
            parse_constant=_reject_float,
        )
    except FormatError:
        raise
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise FormatError(Reason.BAD_JSON, str(e).splitlines()[0]) from e
    _check_canonical(value)
    return value


# --------------------------------------------------------------------------
# Namespace record
# --------------------------------------------------------------------------

_FENCED_STR = ("model", "vllm_version", "build_id", "kv_dtype", "hash_algorithm")


@dataclass(frozen=True)
class NamespaceRecord:
    """`fenced` is hashed and compared exactly; `info` is diagnostics only."""

    fenced: Mapping[str, Any]
    info: Mapping[str, Any]

    @property
    def namespace_hash(self) -> bytes:
        return namespace_hash(self.fenced)

    @property
    def namespace_short(self) -> str:
        return self.namespace_hash.hex()[:NS_SHORT_HEX]


def make_fenced(
    *,
    model: str,
    vllm_version: str,
    build_id: str,
    tp_size: int,
    kv_dtype: str,
    hash_algorithm: str,
    num_speculative_tokens: int,
    page_sizes: Mapping[int, int],
    state_abi: Mapping[str, Any],
    format_version: int = FORMAT_VERSION,
) -> dict[str, Any]:
    fenced: dict[str, Any] = {
        "format_version": format_version,
        "model": model,
        "vllm_version": vllm_version,
        "build_id": build_id,
        "tp_size": tp_size,
        "kv_dtype": kv_dtype,
        "hash_algorithm": hash_algorithm,
        "num_speculative_tokens": num_speculative_tokens,
        "page_sizes": [[g, page_sizes[g]] for g in sorted(page_sizes)],
        "state_abi": dict(state_abi),
    }
    check_fenced(fenced)
    return fenced


def check_fenced(fenced: Mapping[str, Any]) -> None:
    if not isinstance(fenced, Mapping):
        raise FormatError(Reason.BAD_FIELD, "fenced must be an object")
    version = fenced.get("format_version")
    if type(version) is not int:
        raise FormatError(Reason.BAD_FIELD, "fenced.format_version missing")
    if version not in READABLE_VERSIONS:
        raise FormatError(Reason.UNSUPPORTED_VERSION, f"format version {version}")
    for name in _FENCED_STR:
        value = fenced.get(name)
        if not isinstance(value, str) or len(value.encode("utf-8")) > 256:
            raise FormatError(Reason.BAD_FIELD, f"fenced.{name} must be a string")
        if name != "build_id" and not value:
            raise FormatError(Reason.BAD_FIELD, f"fenced.{name} is empty")
    _int_field(fenced, "tp_size", 1, MAX_RANK + 1, "fenced.")
    _int_field(fenced, "num_speculative_tokens", 0, 1024, "fenced.")
    pages = fenced.get("page_sizes")
    if not isinstance(pages, list) or not 1 <= len(pages) <= MAX_MANIFEST_GROUPS:
        raise FormatError(Reason.BAD_FIELD, "fenced.page_sizes must be a list")
    last = -1
    for pair in pages:
        if (
            not isinstance(pair, list)
            or len(pair) != 2
            or type(pair[0]) is not int
            or type(pair[1]) is not int
            or not last < pair[0] <= MAX_GROUP_INDEX
            or not 0 < pair[1] <= MAX_PAYLOAD_LENGTH
        ):
            raise FormatError(
                Reason.BAD_FIELD,
                "fenced.page_sizes: [[group, bytes], ...] with groups ascending",
            )
        last = pair[0]
    if not isinstance(fenced.get("state_abi"), Mapping):
        raise FormatError(Reason.BAD_FIELD, "fenced.state_abi must be an object")


def namespace_hash(fenced: Mapping[str, Any]) -> bytes:
    """sha256 of the canonical JSON of the fenced part (32 bytes)."""
    return hashlib.sha256(canonical_json(dict(fenced))).digest()


def encode_namespace_record(record: NamespaceRecord) -> bytes:
    check_fenced(record.fenced)
    if not isinstance(record.info, Mapping):
        raise FormatError(Reason.BAD_FIELD, "info must be an object")
    return canonical_json({"fenced": dict(record.fenced), "info": dict(record.info)})


def decode_namespace_record(data: bytes | bytearray | memoryview) -> NamespaceRecord:
    value = parse_json(data, MAX_RECORD_BYTES)
    if not isinstance(value, dict) or set(value) != {"fenced", "info"}:
        raise FormatError(Reason.BAD_FIELD, 'record must be {"fenced", "info"}')
    if not isinstance(value["info"], dict):
        raise FormatError(Reason.BAD_FIELD, "info must be an object")
    check_fenced(value["fenced"])
    return NamespaceRecord(fenced=value["fenced"], info=value["info"])


# --------------------------------------------------------------------------
# Boundary manifest
# --------------------------------------------------------------------------

MANIFEST_KIND = "boundary_manifest"
GROUP_KIND_FULL = "full"
GROUP_KIND_STATE = "state"
_MANIFEST_KEYS = {
    "boundary",
    "chain",
    "checksum",
    "checksum_algorithm",
    "chunk_tokens",
    "format",
    "groups",
    "kind",
    "namespace",
    "rank",
}


@dataclass(frozen=True)
class ManifestEntry:
    key: str  # lowercase hex of the chunk key hash
    length: int  # payload length from the chunk header
    checksum: int  # payload checksum from the chunk header


@dataclass(frozen=True)
class ManifestGroup:
    group: int
    kind: str  # GROUP_KIND_FULL or GROUP_KIND_STATE
    entries: tuple[ManifestEntry, ...]


@dataclass(frozen=True)
class BoundaryManifest:
    namespace: str  # full namespace hash, 64 lowercase hex
    rank: int
    boundary: int
    chunk_tokens: int
    chain: tuple[str, ...]  # chunk key hashes from token 0 to the boundary
    groups: tuple[ManifestGroup, ...]
    format: int = FORMAT_VERSION  # 1 or 2 (same structure)

    @property
    def tip(self) -> str:
        return self.chain[-1]

    @property
    def file_name(self) -> str:
        return manifest_file_name(self.boundary, self.tip)


def _manifest_body(m: BoundaryManifest) -> dict[str, Any]:
    return {
        "boundary": m.boundary,
        "chain": list(m.chain),
        "checksum_algorithm": CHECKSUM_CRC32,
        "chunk_tokens": m.chunk_tokens,
        "format": m.format,
        "groups": [
            {
                "entries": [[e.key, e.length, e.checksum] for e in g.entries],
                "group": g.group,
                "kind": g.kind,
            }
            for g in m.groups
        ],
        "kind": MANIFEST_KIND,
        "namespace": m.namespace,
        "rank": m.rank,
    }


def encode_manifest(m: BoundaryManifest) -> bytes:
    if m.format not in READABLE_VERSIONS:
        raise FormatError(Reason.UNSUPPORTED_VERSION, f"format version {m.format}")
    body = _manifest_body(m)
    _check_manifest_body(body)
    body["checksum"] = f"{crc32(canonical_json(body)):08x}"
    return canonical_json(body)


def _parse_versioned(
    data: bytes | bytearray | memoryview,
    limit: int,
    what: str,
    versions: Container[int],
) -> tuple[dict[str, Any], int]:
    """A JSON object with an integer "format" this reader knows, and that format."""
    value = parse_json(data, limit)
    if not isinstance(value, dict):
        raise FormatError(Reason.BAD_FIELD, f"{what} must be an object")
    version = value.get("format")
    if type(version) is not int:
        raise FormatError(Reason.BAD_FIELD, "format missing")
    if version not in versions:
        raise FormatError(Reason.UNSUPPORTED_VERSION, f"format version {version}")
    return value, version


def decode_manifest(data: bytes | bytearray | memoryview) -> BoundaryManifest:
    value, version = _parse_versioned(
        data, MAX_MANIFEST_BYTES, "manifest", READABLE_VERSIONS
    )
    algorithm = value.get("checksum_algorithm")
    if type(algorithm) is not int:
        raise FormatError(Reason.BAD_FIELD, "checksum_algorithm missing")
    if algorithm != CHECKSUM_CRC32:
        raise FormatError(
            Reason.UNSUPPORTED_CHECKSUM_ALGORITHM, f"checksum algorithm {algorithm}"
        )
    stored = value.pop("checksum", None)
    if not isinstance(stored, str) or not re.fullmatch(r"[0-9a-f]{8}", stored):
        raise FormatError(Reason.BAD_FIELD, "checksum must be 8 lowercase hex")
    actual = f"{crc32(canonical_json(value)):08x}"
    if stored != actual:
        raise FormatError(
            Reason.MANIFEST_CHECKSUM_MISMATCH,
            f"manifest checksum {stored}, computed {actual}",
        )
    _check_manifest_body(value)
    return BoundaryManifest(
        namespace=value["namespace"],
        rank=value["rank"],
        boundary=value["boundary"],
        chunk_tokens=value["chunk_tokens"],
        chain=tuple(value["chain"]),
        groups=tuple(
            ManifestGroup(
                group=g["group"],
                kind=g["kind"],
                entries=tuple(ManifestEntry(*e) for e in g["entries"]),
            )
            for g in value["groups"]
        ),
        format=version,
    )


def _check_manifest_body(body: Mapping[str, Any]) -> None:
    keys = set(body) - {"checksum"}
    if keys != _MANIFEST_KEYS - {"checksum"}:
        missing = sorted(_MANIFEST_KEYS - {"checksum"} - keys)
        unknown = sorted(keys - _MANIFEST_KEYS)
        raise FormatError(
            Reason.BAD_FIELD, f"manifest fields: missing {missing}, unknown {unknown}"
        )
    if body["kind"] != MANIFEST_KIND:
        raise FormatError(Reason.BAD_FIELD, f"kind {body['kind']!r}")
    ns = body["namespace"]
    if not isinstance(ns, str) or not re.fullmatch(r"[0-9a-f]{64}", ns):
        raise FormatError(Reason.BAD_FIELD, "namespace must be 64 lowercase hex")
    _int_field(body, "rank", 0, MAX_RANK)
    _int_field(body, "boundary", 1, MAX_TOKEN_INDEX)
    _int_field(body, "chunk_tokens", 1, MAX_TOKEN_INDEX)
    chain = body["chain"]
    if not isinstance(chain, list) or not 1 <= len(chain) <= MAX_CHAIN_LENGTH:
        raise FormatError(Reason.BAD_FIELD, "chain must be a non-empty list")
    for key in chain:
        if not is_key_hex(key):
            raise FormatError(Reason.BAD_FIELD, f"chain key {str(key)[:80]!r}")
    groups = body["groups"]
    if not isinstance(groups, list) or not 1 <= len(groups) <= MAX_MANIFEST_GROUPS:
        raise FormatError(Reason.BAD_FIELD, "groups must be a non-empty list")
    for g in groups:
        if not isinstance(g, dict) or set(g) != {"entries", "group", "kind"}:
            raise FormatError(Reason.BAD_FIELD, "group must be {entries, group, kind}")
        _int_field(g, "group", 0, MAX_GROUP_INDEX, "groups[].")
        if g["kind"] not in (GROUP_KIND_FULL, GROUP_KIND_STATE):
            raise FormatError(Reason.BAD_FIELD, f"group kind {g['kind']!r}")
        entries = g["entries"]
        if not isinstance(entries, list) or len(entries) > MAX_CHAIN_LENGTH:
            raise FormatError(Reason.BAD_FIELD, "entries must be a list")
        for e in entries:
            if (
                not isinstance(e, list)
                or len(e) != 3
                or not is_key_hex(e[0])
                or type(e[1]) is not int
                or not 0 < e[1] <= MAX_PAYLOAD_LENGTH
                or type(e[2]) is not int
                or not 0 <= e[2] <= 0xFFFFFFFF
            ):
                raise FormatError(
                    Reason.BAD_FIELD, "entry must be [key hex, length, checksum]"
                )
    # Structure: what the entries must be, given the chain.
    if body["boundary"] != len(chain) * body["chunk_tokens"]:
        raise FormatError(
            Reason.MANIFEST_INCONSISTENT,
            f"boundary {body['boundary']} != {len(chain)} chunks x "
            f"{body['chunk_tokens']} tokens",
        )
    # Keys chain (each hashes its parent), so a repeat is a writer bug; a
    # restore would load the same chunk at two positions.
    if len(set(chain)) != len(chain):
        raise FormatError(Reason.MANIFEST_INCONSISTENT, "chain repeats a key")
    last = -1
    for g in groups:
        if g["group"] <= last:
            raise FormatError(Reason.MANIFEST_INCONSISTENT, "groups not ascending")
        last = g["group"]
        keys = [e[0] for e in g["entries"]]
        if g["kind"] == GROUP_KIND_FULL and keys != chain:
            raise FormatError(
                Reason.MANIFEST_INCONSISTENT,
                f"full group {g['group']}: entries must be the chain, in order",
            )
        if g["kind"] == GROUP_KIND_STATE and keys != [chain[-1]]:
            raise FormatError(
                Reason.MANIFEST_INCONSISTENT,
                f"state group {g['group']}: one entry, the chain tip",
            )


def _int_field(
    obj: Mapping[str, Any], name: str, low: int, high: int, where: str = ""
) -> int:
    value = obj.get(name)
    if type(value) is not int or not low <= value <= high:
        raise FormatError(
            Reason.BAD_FIELD, f"{where}{name} must be an integer in [{low}, {high}]"
        )
    return value


# --------------------------------------------------------------------------
# Pending record (FORMAT.md section 9.1)
# --------------------------------------------------------------------------

PENDING_KIND = "pending_chunks"
MAX_PENDING_BYTES = 64 << 20
MAX_PENDING_CHUNKS = 1 << 20


def encode_pending_record(chunks: Iterable[tuple[int, str]]) -> bytes:
    """Canonical JSON naming the chunks (group, key hex) a live writer still
    means to name in a manifest; sorted, each once."""
    items = sorted(set(chunks))
    body = {
        "chunks": [[g, k] for g, k in items],
        "format": PENDING_FORMAT_VERSION,
        "kind": PENDING_KIND,
    }
    _check_pending_body(body)
    return canonical_json(body)


def decode_pending_record(data: bytes | bytearray | memoryview) -> list[tuple[int, str]]:
    value, _ = _parse_versioned(
        data, MAX_PENDING_BYTES, "pending record", (PENDING_FORMAT_VERSION,)
    )
    _check_pending_body(value)
    return [(g, k) for g, k in value["chunks"]]


def _check_pending_body(body: Mapping[str, Any]) -> None:
    if set(body) != {"chunks", "format", "kind"} or body["kind"] != PENDING_KIND:
        raise FormatError(Reason.BAD_FIELD, "pending record must be {chunks, format, kind}")
    chunks = body["chunks"]
    if not isinstance(chunks, list) or len(chunks) > MAX_PENDING_CHUNKS:
        raise FormatError(Reason.BAD_FIELD, "chunks must be a list")
    for c in chunks:
        if (
            not isinstance(c, list)
            or len(c) != 2
            or type(c[0]) is not int
            or not 0 <= c[0] <= MAX_GROUP_INDEX
            or not is_key_hex(c[1])
        ):
            raise FormatError(Reason.BAD_FIELD, "chunk must be [group, key hex]")


# --------------------------------------------------------------------------
# Names and paths
# --------------------------------------------------------------------------

_KEY_HEX = re.compile(r"(?:[0-9a-f]{2}){8,64}")
_PREFIX = re.compile(r"[a-z0-9]{1,32}")
_MODEL_BAD = re.compile(r"[^A-Za-z0-9.-]+")
_RANK_BASE = re.compile(
    r"(?P<prefix>[a-z0-9]{1,32})_(?P<model>[A-Za-z0-9.-]{1,64})"
    r"_(?P<ns>[0-9a-f]{16})_r(?P<rank>0|[1-9][0-9]{0,4})"
)
_MANIFEST_NAME = re.compile(
    r"b(?P<boundary>[1-9][0-9]{0,12})_(?P<tip>(?:[0-9a-f]{2}){8,64})\.json"
)
_TEMP = re.compile(
    r"(?P<final>.+)\.tmp\.(?P<pid>[1-9][0-9]{0,18})\.(?P<tid>[1-9][0-9]{0,18})"
)
MANIFEST_DIR = "manifests"
LOCK_FILE = ".lock"
PENDING_DIR = "pending"
_PENDING_NAME = re.compile(r"(?P<pid>[1-9][0-9]{0,18})\.(?P<tid>[1-9][0-9]{0,18})\.json")


def is_key_hex(value: Any) -> bool:
    return isinstance(value, str) and _KEY_HEX.fullmatch(value) is not None


def sanitize_model(model: str) -> str:
    """Model name as it appears in directory names: [A-Za-z0-9.-], <= 64."""
    out = _MODEL_BAD.sub("-", model)
    out = re.sub(r"-{2,}", "-", out).strip("-.")
    out = out[:MODEL_NAME_MAX].rstrip("-.")
    return out or "model"


def rank_base_name(prefix: str, model: str, ns_hash: bytes, rank: int) -> str:
    if not _PREFIX.fullmatch(prefix):
        raise FormatError(Reason.BAD_NAME, f"prefix {prefix!r}: [a-z0-9]{{1,32}}")
    if not 0 <= rank <= MAX_RANK:
        raise FormatError(Reason.BAD_NAME, f"rank {rank}")
    short = ns_hash.hex()[:NS_SHORT_HEX]
    return f"{prefix}_{sanitize_model(model)}_{short}_r{rank}"


@dataclass(frozen=True)
class RankBaseName:
    prefix: str
    model: str
    ns_short: str
    rank: int


def parse_rank_base_name(name: str) -> RankBaseName:
    m = _RANK_BASE.fullmatch(name)
    if (
        m is None
        or int(m["rank"]) > MAX_RANK
        or sanitize_model(m["model"]) != m["model"]
    ):
        raise FormatError(Reason.BAD_NAME, f"not a rank base name: {name!r}")
    return RankBaseName(m["prefix"], m["model"], m["ns"], int(m["rank"]))


def namespace_record_name(rank_base: str) -> str:
    return f"{rank_base}.json"


def chunk_rel_path(key_hex: str, group: int) -> str:
    """`<hhh>/<hh>_g<g>/<hash>.bin`: hhh = hex[0:3], hh = hex[3:5]."""
    if not is_key_hex(key_hex):
        raise FormatError(Reason.BAD_NAME, f"chunk key {key_hex[:80]!r}")
    if not 0 <= group <= MAX_GROUP_INDEX:
        raise FormatError(Reason.BAD_NAME, f"group {group}")
    return f"{key_hex[0:3]}/{key_hex[3:5]}_g{group}/{key_hex}.bin"


def parse_chunk_rel_path(rel: str) -> tuple[str, int]:
    """Inverse of chunk_rel_path; returns (key hex, group)."""
    m = re.fullmatch(
        r"(?P<a>[0-9a-f]{3})/(?P<b>[0-9a-f]{2})_g(?P<g>0|[1-9][0-9]{0,3})/"
        r"(?P<key>[0-9a-f]+)\.bin",
        rel,
    )
    if (
        m is None
        or not is_key_hex(m["key"])
        or m["key"][0:3] != m["a"]
        or m["key"][3:5] != m["b"]
        or int(m["g"]) > MAX_GROUP_INDEX
    ):
        raise FormatError(Reason.BAD_NAME, f"not a chunk path: {rel!r}")
    return m["key"], int(m["g"])


def manifest_file_name(boundary: int, tip: str) -> str:
    if not is_key_hex(tip) or not 0 < boundary <= MAX_TOKEN_INDEX:
        raise FormatError(Reason.BAD_NAME, f"manifest name for {boundary}, {tip!r}")
    return f"b{boundary}_{tip}.json"


def parse_manifest_file_name(name: str) -> tuple[int, str]:
    m = _MANIFEST_NAME.fullmatch(name)
    if m is None or int(m["boundary"]) > MAX_TOKEN_INDEX:
        raise FormatError(Reason.BAD_NAME, f"not a manifest name: {name!r}")
    return int(m["boundary"]), m["tip"]


def pending_file_name(pid: int, tid: int) -> str:
    """`<pid>.<tid>.json` in `pending/`: one writer's pending record."""
    if not (0 < pid < 10**19 and 0 < tid < 10**19):
        raise FormatError(Reason.BAD_NAME, f"pending name for {pid}, {tid}")
    return f"{pid}.{tid}.json"


def parse_pending_file_name(name: str) -> tuple[int, int]:
    m = _PENDING_NAME.fullmatch(name)
    if m is None:
        raise FormatError(Reason.BAD_NAME, f"not a pending record name: {name!r}")
    return int(m["pid"]), int(m["tid"])


def temp_name(final_name: str, pid: int, tid: int) -> str:
    """`<final>.tmp.<pid>.<tid>`; tid is threading.get_native_id()."""
    return f"{final_name}.tmp.{pid}.{tid}"


def parse_temp_name(name: str) -> tuple[str, int, int] | None:
    m = _TEMP.fullmatch(name)
    if m is None:
        return None
    return m["final"], int(m["pid"]), int(m["tid"])


@dataclass(frozen=True)
class StoreLayout:
    """Paths of one rank's store under the tier directory."""

    root: str  # GLM53_KV_OFFLOAD_DIR
    base_name: str  # <prefix>_<model>_<ns>_r<rank>

    @classmethod
    def create(
        cls,
        root: str,
        model: str,
        ns_hash: bytes,
        rank: int,
        prefix: str = DEFAULT_PREFIX,
    ) -> StoreLayout:
        return cls(root, rank_base_name(prefix, model, ns_hash, rank))

    @property
    def base(self) -> str:
        return os.path.join(self.root, self.base_name)

    @property
    def namespace_record(self) -> str:
        return os.path.join(self.root, namespace_record_name(self.base_name))

    @property
    def manifest_dir(self) -> str:
        return os.path.join(self.base, MANIFEST_DIR)

    @property
    def lock(self) -> str:
        return os.path.join(self.base, LOCK_FILE)

    @property
    def pending_dir(self) -> str:
        return os.path.join(self.base, PENDING_DIR)

    def chunk(self, key_hex: str, group: int) -> str:
        return os.path.join(self.base, chunk_rel_path(key_hex, group))

    def manifest(self, boundary: int, tip: str) -> str:
        return os.path.join(self.manifest_dir, manifest_file_name(boundary, tip))


# --------------------------------------------------------------------------
# Keep-K retention (leaf walk)
# --------------------------------------------------------------------------


def kept_manifests(chains: Mapping[str, Sequence[str]], keep: int) -> set[str]:
    """Names of the manifests keep-K retains; every other one is superseded.

    `chains` maps a manifest name to its chain. A manifest's ancestors are the
    manifests whose chain is a proper prefix of its own; a leaf has no
    descendants. Each leaf keeps itself and its keep-1 deepest ancestors, so a
    manifest survives while it is among the K most recent boundaries of ANY
    chain containing it. keep == 0 disables retention (everything is kept).
    """
    if not 0 <= keep <= MAX_KEEP_BOUNDARIES:
        raise FormatError(Reason.FIELD_OUT_OF_RANGE, f"keep {keep}")
    if keep == 0:
        return set(chains)
    # A trie over the chains: one node per distinct prefix, so ancestry costs
    # one dict lookup per chain element even for thousands of long chains.
    nodes: dict[tuple[int, str], int] = {}
    paths: dict[str, list[int]] = {}
    names_at: dict[int, list[str]] = {}
    for name in sorted(chains):
        node = 0
        path = []
        for key in chains[name]:
            node = nodes.setdefault((node, key), len(nodes) + 1)
            path.append(node)
        paths[name] = path
        names_at.setdefault(node, []).append(name)
    not_leaf = {
        node for path in paths.values() for node in path[:-1] if node in names_at
    }
    kept: set[str] = set()
    for name, path in paths.items():
        end = path[-1] if path else 0
        if end in not_leaf:
            continue
        kept.add(name)
        ancestors = [node for node in reversed(path[:-1]) if node in names_at]
        for node in ancestors[: keep - 1]:
            kept.update(names_at[node])
    return kept
