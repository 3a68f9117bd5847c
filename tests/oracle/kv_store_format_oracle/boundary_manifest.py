# SPDX-License-Identifier: Apache-2.0
"""The boundary manifest: the chunks that restore a prefix up to one boundary."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .canonical_json import canonical_json, parse_json
from .checksum import crc32
from .constants import (
    CHECKSUM_CRC32,
    FORMAT_VERSION,
    MAX_CHAIN_LENGTH,
    MAX_GROUP_INDEX,
    MAX_MANIFEST_BYTES,
    MAX_MANIFEST_GROUPS,
    MAX_PAYLOAD_LENGTH,
    MAX_RANK,
    MAX_TOKEN_INDEX,
    READABLE_VERSIONS,
)
from .format_error import FormatError, Reason
from .json_fields import int_field, list_field, parse_versioned
from .mac import open_manifest, seal_manifest
from .names import is_key_hex, manifest_file_name

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


def encode_manifest(m: BoundaryManifest, key: bytes | None = None) -> bytes:
    """The canonical bytes; with a keyed store's ``key`` sealed (``mac``
    over the rest, checksum included: FORMAT.md 3.6)."""
    if m.format not in READABLE_VERSIONS:
        raise FormatError(Reason.UNSUPPORTED_VERSION, f"format version {m.format}")
    body = _manifest_body(m)
    _check_manifest_body(body)
    body["checksum"] = f"{crc32(canonical_json(body)):08x}"
    if key is not None:
        body = seal_manifest(key, body)
    return canonical_json(body)


def decode_manifest(
    data: bytes | bytearray | memoryview, key: bytes | None = None
) -> BoundaryManifest:
    """The manifest, every check of FORMAT.md 5 made; with ``key`` its MAC
    is checked first, on the strictly parsed object (mac_missing,
    mac_mismatch), and the rest judged as a plain manifest's."""
    if key is not None:
        value = parse_json(data, MAX_MANIFEST_BYTES)
        if not isinstance(value, dict):
            raise FormatError(Reason.BAD_FIELD, "manifest is not an object")
        data = canonical_json(open_manifest(key, value))
    value, version = parse_versioned(
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
    int_field(body, "rank", 0, MAX_RANK)
    int_field(body, "boundary", 1, MAX_TOKEN_INDEX)
    int_field(body, "chunk_tokens", 1, MAX_TOKEN_INDEX)
    chain = list_field(
        body, "chain", 1, MAX_CHAIN_LENGTH, "chain must be a non-empty list"
    )
    for key in chain:
        if not is_key_hex(key):
            raise FormatError(Reason.BAD_FIELD, f"chain key {str(key)[:80]!r}")
    groups = list_field(
        body, "groups", 1, MAX_MANIFEST_GROUPS, "groups must be a non-empty list"
    )
    for g in groups:
        if not isinstance(g, dict) or set(g) != {"entries", "group", "kind"}:
            raise FormatError(Reason.BAD_FIELD, "group must be {entries, group, kind}")
        int_field(g, "group", 0, MAX_GROUP_INDEX, "groups[].")
        if g["kind"] not in (GROUP_KIND_FULL, GROUP_KIND_STATE):
            raise FormatError(Reason.BAD_FIELD, f"group kind {g['kind']!r}")
        entries = list_field(
            g, "entries", 0, MAX_CHAIN_LENGTH, "entries must be a list"
        )
        for e in entries:
            # Inline, not is_row: one entry per chunk and group; is_row made a
            # 16k-entry manifest decode about 20% slower.
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
