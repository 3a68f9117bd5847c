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

from .constants import CHECKSUM_CRC32, FORMAT_VERSION
from .format_error import FormatError, Reason
from .native import Header, SegmentEntry, call, fit
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
    # The fields checked as FORMAT.md 4 says (extra keys allowed).
    call("kvtier_namespace_hash", *_json(fenced), _FENCED_CHECK)
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
