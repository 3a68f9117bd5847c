# SPDX-License-Identifier: Apache-2.0
"""The chunk header: encode it, and decode and check it from a file's first bytes."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

from .checksum import crc32
from .constants import (
    CHECKSUM_CRC32,
    FIXED_HEADER_SIZE,
    FORMAT_VERSION,
    HEADER_CHECKSUM_SIZE,
    MAGIC,
    MAX_GROUP_INDEX,
    MAX_HEADER_LENGTH,
    MAX_KEY_HASH_BYTES,
    MAX_LAYER_INDEX,
    MAX_NDIM,
    MAX_PART,
    MAX_PAYLOAD_LENGTH,
    MAX_SEGMENTS,
    MAX_TOKEN_INDEX,
    MIN_HEADER_LENGTH,
    MIN_KEY_HASH_BYTES,
    READABLE_VERSIONS,
    SEGMENT_ENTRY_SIZE,
)
from .format_error import FormatError, Reason
from .segment import Segment, check_segment_table, decode_segment, encode_segment

# The fixed part of the header (little-endian), see docs/FORMAT.md "Chunk header".
_FIXED = struct.Struct("<8sHHIBBHIQQII32s64s")
assert _FIXED.size == FIXED_HEADER_SIZE
# header_length, after magic, format_version and flags.
_HEADER_LENGTH = struct.Struct("<I")
_HEADER_LENGTH_AT = struct.calcsize("<8sHH")


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
    parts.extend(encode_segment(seg) for seg in header.segments)
    body = b"".join(parts)
    return body + struct.pack("<I", crc32(body))


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


def declared_header_length(data: bytes | bytearray | memoryview) -> int | None:
    """header_length as a file's first bytes declare it, unchecked (decode_header
    checks it); None with fewer than 16 bytes. Readers size the rest of their
    header read with it, after bounding it by MAX_HEADER_LENGTH."""
    if len(data) < _HEADER_LENGTH_AT + _HEADER_LENGTH.size:
        return None
    (length,) = _HEADER_LENGTH.unpack_from(data, _HEADER_LENGTH_AT)
    return length


# Segment tables decode_header checked: (table bytes, version, payload length)
# -> segments (immutable, so shared); bounded, cleared when full.
_DECODED_TABLES: dict[tuple[bytes, int, int], tuple[Segment, ...]] = {}
_MAX_DECODED_TABLES = 256


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
    # The header checksum matched: the table's bytes are the writer's, and a
    # store's chunks share a few tables, so each is decoded and checked once.
    table = (
        bytes(buf[FIXED_HEADER_SIZE : FIXED_HEADER_SIZE + nseg * SEGMENT_ENTRY_SIZE]),
        version,
        payload_length,
    )
    segments = _DECODED_TABLES.get(table)
    if segments is None:
        segments = tuple(
            decode_segment(buf, FIXED_HEADER_SIZE + i * SEGMENT_ENTRY_SIZE, i, version)
            for i in range(nseg)
        )
        check_segment_table(segments, payload_length)
        if len(_DECODED_TABLES) >= _MAX_DECODED_TABLES:
            _DECODED_TABLES.clear()
        _DECODED_TABLES[table] = segments
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
    check_segment_table(header.segments, header.payload_length)
