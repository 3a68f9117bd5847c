"""Chunk and name calls of the store library that only the tests, the
benchmarks and the GPU suite's probe make, never the overlays: a chunk's
header and bytes built, sealed, opened and judged in memory or in a file,
and the names only a test parses. The overlays' binding
(overlays/kv-offload-store-local/kv_store_format/) does not carry them.

``ChunkCalls(fmt)`` binds them to one loaded copy of that package (the
overlays' folder, a patched tree's, a test's own load under another name),
so a header it returns is that copy's ``ChunkHeader``; for any other name it
answers the package's, so it can stand where a test passed the package::

    fmt = ChunkCalls(kv_store_format)
    header = fmt.verify_chunk(fmt.encode_chunk(fmt.make_header(...), payload))

What it takes from the package (native.call, native.fit, native.Header,
native.segment_table, codec._header_call, the constants and records) older
revisions' packages have too: the GPU suite's probe (engine/probe.py) binds
it to the patched tree it runs, which an older revision may have laid out.
"""

from __future__ import annotations

import ctypes
import json
import os
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

BytesLike = bytes | bytearray | memoryview
_SEAL_V2 = 1  # KVTIER_SEAL_V2
_NAME_RANK_BASE, _NAME_CHUNK = 2, 3  # KVTIER_NAME_*: what kvtier_parse_name reads


@dataclass(frozen=True)
class RankBaseName:
    prefix: str
    model: str
    ns_short: str
    rank: int


def crc32(data: BytesLike, value: int = 0) -> int:
    """CRC-32 (algorithm id 1). Pass the previous value to continue a stream."""
    return zlib.crc32(data, value) & 0xFFFFFFFF


def _in(data: BytesLike) -> tuple[bytes, int]:
    raw = bytes(data)
    return raw, len(raw)


def _key(key: bytes | None) -> tuple[bytes | None, int]:
    return (None, 0) if key is None else (bytes(key), len(key))


