#!/usr/bin/env python3
"""Writes the shared format test vectors (v1 and v2) with the pure-Python codec
(the oracle, tests/oracle/kv_store_format_oracle).

Deterministic: the same codec gives the same bytes, so `--check` (used by the
test suite) regenerates everything in memory and fails if any committed file
differs. Run without arguments to rewrite tests/vectors/ after a deliberate
format change (and update docs/FORMAT.md and the C++ codec with it).

Every vector's expected verdict is asserted here against the oracle and
recorded in index.json; the C++ suite (and, through it, the shipped
kv_store_format: tests/python/store/test_format_vectors.py) must agree.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import random
import struct
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO / "tests" / "oracle"))

import kv_store_format_oracle as f  # noqa: E402 (found through the path above)

OK = "ok"


def h(text: str, n: int = 32) -> bytes:
    return hashlib.sha256(text.encode()).digest()[:n]


def pattern(n: int, seed: int) -> bytes:
    return bytes((i * 7 + seed * 13 + 3) & 0xFF for i in range(n))


# ---------------------------------------------------------------------------
# Building blocks
# ---------------------------------------------------------------------------

FENCED = f.make_fenced(
    model="zai-org/GLM-5.3-FP8",
    vllm_version="0.33.0",
    build_id="0123abcd",
    tp_size=2,
    kv_dtype="auto",
    hash_algorithm="sha256_cbor",
    num_speculative_tokens=0,
    page_sizes={0: 160, 2: 44, 3: 44},
    state_abi={
        "kind": "kda",
        "conv": {"dtype": "bfloat16", "shape": [2, 3]},
        "temporal": {"dtype": "float32", "shape": [2, 2, 2]},
    },
    format_version=1,
)
NS = f.namespace_hash(FENCED)
# The same store written as v2 (a new namespace hash: new directories).
FENCED_V2 = {**FENCED, "format_version": 2}
NS_V2 = f.namespace_hash(FENCED_V2)


def seg_spec(seg: f.Segment) -> dict[str, Any]:
    return {
        "layer": seg.layer,
        "kind": seg.kind.name.lower(),
        "dtype": seg.dtype.name.lower(),
        "offset": seg.offset,
        "length": seg.length,
        "shape": list(seg.shape),
        "stride": list(seg.stride),
        "part": seg.part,
    }


def chunk_spec(header: f.ChunkHeader, payload: bytes) -> dict[str, Any]:
    return {
        "format_version": header.format_version,
        "namespace_hash": header.namespace_hash.hex(),
        "group": header.group,
        "key_hash": header.key_hash.hex(),
        "boundary": header.boundary,
        "segments": [seg_spec(s) for s in header.segments],
        "payload": payload.hex(),
    }


KV_SEGMENTS = f.make_segments(
    [
        (0, f.SegmentKind.KV, f.DType.UINT8, (64,), (1,)),
        (1, f.SegmentKind.KV, f.DType.BFLOAT16, (4, 12), (16, 1)),
    ]
)
STATE_SEGMENTS = f.make_segments(
    [
        (3, f.SegmentKind.CONV, f.DType.BFLOAT16, (2, 3), (3, 1)),
        (3, f.SegmentKind.TEMPORAL, f.DType.FLOAT32, (2, 2, 2), (4, 2, 1)),
    ]
)


def v1(header: f.ChunkHeader) -> f.ChunkHeader:
    return dataclasses.replace(header, format_version=1)


# A KDA-style layer in v2: one conv segment per conv part (q, k, v), each with
# its own dtype, shape and strides, then the temporal state.
KDA_SEGMENTS = f.make_segments(
    [
        (12, f.SegmentKind.CONV, f.DType.BFLOAT16, (2, 3), (3, 1), 0),
        (12, f.SegmentKind.CONV, f.DType.BFLOAT16, (2, 3), (3, 1), 1),
        (12, f.SegmentKind.CONV, f.DType.FLOAT32, (3, 1), (1, 1), 2),
        (12, f.SegmentKind.TEMPORAL, f.DType.FLOAT32, (2, 2, 2), (4, 2, 1), 0),
    ]
)


def valid_chunks() -> dict[str, tuple[f.ChunkHeader, bytes, str]]:
    """v1 vectors (an old writer's files, still readable) and v2 ones."""
    out = {}
    payload = pattern(160, 1)
    out["kv_two_layers"] = (
        v1(f.make_header(NS, 0, h("chunk-a"), 16, KV_SEGMENTS, payload)),
        payload,
        "full-attention group 0, two kv layers, sha256-sized key",
    )
    payload = pattern(44, 2)
    out["state_conv_temporal"] = (
        v1(f.make_header(NS, 2, h("chunk-c"), 48, STATE_SEGMENTS, payload)),
        payload,
        "state group 2: one layer split into conv and temporal segments",
    )
    payload = pattern(40, 3)
    opaque = (f.Segment(7, f.SegmentKind.KV, f.DType.UINT8, 0, 40),)
    out["opaque_key16"] = (
        v1(f.make_header(NS, 1023, h("xxh", 16), 1 << 40, opaque, payload)),
        payload,
        "ndim 0 opaque segment, 16-byte key, max group and boundary",
    )
    specs = [
        (layer, f.SegmentKind.KV, f.DType.FLOAT16, (3,), (1,)) for layer in range(40)
    ]
    payload = pattern(240, 4)
    out["forty_layers_key64"] = (
        v1(
            f.make_header(
                NS, 5, h("k64", 32) + h("k64b", 32), 7, f.make_segments(specs), payload
            )
        ),
        payload,
        "40 segments, 64-byte key",
    )
    payload = pattern(160, 5)
    out["v2_kv_two_layers"] = (
        f.make_header(NS_V2, 0, h("chunk-a"), 16, KV_SEGMENTS, payload),
        payload,
        "v2: full-attention group 0, two kv layers (every part 0)",
    )
    payload = pattern(68, 6)
    out["v2_kda_conv_parts"] = (
        f.make_header(NS_V2, 2, h("chunk-c"), 48, KDA_SEGMENTS, payload),
        payload,
        "v2: KDA-style layer 12, conv parts 0, 1, 2 (bf16, bf16, f32), temporal",
    )
    payload = pattern(24, 7)
    parts = f.make_segments(
        [(4, f.SegmentKind.KV, f.DType.UINT8, (8,), (1,), p) for p in (0, 7, 255)]
    )
    out["v2_parts_sparse_255"] = (
        f.make_header(NS_V2, 1, h("chunk-p", 8), 3, parts, payload),
        payload,
        "v2: parts need only ascend (0, 7, 255 on one kv layer)",
    )
    return out


def raw_header(
    header: f.ChunkHeader,
    *,
    fixed: dict[str, int] | None = None,
    seg_fields: dict[int, dict[str, int]] | None = None,
    raw_segments: list[tuple[int, ...]] | None = None,
    key_field: bytes | None = None,
) -> bytearray:
    """The header's bytes with fields overridden, checksum recomputed.

    Bypasses the encoder's validation to make authentic headers with bad
    values (what a buggy writer could produce).
    """
    body = bytearray(f.encode_header(header)[:-4])
    names = [
        "magic", "version", "flags", "header_length", "algorithm", "key_len",
        "nseg", "group", "boundary", "payload_length", "payload_checksum",
        "reserved", "ns", "key",
    ]  # fmt: skip
    values = dict(zip(names, struct.unpack_from("<8sHHIBBHIQQII32s64s", body, 0)))
    seg_names = ["layer", "kind", "dtype", "ndim", "reserved", "offset", "length"]
    entries = raw_segments
    if entries is None:
        entries = [
            struct.unpack_from("<IBBBBQQ6Q6Q", body, 144 + 120 * i)
            for i in range(len(header.segments))
        ]
    entries = [list(e) for e in entries]
    for index, overrides in (seg_fields or {}).items():
        for name, value in overrides.items():
            if name.startswith(("shape", "stride")):
                kind, dim = name.split(":")
                entries[index][7 + (0 if kind == "shape" else 6) + int(dim)] = value
            else:
                entries[index][seg_names.index(name)] = value
    values["nseg"] = len(entries)
    values["header_length"] = f.header_length_for(len(entries))
    values.update(fixed or {})
    if key_field is not None:
        values["key"] = key_field
    del body[144:]
    struct.pack_into("<8sHHIBBHIQQII32s64s", body, 0, *values.values())
    for e in entries:
        body += struct.pack("<IBBBBQQ6Q6Q", *e)
    return body + struct.pack("<I", f.crc32(body))


def with_header(header_bytes: bytes, payload: bytes) -> bytes:
    return bytes(header_bytes) + payload


def flip(data: bytes, offset: int, bit: int = 0) -> bytes:
    out = bytearray(data)
    out[offset] ^= 1 << bit
    return bytes(out)


def chunk_verdict(data: bytes) -> str:
    try:
        f.verify_chunk(data)
    except f.FormatError as e:
        return e.reason.value
    return OK


# ---------------------------------------------------------------------------
# Vector sets
# ---------------------------------------------------------------------------


class Vectors:
    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.index: list[dict[str, Any]] = []

    def add(
        self,
        kind: str,
        name: str,
        data: bytes,
        verdict: str,
        note: str,
        check: Callable[[bytes], str],
        spec: dict[str, Any] | None = None,
        ext: str = "bin",
        extra: dict[str, Any] | None = None,
    ) -> None:
        got = check(data)
        if got != verdict:
            raise SystemExit(f"{kind}/{name}: expected {verdict}, codec says {got}")
        path = f"{kind}/{name}.{ext}"
        assert path not in self.files, path
        self.files[path] = data
        entry: dict[str, Any] = {
            "name": f"{kind}/{name}",
            "kind": kind,
            "file": path,
            "verdict": verdict,
            "note": note,
        }
        if spec is not None:
            entry["spec"] = spec
        entry.update(extra or {})
        self.index.append(entry)


def add_chunks(v: Vectors) -> None:
    chunks = valid_chunks()
    for name, (header, payload, note) in chunks.items():
        data = f.encode_header(header) + payload
        v.add(
            "chunk",
            f"valid_{name}",
            data,
            OK,
            note,
            chunk_verdict,
            chunk_spec(header, payload),
        )

    header, payload, _ = chunks["state_conv_temporal"]
    base = f.encode_header(header) + payload
    hl = header.header_length

    # Truncation at every region boundary (and one byte either side of some).
    cuts = {
        "empty": 0, "in_magic": 5, "after_magic": 8, "in_version": 9,
        "after_version": 10, "after_flags": 12, "after_header_length": 16,
        "after_algorithm": 17, "after_key_length": 18, "after_segment_count": 20,
        "after_group": 24, "after_boundary": 32, "after_payload_length": 40,
        "after_payload_checksum": 44, "after_reserved": 48,
        "after_namespace_hash": 80, "in_key_padding": 143, "after_fixed_header": 144,
        "in_segment_0": 200, "after_segment_0": 264, "after_segment_table": hl - 4,
        "in_header_checksum": hl - 1, "after_header": hl, "in_payload": hl + 1,
        "last_payload_byte_missing": len(base) - 1,
    }  # fmt: skip
    for name, cut in cuts.items():
        v.add("chunk", f"truncated_{name}", base[:cut], "truncated",
              f"state chunk cut at byte {cut}", chunk_verdict)  # fmt: skip

    # A single flipped bit in every field.
    seg0 = 144
    flips = [
        ("magic", 0, 0, "bad_magic"),
        ("format_version", 8, 0, "unsupported_version"),
        ("flags", 10, 0, "header_checksum_mismatch"),
        ("header_length_low", 12, 0, "bad_header_length"),
        ("header_length_high", 14, 4, "bad_header_length"),
        ("checksum_algorithm_to_0", 16, 0, "unsupported_checksum_algorithm"),
        ("checksum_algorithm_to_3", 16, 1, "unsupported_checksum_algorithm"),
        ("key_hash_length", 17, 0, "header_checksum_mismatch"),
        ("segment_count", 18, 0, "header_checksum_mismatch"),
        ("group_index", 20, 0, "header_checksum_mismatch"),
        ("boundary_token_index", 24, 3, "header_checksum_mismatch"),
        ("payload_length", 32, 0, "header_checksum_mismatch"),
        ("payload_checksum", 40, 0, "header_checksum_mismatch"),
        ("reserved", 44, 0, "header_checksum_mismatch"),
        ("namespace_hash", 48 + 17, 5, "header_checksum_mismatch"),
        ("key_hash", 80 + 3, 2, "header_checksum_mismatch"),
        ("key_padding", 80 + 40, 7, "header_checksum_mismatch"),
        ("segment_layer", seg0, 0, "header_checksum_mismatch"),
        ("segment_kind", seg0 + 4, 0, "header_checksum_mismatch"),
        ("segment_dtype", seg0 + 5, 0, "header_checksum_mismatch"),
        ("segment_ndim", seg0 + 6, 0, "header_checksum_mismatch"),
        ("segment_reserved", seg0 + 7, 0, "header_checksum_mismatch"),
        ("segment_offset", seg0 + 8, 0, "header_checksum_mismatch"),
        ("segment_length", seg0 + 16, 0, "header_checksum_mismatch"),
        ("segment_shape", seg0 + 24, 0, "header_checksum_mismatch"),
        ("segment_stride", seg0 + 72, 0, "header_checksum_mismatch"),
        ("second_segment_length", seg0 + 120 + 16, 1, "header_checksum_mismatch"),
        ("header_checksum", hl - 4, 0, "header_checksum_mismatch"),
        ("payload_first_byte", hl, 0, "payload_checksum_mismatch"),
        ("payload_last_byte", len(base) - 1, 7, "payload_checksum_mismatch"),
    ]
    for name, offset, bit, verdict in flips:
        v.add("chunk", f"flip_{name}", flip(base, offset, bit), verdict,
              f"state chunk, bit {bit} of byte {offset} flipped", chunk_verdict)  # fmt: skip

    # Authentic headers (valid checksum) with values a buggy writer could
    # produce; they reach the checks after the header checksum.
    def bad(
        name: str, verdict: str, note: str, hdr: bytes, body: bytes = payload
    ) -> None:
        v.add(
            "chunk",
            f"writer_{name}",
            with_header(hdr, body),
            verdict,
            note,
            chunk_verdict,
        )

    # fmt: off
    bad("version_0", "unsupported_version", "version 0, checksum valid",
        raw_header(header, fixed={"version": 0}))
    bad("version_3", "unsupported_version", "version 3, checksum valid",
        raw_header(header, fixed={"version": 3}))
    bad("algorithm_crc32c", "unsupported_checksum_algorithm",
        "algorithm 2 (CRC-32C) is reserved in v1", raw_header(header, fixed={"algorithm": 2}))
    bad("header_length_max", "bad_header_length", "header length 0xffffffff",
        raw_header(header, fixed={"header_length": 0xFFFFFFFF}))
    bad("header_length_no_segments", "bad_header_length", "header length 148 (0 segments)",
        raw_header(header, fixed={"header_length": 148}))
    bad("flags_set", "reserved_nonzero", "flags = 1", raw_header(header, fixed={"flags": 1}))
    bad("reserved_set", "reserved_nonzero", "reserved = 1",
        raw_header(header, fixed={"reserved": 1}))
    bad("key_length_7", "bad_key_hash", "key hash length 7",
        raw_header(header, fixed={"key_len": 7}))
    bad("key_length_65", "bad_key_hash", "key hash length 65",
        raw_header(header, fixed={"key_len": 65}))
    bad("key_padding_set", "bad_key_hash", "byte after the key is not 0",
        raw_header(header, key_field=header.key_hash + b"\x01" + bytes(31)))
    bad("group_1024", "field_out_of_range", "group index 1024",
        raw_header(header, fixed={"group": 1024}))
    bad("boundary_0", "field_out_of_range", "boundary token index 0",
        raw_header(header, fixed={"boundary": 0}))
    bad("boundary_too_big", "field_out_of_range", "boundary 2^40 + 1",
        raw_header(header, fixed={"boundary": (1 << 40) + 1}))
    bad("payload_length_0", "field_out_of_range", "payload length 0",
        raw_header(header, fixed={"payload_length": 0}))
    bad("payload_length_too_big", "field_out_of_range", "payload length 2^34 + 1",
        raw_header(header, fixed={"payload_length": (1 << 34) + 1}))
    bad("segment_count_mismatch", "bad_segment_table", "3 segments claimed, 2 present",
        raw_header(header, fixed={"nseg": 3}))
    bad("segment_reserved_set", "reserved_nonzero", "v1: segment 1 reserved byte",
        raw_header(header, seg_fields={1: {"reserved": 1}}))
    bad("segment_kind_0", "bad_segment_table", "segment kind 0",
        raw_header(header, seg_fields={0: {"kind": 0}}))
    bad("segment_kind_4", "bad_segment_table", "segment kind 4",
        raw_header(header, seg_fields={1: {"kind": 4}}))
    bad("segment_dtype_0", "bad_segment_table", "dtype 0",
        raw_header(header, seg_fields={0: {"dtype": 0}}))
    bad("segment_dtype_10", "bad_segment_table", "dtype 10",
        raw_header(header, seg_fields={0: {"dtype": 10}}))
    bad("segment_ndim_7", "bad_segment_table", "ndim 7",
        raw_header(header, seg_fields={0: {"ndim": 7}}))
    bad("segment_unused_shape", "bad_segment_table", "shape[5] set with ndim 2",
        raw_header(header, seg_fields={0: {"shape:5": 1}}))
    bad("segment_unused_stride", "bad_segment_table", "stride[3] set with ndim 3",
        raw_header(header, seg_fields={1: {"stride:3": 9}}))
    bad("segment_layer_too_big", "bad_segment_table", "layer 65536",
        raw_header(header, seg_fields={0: {"layer": 65536}, 1: {"layer": 65536}}))
    bad("segments_unsorted", "bad_segment_table", "temporal before conv",
        raw_header(header, seg_fields={0: {"kind": 3}, 1: {"kind": 2}}))
    bad("segments_duplicate", "bad_segment_table", "two conv segments for one layer",
        raw_header(header, seg_fields={1: {"kind": 2}}))
    bad("state_without_shape", "bad_segment_table", "conv segment with ndim 0",
        raw_header(header, seg_fields={0: {"ndim": 0, "shape:0": 0, "shape:1": 0,
                                           "stride:0": 0, "stride:1": 0}}))
    bad("segment_gap", "bad_segment_table", "second offset one past the first's end",
        raw_header(header, seg_fields={1: {"offset": 13}}))
    bad("segment_overlap", "bad_segment_table", "second offset inside the first",
        raw_header(header, seg_fields={1: {"offset": 11}}))
    bad("segment_length_0", "bad_segment_table", "zero-length opaque segment",
        raw_header(header, raw_segments=[(0, 1, 1, 0, 0, 0, 0) + (0,) * 12,
                                         (1, 1, 1, 0, 0, 0, 44) + (0,) * 12]))
    bad("segment_past_payload", "bad_segment_table", "segment longer than the payload",
        raw_header(header, raw_segments=[(0, 1, 1, 0, 0, 0, 45) + (0,) * 12]))
    bad("shape_mismatch", "bad_segment_table", "shape 2x4 bf16 but length 12",
        raw_header(header, seg_fields={0: {"shape:1": 4}}))
    bad("shape_overflow", "bad_segment_table", "shape product overflows 64 bits",
        raw_header(header, seg_fields={0: {"shape:0": 1 << 63, "shape:1": 1 << 62}}))
    bad("segments_short_of_payload", "bad_segment_table", "segments cover 44 of 45 bytes",
        raw_header(header, fixed={"payload_length": 45}), payload + b"\0")
    # fmt: on
    v.add(
        "chunk",
        "trailing_byte",
        base + b"\0",
        "trailing_bytes",
        "one byte after the payload",
        chunk_verdict,
    )
    add_v2_chunks(v, chunks)


def add_v2_chunks(v: Vectors, chunks: dict[str, Any]) -> None:
    """v2 only: the part byte, its order rule, and v1 still refusing it."""
    header, payload, _ = chunks["v2_kda_conv_parts"]
    base = f.encode_header(header) + payload
    hl = header.header_length

    def bad(name: str, verdict: str, note: str, hdr: bytes) -> None:
        v.add("chunk", name, with_header(hdr, payload), verdict, note, chunk_verdict)

    # fmt: off
    bad("writer_v2_parts_unsorted", "bad_segment_table", "v2: conv part 1 before part 0",
        raw_header(header, seg_fields={0: {"reserved": 1}, 1: {"reserved": 0}}))
    bad("writer_v2_parts_duplicate", "bad_segment_table", "v2: conv part 1 twice",
        raw_header(header, seg_fields={0: {"reserved": 1}}))
    bad("writer_v2_temporal_before_conv", "bad_segment_table",
        "v2: temporal part 0 sorts after every conv part",
        raw_header(header, raw_segments=[
            struct.unpack_from("<IBBBBQQ6Q6Q", f.encode_header(header), 144 + 120 * i)
            for i in (0, 1, 3, 2)]))
    bad("writer_v1_conv_parts", "reserved_nonzero",
        "the v2 KDA header relabelled version 1: v1 has no part, the byte is reserved",
        raw_header(header, fixed={"version": 1}))
    # fmt: on
    v.add(
        "chunk",
        "flip_v2_segment_part",
        flip(base, 144 + 120 + 7, 0),
        "header_checksum_mismatch",
        "v2 KDA chunk, bit 0 of segment 1's part flipped",
        chunk_verdict,
    )
    v.add("chunk", "flip_v2_format_version", flip(base, 8, 0), "unsupported_version",
          "v2 KDA chunk, version 2 -> 3", chunk_verdict)  # fmt: skip
    v.add("chunk", "truncated_v2_in_segment_3", base[: 144 + 3 * 120 + 10], "truncated",
          "v2 KDA chunk cut inside its last segment entry", chunk_verdict)  # fmt: skip
    v.add("chunk", "truncated_v2_in_payload", base[: hl + 30], "truncated",
          "v2 KDA chunk cut in its payload", chunk_verdict)  # fmt: skip


# --- manifests ---------------------------------------------------------------

CHAIN = [h(f"chain-{i}", 16).hex() for i in range(3)]


def base_manifest() -> f.BoundaryManifest:
    def e(key: str, n: int) -> f.ManifestEntry:
        return f.ManifestEntry(key, 100 + n, f.crc32(key.encode()) ^ n)

    return f.BoundaryManifest(
        namespace=NS.hex(),
        rank=1,
        boundary=48,
        chunk_tokens=16,
        chain=tuple(CHAIN),
        groups=(
            f.ManifestGroup(0, "full", tuple(e(k, i) for i, k in enumerate(CHAIN))),
            f.ManifestGroup(2, "state", (e(CHAIN[-1], 7),)),
            f.ManifestGroup(3, "state", (e(CHAIN[-1], 8),)),
        ),
        format=1,
    )


def manifest_spec(m: f.BoundaryManifest) -> dict[str, Any]:
    return {
        "namespace": m.namespace,
        "rank": m.rank,
        "boundary": m.boundary,
        "chunk_tokens": m.chunk_tokens,
        "chain": list(m.chain),
        "groups": [
            {
                "group": g.group,
                "kind": g.kind,
                "entries": [[e.key, e.length, e.checksum] for e in g.entries],
            }
            for g in m.groups
        ],
        "format": m.format,
        "file_name": m.file_name,
    }


def manifest_verdict(data: bytes) -> str:
    try:
        f.decode_manifest(data)
    except f.FormatError as e:
        return e.reason.value
    return OK


def sealed(body: Any) -> bytes:
    """Canonical JSON with a checksum that matches, whatever the body holds."""
    body = dict(body)
    body.pop("checksum", None)
    body["checksum"] = f"{f.crc32(f.canonical_json(body)):08x}"
    return f.canonical_json(body)


def add_manifests(v: Vectors) -> None:
    m = base_manifest()
    good = f.encode_manifest(m)
    v.add("manifest", "valid_three_chunks", good, OK,
          "full group 0 cumulative, state groups 2 and 3", manifest_verdict,
          manifest_spec(m), "json")  # fmt: skip
    one = f.BoundaryManifest(
        NS.hex(), 0, 3584, 3584, (CHAIN[0],),
        (f.ManifestGroup(4, "state", (f.ManifestEntry(CHAIN[0], 18743296, 0),)),),
        format=1,
    )  # fmt: skip
    v.add("manifest", "valid_single_state", f.encode_manifest(one), OK,
          "one chunk, one state group, checksum 0", manifest_verdict,
          manifest_spec(one), "json")  # fmt: skip
    m2 = dataclasses.replace(m, namespace=NS_V2.hex(), format=2)
    v.add("manifest", "valid_v2_three_chunks", f.encode_manifest(m2), OK,
          "format 2: the same structure as v1", manifest_verdict,
          manifest_spec(m2), "json")  # fmt: skip

    body = json.loads(good)

    def variant(name: str, verdict: str, note: str, data: bytes) -> None:
        v.add("manifest", name, data, verdict, note, manifest_verdict, ext="json")

    def edit(**changes: Any) -> dict[str, Any]:
        out = json.loads(good)
        for key, value in changes.items():
            if value is _DELETE:
                del out[key]
            else:
                out[key] = value
        return out

    text = good.decode()
    # fmt: off
    for cut in (0, 1, len(good) // 2, len(good) - 1):
        variant(f"truncated_at_{cut}", "bad_json", f"cut at byte {cut}", good[:cut])
    variant("duplicate_key", "bad_json", "rank twice",
            text.replace('"rank":1', '"rank":1,"rank":1').encode())
    variant("float_number", "bad_json", "chunk_tokens 16.0",
            text.replace('"chunk_tokens":16', '"chunk_tokens":16.0').encode())
    variant("nan", "bad_json", "NaN", text.replace('"rank":1', '"rank":NaN').encode())
    variant("byte_order_mark", "bad_json", "UTF-8 BOM first", b"\xef\xbb\xbf" + good)
    variant("invalid_utf8", "bad_json", "0xff inside a string",
            good.replace(b'"boundary_manifest"', b'"boundary_manifes\xff"'))
    variant("too_deep", "bad_json", "65 nested lists in an extra field",
            good[:-1] + b',"x":' + b"[" * 65 + b"]" * 65 + b"}")
    # FORMAT.md 4.1 counts arrays and objects only: the manifest object is
    # level 1, so 63 lists around a scalar reach 64 (parses; the extra field
    # is bad_field) and 64 lists reach 65.
    deep = sealed(edit(x=nested(63)))
    variant("nested_64", "bad_field", "64 levels: 63 lists around 1 in an extra field", deep)
    variant("nested_65", "bad_json", "65 levels: 64 lists around 1 in an extra field",
            one_list_more(deep, 63))
    variant("nul_then_junk", "bad_json", "a valid manifest, then a NUL byte and junk",
            good + b"\0junk")
    variant("not_object", "bad_field", "a list", b"[1,2,3]")
    variant("format_missing", "bad_field", "no format", sealed(edit(format=_DELETE)))
    variant("format_string", "bad_field", 'format "1"', sealed(edit(format="1")))
    variant("format_3", "unsupported_version", "format 3", sealed(edit(format=3)))
    variant("format_0", "unsupported_version", "format 0", sealed(edit(format=0)))
    variant("algorithm_missing", "bad_field", "no checksum_algorithm",
            sealed(edit(checksum_algorithm=_DELETE)))
    variant("algorithm_crc32c", "unsupported_checksum_algorithm", "algorithm 2",
            sealed(edit(checksum_algorithm=2)))
    variant("checksum_missing", "bad_field", "no checksum",
            f.canonical_json(edit(checksum=_DELETE)))
    variant("checksum_uppercase", "bad_field", "checksum in uppercase hex",
            f.canonical_json(edit(checksum=body["checksum"].upper().replace("0", "A")
                                  if body["checksum"].upper() == body["checksum"]
                                  else body["checksum"].upper())))
    variant("checksum_wrong", "manifest_checksum_mismatch", "checksum of another body",
            f.canonical_json(edit(checksum=f"{(int(body['checksum'], 16) ^ 1):08x}")))
    variant("unknown_field", "bad_field", "extra top-level key", sealed(edit(extra=1)))
    variant("rank_missing", "bad_field", "no rank", sealed(edit(rank=_DELETE)))
    variant("kind_wrong", "bad_field", "kind chunk", sealed(edit(kind="chunk")))
    variant("namespace_short", "bad_field", "namespace of 16 hex",
            sealed(edit(namespace=NS.hex()[:16])))
    variant("rank_negative", "bad_field", "rank -1", sealed(edit(rank=-1)))
    variant("rank_too_big", "bad_field", "rank 65536", sealed(edit(rank=65536)))
    variant("rank_bool", "bad_field", "rank true", sealed(edit(rank=True)))
    variant("boundary_0", "bad_field", "boundary 0", sealed(edit(boundary=0)))
    variant("chain_empty", "bad_field", "chain []", sealed(edit(chain=[])))
    variant("chain_dotdot", "bad_field", "a chain key with ../",
            sealed(edit(chain=["../../etc/passwd", *CHAIN[1:]])))
    variant("chain_uppercase", "bad_field", "chain key in uppercase hex",
            sealed(edit(chain=[CHAIN[0].upper(), *CHAIN[1:]])))
    groups = body["groups"]
    variant("group_kind_unknown", "bad_field", "group kind mamba",
            sealed(edit(groups=[{**groups[0], "kind": "mamba"}, *groups[1:]])))
    variant("group_extra_key", "bad_field", "group with an extra key",
            sealed(edit(groups=[{**groups[0], "x": 1}, *groups[1:]])))
    variant("entry_dotdot", "bad_field", "entry key ../../x",
            sealed(edit(groups=[*groups[:2], {**groups[2], "entries": [
                ["../../../../etc/shadow", 1, 1]]}])))
    variant("entry_short", "bad_field", "entry of two items",
            sealed(edit(groups=[*groups[:2], {**groups[2], "entries": [[CHAIN[-1], 1]]}])))
    variant("entry_length_0", "bad_field", "entry payload length 0",
            sealed(edit(groups=[*groups[:2], {**groups[2], "entries": [[CHAIN[-1], 0, 1]]}])))
    variant("entry_checksum_too_big", "bad_field", "entry checksum 2^32",
            sealed(edit(groups=[*groups[:2], {**groups[2], "entries": [
                [CHAIN[-1], 1, 1 << 32]]}])))
    variant("boundary_mismatch", "manifest_inconsistent", "boundary 47 for 3 x 16",
            sealed(edit(boundary=47)))
    variant("groups_unsorted", "manifest_inconsistent", "group 3 before group 2",
            sealed(edit(groups=[groups[0], groups[2], groups[1]])))
    variant("groups_duplicate", "manifest_inconsistent", "group 2 twice",
            sealed(edit(groups=[groups[0], groups[1], groups[1]])))
    variant("full_missing_chunk", "manifest_inconsistent", "full group lacks the tip",
            sealed(edit(groups=[{**groups[0], "entries": groups[0]["entries"][:2]},
                                *groups[1:]])))
    variant("full_out_of_order", "manifest_inconsistent", "full group entries swapped",
            sealed(edit(groups=[{**groups[0], "entries": [groups[0]["entries"][1],
                                                          groups[0]["entries"][0],
                                                          groups[0]["entries"][2]]},
                                *groups[1:]])))
    variant("state_not_tip", "manifest_inconsistent", "state entry is not the tip",
            sealed(edit(groups=[*groups[:2], {**groups[2], "entries": [
                [CHAIN[0], 1, 1]]}])))
    variant("state_two_entries", "manifest_inconsistent", "state group with 2 entries",
            sealed(edit(groups=[*groups[:2], {**groups[2], "entries": [
                [CHAIN[1], 1, 1], [CHAIN[2], 1, 1]]}])))
    # FORMAT.md 5.1: types, ranges and reader order the spec pins down.
    variant("entry_checksum_hex_string", "bad_field",
            "payload_checksum as a hex string: on disk it is a decimal integer",
            sealed(edit(groups=[*groups[:2], {**groups[2], "entries": [
                [CHAIN[-1], 1, "0000abcd"]]}])))
    variant("entry_length_bool", "bad_field", "payload length true: booleans are not integers",
            sealed(edit(groups=[*groups[:2], {**groups[2], "entries": [[CHAIN[-1], True, 1]]}])))
    variant("format_true", "bad_field", "format true: booleans are not integers",
            sealed(edit(format=True)))
    variant("boundary_over_2_40", "bad_field",
            "boundary 3 x 2^39 > 2^40, consistent with chunk_tokens 2^39",
            sealed(edit(boundary=3 << 39, chunk_tokens=1 << 39)))
    variant("boundary_2_40", OK, "boundary exactly 2^40 (3 chunks would not divide it; 1 does)",
            f.encode_manifest(f.BoundaryManifest(
                NS.hex(), 0, 1 << 40, 1 << 40, (CHAIN[0],),
                (f.ManifestGroup(4, "state", (f.ManifestEntry(CHAIN[0], 5, 0),)),),
                format=1)))
    variant("format_3_with_unknown_field", "unsupported_version",
            "the version is judged before any other field", sealed(edit(format=3, extra=1)))
    variant("chain_repeats_key", "manifest_inconsistent", "chain [k0, k0, k2]",
            sealed(edit(chain=[CHAIN[0], CHAIN[0], CHAIN[2]],
                        groups=[{**groups[0], "entries": [groups[0]["entries"][0],
                                                          groups[0]["entries"][0],
                                                          groups[0]["entries"][2]]},
                                *groups[1:]])))
    variant("non_canonical_whitespace", OK,
            "spaces after separators: the checksum is over the canonical form, "
            "so a reader accepts it (writers always write canonical bytes)",
            json.dumps(json.loads(good), sort_keys=True).encode())
    # fmt: on

    # A single flipped bit in every field's value (and in two key names): the
    # checksum catches all but the fields checked before it.
    positions = {
        "boundary": text.index('"boundary":') + len('"boundary":'),
        "chain": text.index('"chain":["') + len('"chain":["') + 5,
        "checksum": text.index('"checksum":"') + len('"checksum":"'),
        "checksum_algorithm": text.index('"checksum_algorithm":')
        + len('"checksum_algorithm":'),
        "chunk_tokens": text.index('"chunk_tokens":') + len('"chunk_tokens":'),
        "format": text.index('"format":') + len('"format":'),
        "group_index": text.index('"group":') + len('"group":'),
        "entry_key": text.index('"entries":[["') + len('"entries":[["') + 9,
        "entry_length": text.index('"entries":[["') + len('"entries":[["') + 32 + 2,
        "group_kind": text.index('"kind":"full"') + len('"kind":"'),
        "kind": text.index('"kind":"boundary_manifest"') + len('"kind":"'),
        "namespace": text.index('"namespace":"') + len('"namespace":"') + 30,
        "rank": text.index('"rank":') + len('"rank":'),
        "key_name_rank": text.index('"rank":') + 1,
        "key_name_format": text.index('"format":') + 1,
        "structure_colon": text.index('"rank":') + len('"rank"'),
    }
    for name, pos in positions.items():
        data = flip(good, pos, 0)
        variant(f"flip_{name}", manifest_verdict(data),
                f"bit 0 of byte {pos} ({chr(good[pos])!r}) flipped", data)  # fmt: skip


class _Delete:
    pass


_DELETE = _Delete()


# --- namespace records -------------------------------------------------------


def record_verdict(data: bytes) -> str:
    try:
        f.decode_namespace_record(data)
    except f.FormatError as e:
        return e.reason.value
    return OK


def record_spec(record: f.NamespaceRecord, rank: int) -> dict[str, Any]:
    return {
        "fenced": record.fenced,
        "info": record.info,
        "canonical_fenced": f.canonical_json(dict(record.fenced)).decode(),
        "namespace_hash": record.namespace_hash.hex(),
        "rank": rank,
        "rank_base_name": f.rank_base_name(
            f.DEFAULT_PREFIX, record.fenced["model"], record.namespace_hash, rank
        ),
    }


def add_records(v: Vectors) -> None:
    info = {"keep_boundaries": 2, "rank": 1, "rank_source": "tp_group"}
    rec = f.NamespaceRecord(FENCED, info)
    v.add("record", "valid_kda", f.encode_namespace_record(rec), OK,
          "hybrid model with a KDA state ABI", record_verdict, record_spec(rec, 1),
          "json")  # fmt: skip
    odd = f.make_fenced(
        model='Ünïcode/mödel \u2603 \U0001f600 "q" \\ \t\x01\x7f',
        vllm_version="0.33.0+cu129",
        build_id="",
        tp_size=1,
        kv_dtype="fp8_e4m3",
        hash_algorithm="xxhash",
        num_speculative_tokens=3,
        page_sizes={0: 1 << 34},
        state_abi={},
        format_version=1,
    )
    odd["extra_fenced_key"] = [
        None,
        True,
        False,
        -(1 << 63),
        (1 << 63) - 1,
        {"b": 1, "a": []},
    ]
    rec2 = f.NamespaceRecord(odd, {"note": "\u00e9\n", "nested": {"z": [1], "a": None}})
    v.add("record", "valid_escapes", f.encode_namespace_record(rec2), OK,
          "escapes, non-BMP text, an extra fenced key, int64 limits", record_verdict,
          record_spec(rec2, 0), "json")  # fmt: skip
    rec3 = f.NamespaceRecord(FENCED_V2, info)
    v.add("record", "valid_kda_v2", f.encode_namespace_record(rec3), OK,
          "valid_kda written as format v2 (another namespace hash)", record_verdict,
          record_spec(rec3, 1), "json")  # fmt: skip

    good = json.loads(f.encode_namespace_record(rec))

    def variant(name: str, verdict: str, note: str, data: bytes) -> None:
        v.add("record", name, data, verdict, note, record_verdict, ext="json")

    def fenced_with(**changes: Any) -> bytes:
        fenced = dict(good["fenced"])
        for key, value in changes.items():
            if value is _DELETE:
                del fenced[key]
            else:
                fenced[key] = value
        return f.canonical_json({"fenced": fenced, "info": good["info"]})

    raw = f.encode_namespace_record(rec)
    # fmt: off
    variant("truncated", "bad_json", "cut in half", raw[: len(raw) // 2])
    variant("duplicate_key", "bad_json", "info twice", raw[:-1] + b',"info":{}}')
    variant("float", "bad_json", "tp_size 2.0", raw.replace(b'"tp_size":2', b'"tp_size":2.0'))
    variant("int_too_big", "bad_json", "integer 2^63 in info",
            raw.replace(b'"keep_boundaries":2', b'"keep_boundaries":9223372036854775808'))
    variant("lone_surrogate", "bad_json", "\\ud800 in a string",
            raw.replace(b'"tp_group"', b'"\\ud800"'))
    variant("nul_then_junk", "bad_json", "a valid record, then a NUL byte and junk",
            raw + b"\0junk")
    # Levels count arrays and objects (FORMAT.md 4.1): the record is 1, info 2.
    # Valid, with a spec: both codecs must also encode 64 levels, byte for byte.
    rec64 = f.NamespaceRecord(FENCED, {**info, "deep": nested(62)})
    deep = f.encode_namespace_record(rec64)
    v.add("record", "nested_64", deep, OK, "64 levels: 62 lists around 1 in info",
          record_verdict, record_spec(rec64, 1), "json")  # fmt: skip
    variant("nested_65", "bad_json", "65 levels: 63 lists around 1 in info",
            one_list_more(deep, 62))
    variant("not_object", "bad_field", "a string", b'"fenced"')
    variant("info_missing", "bad_field", "only fenced",
            f.canonical_json({"fenced": good["fenced"]}))
    variant("extra_top_level", "bad_field", "a third key",
            f.canonical_json({**good, "x": 1}))
    variant("info_not_object", "bad_field", "info is a list",
            f.canonical_json({**good, "info": []}))
    variant("format_version_3", "unsupported_version", "fenced format_version 3",
            fenced_with(format_version=3))
    variant("format_version_0", "unsupported_version", "fenced format_version 0",
            fenced_with(format_version=0))
    variant("format_version_missing", "bad_field", "no format_version",
            fenced_with(format_version=_DELETE))
    variant("model_missing", "bad_field", "no model", fenced_with(model=_DELETE))
    variant("model_empty", "bad_field", "model empty", fenced_with(model=""))
    variant("build_id_too_long", "bad_field", "build_id of 257 bytes",
            fenced_with(build_id="x" * 257))
    variant("model_multibyte_too_long", "bad_field", "129 two-byte characters",
            fenced_with(model="\u00e9" * 129))
    variant("tp_size_0", "bad_field", "tp_size 0", fenced_with(tp_size=0))
    variant("tp_size_bool", "bad_field", "tp_size true: booleans are not integers",
            fenced_with(tp_size=True))
    variant("format_version_3_model_missing", "unsupported_version",
            "the version is judged before any other field",
            fenced_with(format_version=3, model=_DELETE))
    variant("spec_tokens_string", "bad_field", 'num_speculative_tokens "0"',
            fenced_with(num_speculative_tokens="0"))
    variant("page_sizes_unsorted", "bad_field", "groups 2 then 0",
            fenced_with(page_sizes=[[2, 44], [0, 160]]))
    variant("page_sizes_zero", "bad_field", "page size 0", fenced_with(page_sizes=[[0, 0]]))
    variant("page_sizes_empty", "bad_field", "no groups", fenced_with(page_sizes=[]))
    variant("state_abi_list", "bad_field", "state_abi []", fenced_with(state_abi=[]))
    # fmt: on

    # A single flipped bit in every field's value. A record has no checksum of
    # its own: a flip in `fenced` that still parses changes the namespace hash
    # (so the record no longer matches its directory name and a writer
    # disables itself); a flip in `info` changes nothing that is compared.
    # Entries that parse carry the hash both codecs must compute.
    text = raw.decode()
    original = rec.namespace_hash.hex()
    for field in sorted(good["fenced"]) + ["info.keep_boundaries", "info.rank_source"]:
        name = field.split(".")[-1]
        start = text.index(f'"{name}":') + len(f'"{name}":')
        pos = start + 1 if text[start] == '"' else start
        if text[start] in "[{":
            pos = start + 1 + (text[start + 1] in '[{"')
        data = flip(raw, pos, 0)
        got = record_verdict(data)
        extra = {}
        note = f"bit 0 of byte {pos} ({chr(raw[pos])!r}) flipped"
        if got == OK:
            flipped = f.decode_namespace_record(data).namespace_hash.hex()
            assert (flipped == original) == field.startswith("info."), field
            extra = {"namespace_hash": flipped}
            note += ", namespace hash " + (
                "unchanged" if flipped == original else "changes"
            )
        v.add("record", f"flip_{field.replace('.', '_')}", data, got, note,
              record_verdict, ext="json", extra=extra)  # fmt: skip


# --- names and retention ------------------------------------------------------


def nested(lists: int) -> Any:
    """`lists` arrays, one inside the other, around the integer 1."""
    value: Any = 1
    for _ in range(lists):
        value = [value]
    return value


def one_list_more(data: bytes, lists: int) -> bytes:
    """`data` with its run of `lists` nested lists around 1 one list deeper
    (past the limit, where the codec would refuse to encode it)."""
    run = b"[" * lists + b"1" + b"]" * lists
    assert data.count(run) == 1
    return data.replace(run, b"[" + run + b"]")


def add_pending(v: Vectors) -> None:
    """Pending records (FORMAT.md 9.1)."""

    def check(data: bytes) -> str:
        try:
            f.decode_pending_record(data)
        except f.FormatError as e:
            return e.reason.value
        return OK

    def variant(name: str, verdict: str, note: str, data: bytes) -> None:
        v.add("pending", name, data, verdict, note, check, ext="json")

    good = f.encode_pending_record([(0, CHAIN[1]), (2, CHAIN[2]), (0, CHAIN[0])])
    # fmt: off
    variant("valid_three", OK, "three chunks, sorted by (group, key)", good)
    variant("valid_empty", OK, "nothing pending", f.encode_pending_record([]))
    variant("format_2", "unsupported_version", "format 2",
            good.replace(b'"format":1', b'"format":2'))
    variant("kind_wrong", "bad_field", "kind pending",
            good.replace(b'"pending_chunks"', b'"pending"'))
    variant("group_too_big", "bad_field", "group 1024",
            f.canonical_json({"chunks": [[1024, CHAIN[0]]], "format": 1, "kind": "pending_chunks"}))
    variant("group_bool", "bad_field", "group true",
            f.canonical_json({"chunks": [[True, CHAIN[0]]], "format": 1, "kind": "pending_chunks"}))
    variant("key_dotdot", "bad_field", "key ../x",
            f.canonical_json({"chunks": [[0, "../x"]], "format": 1, "kind": "pending_chunks"}))
    variant("torn", "bad_json", "a record cut mid-write", good[: len(good) // 2])
    variant("nul_then_junk", "bad_json", "a valid record, then a NUL byte and junk",
            good + b"\0junk")
    variant("unsorted", "bad_field", "group 2 listed before group 0",
            f.canonical_json({"chunks": [[2, CHAIN[0]], [0, CHAIN[1]]], "format": 1,
                              "kind": "pending_chunks"}))
    variant("keys_unsorted", "bad_field", "one group, keys out of order",
            f.canonical_json({"chunks": [[0, max(CHAIN[:2])], [0, min(CHAIN[:2])]],
                              "format": 1, "kind": "pending_chunks"}))
    variant("repeated", "bad_field", "the same chunk twice",
            f.canonical_json({"chunks": [[0, CHAIN[0]], [0, CHAIN[0]]], "format": 1,
                              "kind": "pending_chunks"}))
    # fmt: on


def names_table() -> dict[str, Any]:
    key = h("chunk-a").hex()
    sanitize = [
        "zai-org/GLM-5.3",
        "  /x__y/ ",
        "...model...",
        "a/../b",
        "Ünïcode mödel",
        "",
        "////",
        "x" * 80,
        "y" * 63 + "-z",
        "m_1.5B-Instruct",
    ]
    parse_chunk = [
        f"{key[:3]}/{key[3:5]}_g2/{key}.bin",
        f"{key[:3]}/{key[3:5]}_g02/{key}.bin",
        f"{key[:3]}/{key[3:5]}_g1024/{key}.bin",
        f"{key[:3]}/{key[4:6]}_g2/{key}.bin",
        f"{key[:3]}/{key[3:5]}_g2/{key.upper()}.bin",
        f"{key[:3]}/{key[3:5]}_g2/{key}.bin.tmp.1.2",
        f"{key[:3]}/{key[3:5]}_g2/../{key}.bin",
        f"{key[:3]}/{key[3:5]}_g2/{key[:14]}.bin",
        f"{key[:3]}/{key[3:5]}_g2/{key}0.bin",
    ]
    rank_bases = [
        "glm53kv_zai-org-GLM-5.3_0123456789abcdef_r0",
        "glm53kv_zai-org-GLM-5.3_0123456789abcdef_r65535",
        "glm53kv_zai-org-GLM-5.3_0123456789abcdef_r65536",
        "glm53kv_zai-org-GLM-5.3_0123456789abcdef_r01",
        "glm53kv_zai-org-GLM-5.3_0123456789ABCDEF_r0",
        "GLM_zai-org-GLM-5.3_0123456789abcdef_r0",
        "glm53kv_-x_0123456789abcdef_r0",
        "glm53kv_a_b_0123456789abcdef_r0",
        "glm53kv_zai-org-GLM-5.3_0123456789abcdef_r0.json",
    ]
    manifest_names = [
        f"b48_{key}.json",
        f"b0_{key}.json",
        f"b048_{key}.json",
        f"b1099511627776_{key}.json",
        f"b1099511627777_{key}.json",
        f"b48_{key}.json.tmp.5.6",
        f"b48_{key[:10]}.json",
        "b48_.json",
    ]
    temps = [
        f"{key}.bin.tmp.1234.5678",
        "b48_x.json.tmp.1.1",
        "a.tmp.b.tmp.7.8",
        f"{key}.bin.tmp.0.5",
        f"{key}.bin.tmp.12.",
        ".tmp.1.2",
        f"{key}.bin",
        "x.tmp.1.12345678901234567890",
    ]

    def verdict(fn: Callable[[str], Any], name: str) -> dict[str, Any]:
        try:
            value = fn(name)
        except f.FormatError as e:
            return {"input": name, "verdict": e.reason.value}
        return {"input": name, "verdict": OK, "value": value}

    def temp(name: str) -> dict[str, Any]:
        parsed = f.parse_temp_name(name)
        if parsed is None:
            return {"input": name, "verdict": "not_temp"}
        return {"input": name, "verdict": OK, "value": list(parsed)}

    return {
        "sanitize_model": [[m, f.sanitize_model(m)] for m in sanitize],
        "chunk_rel_path": [
            [key, 2, f.chunk_rel_path(key, 2)],
            [h("xxh", 16).hex(), 1023, f.chunk_rel_path(h("xxh", 16).hex(), 1023)],
        ],
        "parse_chunk_rel_path": [
            verdict(lambda s: list(f.parse_chunk_rel_path(s)), p) for p in parse_chunk
        ],
        "parse_rank_base_name": [
            verdict(lambda s: list(vars(f.parse_rank_base_name(s)).values()), n)
            for n in rank_bases
        ],
        "parse_manifest_file_name": [
            verdict(lambda s: list(f.parse_manifest_file_name(s)), n)
            for n in manifest_names
        ],
        "parse_temp_name": [temp(n) for n in temps],
    }


def retention_table() -> list[dict[str, Any]]:
    a, b, c, d, x, y, z = (h(s, 8).hex() for s in "abcdxyz")
    forked = {
        "M1": [a],
        "M2": [a, b],
        "M3": [a, b, c],
        "M4": [a, b, c, d],
        "M3x": [a, b, x],
        "M4x": [a, b, x, y],
        "M5x": [a, b, x, y, z],
    }
    cases = []
    for keep in (0, 1, 2, 3, 6):
        cases.append(
            {
                "name": f"forked_k{keep}",
                "chains": forked,
                "keep": keep,
                "kept": sorted(f.kept_manifests(forked, keep)),
            }
        )
    gappy = {"G2": [a, b], "G5": [a, b, c, d, x], "other": [x, y]}
    cases.append(
        {
            "name": "gaps_k2",
            "chains": gappy,
            "keep": 2,
            "kept": sorted(f.kept_manifests(gappy, 2)),
        }
    )
    rng = random.Random(53)
    keys = [h(f"r{i}", 8).hex() for i in range(6)]
    for n in range(3):
        chains: dict[str, list[str]] = {}
        for i in range(16):
            length = rng.randint(1, 7)
            chains[f"m{i:02d}"] = [
                keys[rng.randrange(2 if j < 3 else 6)] for j in range(length)
            ]
        keep = rng.randint(1, 4)
        cases.append(
            {
                "name": f"random_{n}_k{keep}",
                "chains": chains,
                "keep": keep,
                "kept": sorted(f.kept_manifests(chains, keep)),
            }
        )
    return cases


def dump_lines(obj: dict[str, Any], list_key: str) -> bytes:
    """JSON with one list item per line: small, and diffs stay readable."""
    head = {k: v for k, v in obj.items() if k != list_key}
    lines = [json.dumps(item, ensure_ascii=True) for item in obj[list_key]]
    text = json.dumps(head, ensure_ascii=True)[:-1]
    text += (", " if head else "") + f'"{list_key}": [\n' + ",\n".join(lines) + "\n]}\n"
    json.loads(text)
    return text.encode()


def build() -> dict[str, bytes]:
    v = Vectors()
    add_chunks(v)
    add_manifests(v)
    add_records(v)
    add_pending(v)
    index = {
        "format": 1,
        "generator": "tests/vectors/generate.py",
        "vectors": v.index,
        "tables": {"names": "names.json", "retention": "retention.json"},
    }
    files = dict(v.files)
    files["index.json"] = dump_lines(index, "vectors")
    files["names.json"] = (
        json.dumps(names_table(), indent=1, ensure_ascii=True) + "\n"
    ).encode()
    files["retention.json"] = dump_lines({"cases": retention_table()}, "cases")
    return files


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args()
    files = build()
    if args.check:
        bad = [
            p for p, data in files.items()
            if not (args.out / p).is_file() or (args.out / p).read_bytes() != data
        ]  # fmt: skip
        for p in bad:
            print(f"generate.py --check: {p} differs from the codec's output")
        return 1 if bad else 0
    for p, data in files.items():
        path = args.out / p
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    total = sum(len(d) for d in files.values())
    print(f"wrote {len(files)} files, {total} bytes, to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
