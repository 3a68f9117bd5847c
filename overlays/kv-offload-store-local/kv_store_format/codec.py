# SPDX-License-Identifier: Apache-2.0
"""The format codec: the C++ ``format/`` library through the record and
header calls of libkvtier_store.so (native.py). JSON crosses as text
(``json.dumps`` of the plain data in records.py, canonical JSON back), a
chunk header as its fields. The verdicts are the C++ codec's, raised as
``FormatError`` with the same ``Reason``; a file's refusal to open is an
``OSError`` (FileNotFoundError, ELOOP for a link, EINVAL for a FIFO)."""

from __future__ import annotations

import ctypes
import json
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .constants import CHECKSUM_CRC32, FORMAT_VERSION, SALT_SIZE
from .format_error import FormatError, Reason
from .native import Header, SegmentEntry, call, fit, segment_table
from .records import (
    MANIFEST_KIND,
    BoundaryManifest,
    ChunkHeader,
    ManifestEntry,
    ManifestGroup,
    NamespaceRecord,
)
from .segment import DType, Segment, SegmentKind

_FENCED_CHECK = 1  # KVTIER_FENCED_CHECK
_HEADER_SEALED = 1  # KVTIER_HEADER_SEALED
_SEAL_V2 = 1  # KVTIER_SEAL_V2
_TABLE_ROOM = 256  # segment entries a header call gets room for at first
BytesLike = bytes | bytearray | memoryview  # what the calls take as input


def _in(data: BytesLike) -> tuple[bytes, int]:
    """A call's input bytes and their length."""
    raw = bytes(data)  # bytes as they are, no copy
    return raw, len(raw)


def _key(key: bytes | None) -> tuple[bytes | None, int]:
    return (None, 0) if key is None else (bytes(key), len(key))