class ChunkCalls:
    """The calls below on one loaded kv_store_format (``fmt``), and every
    name of that package besides."""

    def __init__(self, fmt: ModuleType):
        self.fmt = fmt

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fmt, name)

    crc32 = staticmethod(crc32)  # fmt.crc32, as the oracle's

    def _call(self, name: str, *args: Any) -> bytes:
        return self.fmt.native.call(name, *args)

    def _fit(self, value: int, bits: int) -> int:
        return self.fmt.native.fit(value, bits)

    def _header_call(self, name: str, *args: Any) -> Any:
        return self.fmt.codec._header_call(name, *args)

    # -- chunk headers and whole chunks ------------------------------------------

    def header_length_for(self, num_segments: int) -> int:
        """A chunk header's length: fixed part, segment table, header CRC."""
        return self.fmt.records.header_length_for(num_segments)

    def make_header(
        self,
        namespace_hash: bytes,
        group: int,
        key_hash: bytes,
        boundary: int,
        segments: Sequence[Any],
        payload: BytesLike,
        format_version: int | None = None,
    ) -> Any:
        """The header of ``payload`` (its length and CRC-32)."""
        if format_version is None:
            format_version = self.fmt.FORMAT_VERSION
        return self.fmt.ChunkHeader(
            namespace_hash=bytes(namespace_hash),
            group=group,
            key_hash=bytes(key_hash),
            boundary=boundary,
            segments=tuple(segments),
            payload_length=len(memoryview(payload).cast("B")),
            payload_checksum=crc32(payload),
            format_version=format_version,
        )

    def encode_header(self, header: Any) -> bytes:
        """A header's bytes; raises FormatError if they would not parse back."""
        fmt, fit = self.fmt, self._fit
        if len(header.namespace_hash) != 32:
            raise fmt.FormatError(
                fmt.Reason.BAD_FIELD, "namespace hash must be 32 bytes"
            )
        if not 0 <= header.payload_checksum <= 0xFFFFFFFF:
            raise fmt.FormatError(fmt.Reason.FIELD_OUT_OF_RANGE, "payload checksum")
        key = bytes(header.key_hash)
        h = fmt.native.Header(
            format_version=fit(header.format_version, 16),
            checksum_algorithm=fit(header.checksum_algorithm, 8),
            key_hash_length=fit(len(key), 8),
            group=fit(header.group, 32),
            boundary=fit(header.boundary, 64),
            payload_length=fit(header.payload_length, 64),
            payload_checksum=header.payload_checksum,
            num_segments=fit(len(header.segments), 32),
        )
        ctypes.memmove(h.namespace_hash, bytes(header.namespace_hash), 32)
        ctypes.memmove(h.key_hash, key, min(len(key), 64))
        table = fmt.native.segment_table(header.segments)
        return self._call("kvtier_encode_chunk_header", ctypes.byref(h), table)

    def encode_chunk(self, header: Any, payload: BytesLike) -> bytes:
        """Header + payload in one buffer; ``header`` is make_header's for
        this payload."""
        return self.encode_header(header) + bytes(payload)

    def decode_header(self, data: BytesLike) -> Any:
        """The header at the start of a chunk file's bytes (3.5 steps 1-13)."""
        return self._header_call("kvtier_parse_chunk_header", *_in(data))

    def verify_chunk(self, data: BytesLike) -> Any:
        """Every check of FORMAT.md 3.5 on a whole chunk file held in memory."""
        return self._header_call("kvtier_verify_chunk", *_in(data), None, 0, 0)

    def verify_sealed_chunk(self, key: bytes, data: BytesLike, *, rank: int) -> Any:
        """A keyed chunk of rank ``rank``'s store held in memory: the MAC
        first, then every check of ``verify_chunk`` on the plain chunk it seals."""
        rank = self._fit(rank, 32)
        return self._header_call("kvtier_verify_chunk", *_in(data), *_key(key), rank)

    def verify_chunk_file(
        self,
        path: str,
        block_size: int = 8 << 20,
        key: bytes | None = None,
        rank: int | None = None,
    ) -> Any:
        """Header, size and payload checksum of a chunk file, read in blocks
        (a keyed one whole, its MAC checked first: ``rank`` is then the rank
        of the store it lies in, which the v3 seal binds)."""
        if key is not None and rank is None:
            raise ValueError("a keyed chunk's MAC binds its rank: pass rank=")
        return self._header_call(
            "kvtier_verify_chunk_file",
            os.fsencode(path),
            self._fit(block_size, 64),
            *_key(key),
            self._fit(rank or 0, 32),
        )

    # -- keyed chunks (FORMAT.md 3.6) ---------------------------------------------

    def open_chunk(self, key: bytes, data: BytesLike, *, rank: int) -> bytes:
        """The plain chunk of a keyed file of rank ``rank``'s store, the MAC
        checked before any byte is parsed (mac_missing, truncated, mac_mismatch)."""
        rank = self._fit(rank, 32)
        return self._call("kvtier_open_chunk", *_in(data), *_key(key), rank)

    def seal_chunk(
        self, key: bytes, chunk: BytesLike, *, rank: int, salt: bytes | None = None
    ) -> bytes:
        """The plain chunk as rank ``rank``'s keyed file, v3 seal (``salt``
        random unless given: vectors fix it)."""
        size = self.fmt.constants.SALT_SIZE
        if salt is not None and len(salt) != size:
            raise ValueError(f"salt of {len(salt)} bytes, needs {size}")
        salt = None if salt is None else bytes(salt)
        rank = self._fit(rank, 32)
        return self._call("kvtier_seal_chunk", *_in(chunk), *_key(key), rank, salt, 0)

    def seal_chunk_v2(self, key: bytes, chunk: BytesLike) -> bytes:
        """The v2 seal (HMAC-SHA256, no rank) stores written before v3 hold."""
        args = (*_in(chunk), *_key(key), 0, None, _SEAL_V2)
        return self._call("kvtier_seal_chunk", *args)

    # -- records and names ----------------------------------------------------------

    def decode_pending_record(self, data: BytesLike) -> list[tuple[int, str]]:
        """The chunks (group, key hex) a pending record names (FORMAT.md 9.1)."""
        text = self._call("kvtier_pending_record_decode", *_in(data))
        return [(g, k) for g, k in json.loads(text)["chunks"]]

    # The name calls go through the package's own helpers (names.py).
    def sanitize_model(self, model: str) -> str:
        """Model name as it appears in directory names: [A-Za-z0-9.-], <= 64."""
        names = self.fmt.names
        return names._name("kvtier_sanitize_model", *names._raw(model))

    def parse_rank_base_name(self, name: str) -> RankBaseName:
        fields = self.fmt.names._parse(_NAME_RANK_BASE, name, str, str, str, int)
        return RankBaseName(*fields)

    def parse_chunk_rel_path(self, rel: str) -> tuple[str, int]:
        """Inverse of chunk_rel_path; returns (key hex, group)."""
        return self.fmt.names._parse(_NAME_CHUNK, rel, str, int)
