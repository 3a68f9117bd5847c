# SPDX-License-Identifier: Apache-2.0
"""The store's records as plain data: a chunk header, a boundary manifest,
a namespace record. The native codec (codec.py) encodes and judges them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .constants import (
    CHECKSUM_CRC32,
    FIXED_HEADER_SIZE,
    FORMAT_VERSION,
    HEADER_CHECKSUM_SIZE,
    SEGMENT_ENTRY_SIZE,
)
from .names import manifest_file_name
from .segment import Segment

MANIFEST_KIND = "boundary_manifest"
GROUP_KIND_FULL = "full"
GROUP_KIND_STATE = "state"
PENDING_KIND = "pending_chunks"


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
    """A chunk header's length: fixed part, segment table, header CRC."""
    return FIXED_HEADER_SIZE + num_segments * SEGMENT_ENTRY_SIZE + HEADER_CHECKSUM_SIZE


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


@dataclass(frozen=True)
class NamespaceRecord:
    """`fenced` is hashed and compared exactly; `info` is diagnostics only."""

    fenced: Mapping[str, Any]
    info: Mapping[str, Any]

    @property
    def namespace_hash(self) -> bytes:
        from .codec import namespace_hash  # the codec builds these records

        return namespace_hash(self.fenced)