def _string_keys(value: Any) -> None:
    # json.dumps would turn 1 into "1": the codec takes string keys only.
    if isinstance(value, Mapping):
        for k, v in value.items():
            if not isinstance(k, str):
                raise FormatError(Reason.BAD_JSON, "object keys must be strings")
            _string_keys(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _string_keys(v)


def _json(value: Any, check_keys: bool = True) -> tuple[bytes, int]:
    """Plain data as JSON text for a record call (floats, NaN and types JSON
    lacks are refused here or by the codec's strict parse: bad_json)."""
    if check_keys:
        try:
            _string_keys(value)
        except RecursionError:
            raise FormatError(Reason.BAD_JSON, "nesting too deep") from None
    try:
        text = json.dumps(value, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError) as e:
        raise FormatError(Reason.BAD_JSON, f"not JSON: {e}") from None
    return _in(text.encode("ascii"))


# -- JSON records ----------------------------------------------------------------


def canonical_json(value: Any) -> bytes:
    """Sorted keys, no whitespace, ASCII only; integers, no floats (4.1)."""
    return call("kvtier_canonical_json", *_json(value))


def encode_manifest(m: BoundaryManifest, key: bytes | None = None) -> bytes:
    """The canonical bytes; with a keyed store's ``key`` sealed (``mac``
    over the rest, checksum included: FORMAT.md 3.6)."""
    fields = {
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
    return call("kvtier_manifest_encode", *_json(fields, check_keys=False), *_key(key))


def decode_manifest(data: BytesLike, key: bytes | None = None) -> BoundaryManifest:
    """The manifest, every check of FORMAT.md 5 made; with ``key`` its MAC
    first (mac_missing, mac_mismatch), then the rest as a plain manifest."""
    v = json.loads(call("kvtier_manifest_decode", *_in(data), *_key(key)))
    return BoundaryManifest(
        namespace=v["namespace"],
        rank=v["rank"],
        boundary=v["boundary"],
        chunk_tokens=v["chunk_tokens"],
        chain=tuple(v["chain"]),
        groups=tuple(
            ManifestGroup(
                g["group"], g["kind"], tuple(ManifestEntry(*e) for e in g["entries"])
            )
            for g in v["groups"]
        ),
        format=v["format"],
    )


def check_fenced(fenced: Mapping[str, Any]) -> None:
    """The fenced part's fields, as FORMAT.md 4 says (extra keys allowed)."""
    if not isinstance(fenced, Mapping):
        raise FormatError(Reason.BAD_FIELD, "fenced must be an object")
    call("kvtier_namespace_hash", *_json(dict(fenced)), _FENCED_CHECK)


def namespace_hash(fenced: Mapping[str, Any]) -> bytes:
    """sha256 of the canonical JSON of the fenced part (32 bytes)."""
    return call("kvtier_namespace_hash", *_json(dict(fenced)), 0)


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
    key_scheme: Mapping[str, str] | None = None,
    layer_index: str | None = None,
    model_identity: Mapping[str, str] | None = None,
    format_version: int = FORMAT_VERSION,
) -> dict[str, Any]:
    """The fenced part, checked. ``key_scheme`` (how chunk keys are hashed),
    ``layer_index`` (what a header's layer_index counts) and
    ``model_identity`` (what decides the KV values beside the layout) are the
    vLLM writer's extra keys (FORMAT.md 4); a reader only compares them."""
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
    for name, strings in (
        ("key_scheme", key_scheme),
        ("model_identity", model_identity),
    ):
        if strings is None:
            continue
        if not all(
            isinstance(k, str) and isinstance(v, str) for k, v in strings.items()
        ):
            raise FormatError(
                Reason.BAD_FIELD, f"fenced.{name} must map strings to strings"
            )
        fenced[name] = dict(strings)
    if layer_index is not None:
        if not isinstance(layer_index, str) or not layer_index:
            raise FormatError(
                Reason.BAD_FIELD, "fenced.layer_index must be a non-empty string"
            )
        fenced["layer_index"] = layer_index
    check_fenced(fenced)
    return fenced


def encode_namespace_record(record: NamespaceRecord) -> bytes:
    for name, part in (("fenced", record.fenced), ("info", record.info)):
        if not isinstance(part, Mapping):
            raise FormatError(Reason.BAD_FIELD, f"{name} must be an object")
    return call(
        "kvtier_namespace_record_encode",
        *_json({"fenced": dict(record.fenced), "info": dict(record.info)}),
    )


def decode_namespace_record(data: BytesLike) -> NamespaceRecord:
    v = json.loads(call("kvtier_namespace_record_decode", *_in(data)))
    return NamespaceRecord(fenced=v["fenced"], info=v["info"])


def encode_pending_record(chunks: Iterable[tuple[int, str]]) -> bytes:
    """Canonical JSON naming the chunks (group, key hex) a live writer still
    means to name in a manifest; sorted, each once (FORMAT.md 9.1)."""
    return call(
        "kvtier_pending_record_encode",
        *_json([[g, k] for g, k in chunks], check_keys=False),
    )


def decode_pending_record(data: BytesLike) -> list[tuple[int, str]]:
    record = json.loads(call("kvtier_pending_record_decode", *_in(data)))
    return [(g, k) for g, k in record["chunks"]]


def kept_manifests(chains: Mapping[str, Sequence[str]], keep: int) -> set[str]:
    """Names of the manifests keep-K retains (FORMAT.md 6: each leaf and its
    keep-1 deepest ancestors); every other one is superseded. keep == 0
    keeps everything; keep > 1024 is field_out_of_range."""
    lines = []
    for name, chain in chains.items():
        line = "\t".join((name, *chain))
        # The call's fields are tab-separated lines: none may hold either.
        if line.count("\t") != len(chain) or "\n" in line:
            raise FormatError(Reason.BAD_NAME, f"a tab or newline in {name[:80]!r}")
        lines.append(line + "\n")
    text = _in("".join(lines).encode("utf-8", "surrogatepass"))
    kept = call("kvtier_kept_manifests", *text, fit(keep, 32))
    return set(kept.decode("utf-8", "surrogatepass").split("\n")[:-1])


def key_id(key: bytes) -> str:
    """What the namespace record fences (mac_key_id): never the key, a keyed
    hash of a constant, so two keys give two namespaces."""
    return call("kvtier_mac_key_id", *_key(key)).decode("ascii")


# -- chunk headers and whole chunks ----------------------------------------------

# Segment tables as the library handed them back -> segments (immutable, so
# shared): a store's chunks share a few tables. Bounded, cleared when full.
_TABLES: dict[bytes, tuple[Segment, ...]] = {}
_SCRATCH = threading.local()


def _header_call(name: str, *args: Any) -> ChunkHeader:
    """A header call, the table into this thread's scratch room (the GIL is
    off during the call) or, when longer, again with room for all of it."""
    if not hasattr(_SCRATCH, "segments"):
        _SCRATCH.segments = (SegmentEntry * _TABLE_ROOM)()
    segments, room = _SCRATCH.segments, _TABLE_ROOM
    while True:
        h = Header()
        call(name, *args, ctypes.byref(h), segments, room)
        if h.num_segments <= room:
            return _header(h, segments)
        room = h.num_segments
        segments = (SegmentEntry * room)()


def _segment(e: SegmentEntry) -> Segment:
    kind, dtype = SegmentKind(e.kind), DType(e.dtype)
    shape, stride = tuple(e.shape[: e.ndim]), tuple(e.stride[: e.ndim])
    return Segment(e.layer, kind, dtype, e.offset, e.length, shape, stride, e.part)


def _header(h: Header, segments: ctypes.Array) -> ChunkHeader:
    n = h.num_segments
    raw = ctypes.string_at(segments, n * ctypes.sizeof(SegmentEntry))
    table = _TABLES.get(raw)
    if table is None:
        table = tuple(_segment(e) for e in segments[:n])
        if len(_TABLES) >= 256:
            _TABLES.clear()
        _TABLES[raw] = table
    return ChunkHeader(
        namespace_hash=bytes(h.namespace_hash),
        group=h.group,
        key_hash=bytes(h.key_hash[: h.key_hash_length]),
        boundary=h.boundary,
        segments=table,
        payload_length=h.payload_length,
        payload_checksum=h.payload_checksum,
        checksum_algorithm=h.checksum_algorithm,
        format_version=h.format_version,
    )


def read_chunk_header(path: str, key: bytes | None = None) -> ChunkHeader:
    """The header of a chunk file, its size checked (not the payload); never
    through a link, never a FIFO. With a keyed store's ``key`` the file must
    be sealed and its header is read as the plain one it seals; the MAC
    needs the payload: the restore's read checks it."""
    flags = 0 if key is None else _HEADER_SEALED
    return _header_call("kvtier_read_chunk_header", os.fsencode(path), flags)


def decode_header(data: BytesLike) -> ChunkHeader:
    """The header at the start of a chunk file's bytes (3.5 steps 1-13)."""
    return _header_call("kvtier_parse_chunk_header", *_in(data))


def encode_header(header: ChunkHeader) -> bytes:
    """A header's bytes; raises FormatError if they would not parse back."""
    if len(header.namespace_hash) != 32:
        raise FormatError(Reason.BAD_FIELD, "namespace hash must be 32 bytes")
    if not 0 <= header.payload_checksum <= 0xFFFFFFFF:
        raise FormatError(Reason.FIELD_OUT_OF_RANGE, "payload checksum")
    key = bytes(header.key_hash)
    h = Header(
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
    table = segment_table(header.segments)
    return call("kvtier_encode_chunk_header", ctypes.byref(h), table)


def encode_chunk(header: ChunkHeader, payload: BytesLike) -> bytes:
    """Header + payload in one buffer (tests and small writers); ``header`` is
    make_header's for this payload."""
    return encode_header(header) + bytes(payload)


def verify_chunk(data: BytesLike) -> ChunkHeader:
    """Every check of FORMAT.md 3.5 on a whole chunk file held in memory."""
    return _header_call("kvtier_verify_chunk", *_in(data), None, 0, 0)


def verify_sealed_chunk(key: bytes, data: BytesLike, *, rank: int) -> ChunkHeader:
    """A keyed chunk of rank ``rank``'s store held in memory: the MAC first,
    then every check of ``verify_chunk`` on the plain chunk it seals."""
    return _header_call("kvtier_verify_chunk", *_in(data), *_key(key), fit(rank, 32))


def verify_chunk_file(
    path: str,
    block_size: int = 8 << 20,
    key: bytes | None = None,
    rank: int | None = None,
) -> ChunkHeader:
    """Header, size and payload checksum of a chunk file, read in blocks
    (a keyed one whole, its MAC checked first: ``rank`` is then the rank of
    the store it lies in, which the v3 seal binds)."""
    if key is not None and rank is None:
        raise ValueError("a keyed chunk's MAC binds its rank: pass rank=")
    return _header_call(
        "kvtier_verify_chunk_file",
        os.fsencode(path),
        fit(block_size, 64),
        *_key(key),
        fit(rank or 0, 32),
    )


def open_chunk(key: bytes, data: BytesLike, *, rank: int) -> bytes:
    """The plain chunk of a keyed file of rank ``rank``'s store, the MAC
    checked before any byte is parsed (mac_missing, truncated, mac_mismatch)."""
    return call("kvtier_open_chunk", *_in(data), *_key(key), fit(rank, 32))


def seal_chunk(
    key: bytes, chunk: BytesLike, *, rank: int, salt: bytes | None = None
) -> bytes:
    """The plain chunk as rank ``rank``'s keyed file, v3 seal (``salt``
    random unless given: vectors fix it)."""
    if salt is not None and len(salt) != SALT_SIZE:
        raise ValueError(f"salt of {len(salt)} bytes, needs {SALT_SIZE}")
    salt = None if salt is None else bytes(salt)
    return call("kvtier_seal_chunk", *_in(chunk), *_key(key), fit(rank, 32), salt, 0)


def seal_chunk_v2(key: bytes, chunk: BytesLike) -> bytes:
    """The v2 seal (HMAC-SHA256, no rank) stores written before v3 hold:
    for tests and vectors, never written by the tier."""
    return call("kvtier_seal_chunk", *_in(chunk), *_key(key), 0, None, _SEAL_V2)
