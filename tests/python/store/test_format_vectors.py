"""Format v1 and v2 against the shared vectors: both codecs of FORMAT.md, the
shipped one (kv_store_format: the C++ format/ library through
libkvtier_store.so) and the pure-Python oracle (tests/oracle/), each test run
on each (the fixture ``f``); and the C++ codec through
build/format/kvformat_vectors (both directions, byte for byte)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from chunk_calls import ChunkCalls
from conftest import REPO_ROOT as REPO
from conftest import load_module

VECTORS = REPO / "tests" / "vectors"
CODEC = REPO / "overlays" / "kv-offload-store-local" / "kv_store_format"
ORACLE = REPO / "tests" / "oracle" / "kv_store_format_oracle"
CODECS = {
    # The package and the chunk calls only tests make (sim/chunk_calls.py).
    "native": ChunkCalls(load_module("kvtier_kv_store_format", CODEC)),
    "oracle": load_module("kvtier_kv_store_format_oracle", ORACLE),
}


@pytest.fixture(params=sorted(CODECS))
def f(request):
    """Each codec in turn: the shipped (native) one and the oracle."""
    return CODECS[request.param]


INDEX = json.loads((VECTORS / "index.json").read_text())
VECTOR_IDS = [v["name"] for v in INDEX["vectors"]]


def verdict(f, kind: str, data: bytes) -> str:
    decode = {
        "chunk": f.verify_chunk,
        "manifest": f.decode_manifest,
        "record": f.decode_namespace_record,
        "pending": f.decode_pending_record,
    }[kind]
    try:
        decode(data)
    except f.FormatError as e:
        return e.reason.value
    return "ok"


@pytest.fixture(scope="module")
def vectors_bin() -> Path:
    env = os.environ.get("KVFORMAT_VECTORS_BIN")
    build = Path(os.environ.get("KVTIER_BUILD_DIR", REPO / "build"))
    path = Path(env) if env else build / "format" / "kvformat_vectors"
    if not path.is_file():
        pytest.skip(
            f"{path} is not built (set KVTIER_BUILD_DIR or KVFORMAT_VECTORS_BIN)"
        )
    return path


# --- the committed vectors and the Python codec -------------------------------


def test_generator_reproduces_every_committed_file() -> None:
    generate = load_module("kvtier_vectors_generate", VECTORS / "generate.py")
    files = generate.build()
    on_disk = {
        str(p.relative_to(VECTORS))
        for p in VECTORS.rglob("*")
        # sizes.txt: the size syntax's cases, written by hand and read by both size
        # parsers' tests (test_kv_offload_knobs.py, kvstore/gc_plan_test.cpp).
        if p.is_file() and p.name not in ("generate.py", "README.md", "sizes.txt")
    }
    assert on_disk == set(files), "stray or missing vector files"
    for rel, data in files.items():
        assert (VECTORS / rel).read_bytes() == data, rel


def test_vectors_stay_small() -> None:
    data = [p for p in VECTORS.rglob("*") if p.is_file() and p.suffix != ".py"]
    total = sum(p.stat().st_size for p in data if p.name != "README.md")
    assert total < 200 * 1024


@pytest.mark.parametrize("vector", INDEX["vectors"], ids=VECTOR_IDS)
def test_codec_verdict(f, vector: dict, tmp_path: Path) -> None:
    data = (VECTORS / vector["file"]).read_bytes()
    assert verdict(f, vector["kind"], data) == vector["verdict"], vector["note"]
    if vector["kind"] == "chunk":
        # The file-based readers give the same verdict as the in-memory one.
        path = tmp_path / "c.bin"
        path.write_bytes(data)
        for block in (1, 100, 1 << 20):
            try:
                f.verify_chunk_file(str(path), block_size=block)
                got = "ok"
            except f.FormatError as e:
                got = e.reason.value
            assert got == vector["verdict"]
        # The header-only read (the writer's dedup) sees all but the payload.
        want = vector["verdict"]
        want = "ok" if want == "payload_checksum_mismatch" else want
        try:
            f.read_chunk_header(str(path))
            got = "ok"
        except f.FormatError as e:
            got = e.reason.value
        assert got == want


def test_flipped_records_hash_as_recorded(f) -> None:
    original = json.loads((VECTORS / "record/valid_kda.json").read_text())
    original_hash = f.namespace_hash(original["fenced"]).hex()
    flipped = [v for v in INDEX["vectors"] if "namespace_hash" in v]
    assert len(flipped) >= 10
    for vector in flipped:
        rec = f.decode_namespace_record((VECTORS / vector["file"]).read_bytes())
        assert rec.namespace_hash.hex() == vector["namespace_hash"]
        in_info = vector["name"].startswith("record/flip_info")
        assert (rec.namespace_hash.hex() == original_hash) == in_info, vector["name"]


def test_every_reader_verdict_is_covered(f) -> None:
    seen = {v["verdict"] for v in INDEX["vectors"]}
    # The keyed-store reasons have their own vectors (test_kv_mac.py).
    keyed = (f.Reason.MAC_MISSING, f.Reason.MAC_MISMATCH)
    for reason in f.Reason:
        if reason is not f.Reason.BAD_NAME and reason not in keyed:
            assert reason.value in seen, reason


def _encode_spec(f, kind: str, spec: dict) -> bytes:
    if kind == "chunk":
        segments = tuple(
            f.Segment(
                s["layer"],
                f.SegmentKind[s["kind"].upper()],
                f.DType[s["dtype"].upper()],
                s["offset"],
                s["length"],
                tuple(s["shape"]),
                tuple(s["stride"]),
                s["part"],
            )
            for s in spec["segments"]
        )
        payload = bytes.fromhex(spec["payload"])
        header = f.make_header(
            bytes.fromhex(spec["namespace_hash"]),
            spec["group"],
            bytes.fromhex(spec["key_hash"]),
            spec["boundary"],
            segments,
            payload,
            spec["format_version"],
        )
        return f.encode_chunk(header, payload)
    if kind == "manifest":
        return f.encode_manifest(
            f.BoundaryManifest(
                spec["namespace"],
                spec["rank"],
                spec["boundary"],
                spec["chunk_tokens"],
                tuple(spec["chain"]),
                tuple(
                    f.ManifestGroup(
                        g["group"],
                        g["kind"],
                        tuple(f.ManifestEntry(*e) for e in g["entries"]),
                    )
                    for g in spec["groups"]
                ),
                spec["format"],
            )
        )
    return f.encode_namespace_record(f.NamespaceRecord(spec["fenced"], spec["info"]))


VALID = [v for v in INDEX["vectors"] if "spec" in v]


@pytest.mark.parametrize("vector", VALID, ids=[v["name"] for v in VALID])
def test_valid_vectors_reencode_and_round_trip(f, vector: dict) -> None:
    data = (VECTORS / vector["file"]).read_bytes()
    assert _encode_spec(f, vector["kind"], vector["spec"]) == data
    spec = vector["spec"]
    if vector["kind"] == "chunk":
        header = f.verify_chunk(data)
        assert header.format_version == spec["format_version"]
        if f is CODECS["oracle"]:
            # What its reader sizes a header read by, from the first 16 bytes.
            assert f.declared_header_length(data[:16]) == header.header_length
            assert f.declared_header_length(data[:15]) is None
        assert f.decode_header(data[: header.header_length]) == header
        assert [s.part for s in header.segments] == [
            s["part"] for s in spec["segments"]
        ]
    if vector["kind"] == "manifest":
        assert f.decode_manifest(data).file_name == spec["file_name"]
    if vector["kind"] == "record":
        rec = f.decode_namespace_record(data)
        assert f.canonical_json(rec.fenced).decode() == spec["canonical_fenced"]
        assert rec.namespace_hash.hex() == spec["namespace_hash"]
        base = f.rank_base_name(
            f.DEFAULT_PREFIX, rec.fenced["model"], rec.namespace_hash, spec["rank"]
        )
        assert base == spec["rank_base_name"]


# --- the C++ codec through kvformat_vectors -----------------------------------


def test_cpp_verdicts_equal_the_index(vectors_bin: Path) -> None:
    out = subprocess.run(
        [vectors_bin, "verdicts", VECTORS], check=True, capture_output=True, text=True
    ).stdout
    cpp = json.loads(out)
    wrong = {
        v["name"]: (v["verdict"], cpp.get(v["name"]))
        for v in INDEX["vectors"]
        if cpp.get(v["name"]) != v["verdict"]
    }
    assert wrong == {}


def test_cpp_encodings_are_byte_identical_and_each_codec_reads_them(
    f, vectors_bin: Path, tmp_path: Path
) -> None:
    subprocess.run([vectors_bin, "encode", VECTORS, tmp_path], check=True)
    written = sorted(p for p in tmp_path.rglob("*") if p.is_file())
    assert len(written) == len(VALID)
    for vector in VALID:
        cpp = (tmp_path / vector["file"]).read_bytes()
        assert cpp == (VECTORS / vector["file"]).read_bytes(), vector["name"]
        assert verdict(f, vector["kind"], cpp) == "ok"


def _big_chunk(f, size: int) -> bytes:
    rng = random.Random(27)
    payload = rng.randbytes(size)
    segments = f.make_segments(
        [
            (0, f.SegmentKind.KV, f.DType.BFLOAT16, (size // 4,), (1,)),
            (1, f.SegmentKind.KV, f.DType.UINT8, (size // 2,), (1,)),
        ]
    )
    ns = f.namespace_hash({"format_version": 1, "x": "big"})
    return f.encode_chunk(
        f.make_header(ns, 0, rng.randbytes(32), 3584, segments, payload), payload
    )


def test_big_chunk_both_ways(f, vectors_bin: Path, tmp_path: Path) -> None:
    data = _big_chunk(f, 27 << 20)
    path = tmp_path / "big.bin"
    path.write_bytes(data)

    def cpp_verdict() -> str:
        return subprocess.run(
            [vectors_bin, "verify", "chunk", path],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()

    assert cpp_verdict() == "ok"
    assert f.verify_chunk_file(str(path)).payload_length == 27 << 20
    bad = bytearray(data)
    bad[len(bad) // 2] ^= 0x40
    path.write_bytes(bad)
    assert cpp_verdict() == "payload_checksum_mismatch"
    with pytest.raises(f.FormatError) as err:
        f.verify_chunk_file(str(path))
    assert err.value.reason is f.Reason.PAYLOAD_CHECKSUM_MISMATCH


# --- names and retention tables ------------------------------------------------

NAMES = json.loads((VECTORS / "names.json").read_text())
RETENTION = json.loads((VECTORS / "retention.json").read_text())["cases"]


def _result(f, fn, arg) -> dict:
    try:
        value = fn(arg)
    except f.FormatError as e:
        return {"verdict": e.reason.value}
    return {"verdict": "ok", "value": value}


def test_name_table(f) -> None:
    for raw, want in NAMES["sanitize_model"]:
        assert f.sanitize_model(raw) == want
    for key, group, rel in NAMES["chunk_rel_path"]:
        assert f.chunk_rel_path(key, group) == rel
        assert f.parse_chunk_rel_path(rel) == (key, group)
    table = {
        "parse_chunk_rel_path": lambda s: list(f.parse_chunk_rel_path(s)),
        "parse_rank_base_name": lambda s: list(
            vars(f.parse_rank_base_name(s)).values()
        ),
        "parse_manifest_file_name": lambda s: list(f.parse_manifest_file_name(s)),
    }
    for column, fn in table.items():
        for row in NAMES[column]:
            want = {k: v for k, v in row.items() if k != "input"}
            assert _result(f, fn, row["input"]) == want, row["input"]
    for row in NAMES["parse_temp_name"]:
        parsed = f.parse_temp_name(row["input"])
        got = (
            {"verdict": "not_temp"}
            if parsed is None
            else {"verdict": "ok", "value": list(parsed)}
        )
        assert got == {k: v for k, v in row.items() if k != "input"}


def _brute_force_kept(chains: dict[str, list[str]], keep: int) -> set[str]:
    """FORMAT.md section 6 by its words: each leaf and its K-1 deepest ancestors."""

    def proper_prefix(a: list[str], b: list[str]) -> bool:
        return len(a) < len(b) and b[: len(a)] == a

    kept: set[str] = set()
    for chain in chains.values():
        if any(proper_prefix(chain, other) for other in chains.values()):
            continue
        depths = sorted(
            {len(c) for c in chains.values() if c == chain or proper_prefix(c, chain)},
            reverse=True,
        )[:keep]
        kept |= {
            n
            for n, c in chains.items()
            if (c == chain or proper_prefix(c, chain)) and len(c) in depths
        }
    return kept


@pytest.mark.parametrize("case", RETENTION, ids=[c["name"] for c in RETENTION])
def test_retention_table(f, case: dict) -> None:
    got = f.kept_manifests(case["chains"], case["keep"])
    assert sorted(got) == case["kept"]
    if case["keep"]:
        assert got == _brute_force_kept(case["chains"], case["keep"])
    else:
        assert got == set(case["chains"])


def test_retention_worked_example(f) -> None:
    a, b, c, d, x, y, z = "abcdxyz"
    chains = {
        "M1": [a],
        "M2": [a, b],
        "M3": [a, b, c],
        "M4": [a, b, c, d],
        "M3x": [a, b, x],
        "M4x": [a, b, x, y],
        "M5x": [a, b, x, y, z],
    }
    assert f.kept_manifests(chains, 1) == {"M4", "M5x"}
    assert f.kept_manifests(chains, 2) == {"M4", "M3", "M5x", "M4x"}
    assert f.kept_manifests(chains, 3) == {"M4", "M3", "M2", "M5x", "M4x", "M3x"}
    with pytest.raises(f.FormatError):
        f.kept_manifests(chains, 1025)


def test_retention_random_forests_match_definition(f) -> None:
    rng = random.Random(11)
    for _ in range(200):
        chains = {
            f"m{i}": [
                rng.choice("ab" if j < 3 else "abcde") for j in range(rng.randint(1, 7))
            ]
            for i in range(rng.randint(1, 25))
        }
        keep = rng.randint(1, 4)
        assert f.kept_manifests(chains, keep) == _brute_force_kept(chains, keep)


def test_native_keep_k_refuses_names_it_cannot_pass() -> None:
    """The shipped keep-K hands the library tab-separated lines: a name or
    key holding a tab or newline is refused, never split wrong."""
    native = CODECS["native"]
    for chains in ({"a\tb": ["x"]}, {"a": ["x\ny"]}, {"a\nb": []}):
        with pytest.raises(native.FormatError) as err:
            native.kept_manifests(chains, 2)
        assert err.value.reason is native.Reason.BAD_NAME
    odd = {"a\rb": ["x"], "\u00e9": ["x", "y"], "": []}
    assert native.kept_manifests(odd, 1) == CODECS["oracle"].kept_manifests(odd, 1)


# --- codec behaviour the vectors do not pin -------------------------------------


def _state_chunk(f) -> tuple[bytes, int]:
    segments = f.make_segments(
        [
            (3, f.SegmentKind.CONV, f.DType.BFLOAT16, (2, 3), (3, 1)),
            (3, f.SegmentKind.TEMPORAL, f.DType.FLOAT32, (2, 2, 2), (4, 2, 1)),
        ]
    )
    header = f.make_header(
        bytes(range(32)), 2, bytes(range(100, 132)), 3584, segments, bytes(44)
    )
    data = f.encode_chunk(header, bytes(44))
    return data, f.header_length_for(2)


def test_every_single_bit_flip_gets_the_predicted_verdict(f) -> None:
    data, hl = _state_chunk(f)
    for byte in range(len(data)):
        if byte < 8:
            want = "bad_magic"
        elif byte < 10:
            want = "unsupported_version"
        elif 12 <= byte < 16:
            want = "bad_header_length"
        elif byte == 16:
            want = "unsupported_checksum_algorithm"
        elif byte >= hl:
            want = "payload_checksum_mismatch"
        else:
            want = "header_checksum_mismatch"
        for bit in range(8):
            copy = bytearray(data)
            copy[byte] ^= 1 << bit
            assert verdict(f, "chunk", bytes(copy)) == want, (byte, bit)


def test_every_truncation_is_truncated(f) -> None:
    data, _ = _state_chunk(f)
    for n in range(len(data)):
        assert verdict(f, "chunk", data[:n]) == "truncated", n


def test_encode_refuses_what_would_not_parse(f) -> None:
    data, _ = _state_chunk(f)
    header = f.verify_chunk(data)
    cases = {
        "bad_key_hash": {"key_hash": b"1234567"},
        "field_out_of_range": {"group": 1024},
        "bad_segment_table": {"payload_length": 45},
        "unsupported_checksum_algorithm": {"checksum_algorithm": f.CHECKSUM_CRC32C},
    }
    for reason, change in cases.items():
        with pytest.raises(f.FormatError) as err:
            f.encode_header(f.ChunkHeader(**{**vars(header), **change}))
        assert err.value.reason.value == reason


def test_v2_parts_six_tuples_and_v1_compatibility(f) -> None:
    segments = f.make_segments(
        [
            (12, f.SegmentKind.CONV, f.DType.BFLOAT16, (2, 3), (3, 1), 0),
            (12, f.SegmentKind.CONV, f.DType.BFLOAT16, (2, 3), (3, 1), 1),
            (12, f.SegmentKind.CONV, f.DType.FLOAT32, (3, 1), (1, 1), 2),
            (12, f.SegmentKind.TEMPORAL, f.DType.FLOAT32, (2, 2, 2), (4, 2, 1)),
        ]
    )
    assert [(s.part, s.offset, s.length) for s in segments] == [
        (0, 0, 12),
        (1, 12, 12),
        (2, 24, 12),
        (0, 36, 32),
    ]
    ns, key = bytes(range(32)), bytes(range(100, 132))
    data = f.encode_chunk(f.make_header(ns, 2, key, 48, segments, bytes(68)), bytes(68))
    assert data[8] == 2 and data[144 + 2 * 120 + 7] == 2
    header = f.verify_chunk(data)
    assert header.format_version == 2 and header.segments == segments
    # Order is (layer, kind, part): part 1 before part 0 is a writer bug.
    swapped = (segments[1], segments[0], *segments[2:])
    swapped = f.make_segments(
        [(s.layer, s.kind, s.dtype, s.shape, s.stride, s.part) for s in swapped]
    )
    with pytest.raises(f.FormatError) as err:
        f.encode_chunk(f.make_header(ns, 2, key, 48, swapped, bytes(68)), bytes(68))
    assert err.value.reason is f.Reason.BAD_SEGMENT_TABLE
    # v1 has no part: the encoder refuses one, and v1 files still read.
    with pytest.raises(f.FormatError) as err:
        f.encode_chunk(
            f.make_header(ns, 2, key, 48, segments, bytes(68), format_version=1),
            bytes(68),
        )
    assert err.value.reason is f.Reason.RESERVED_NONZERO
    conv = f.make_segments([(12, f.SegmentKind.CONV, f.DType.UINT8, (36,), (1,))])
    old = f.encode_chunk(
        f.make_header(ns, 2, key, 48, conv, bytes(36), format_version=1), bytes(36)
    )
    assert old[8] == 1 and f.verify_chunk(old).format_version == 1
    with pytest.raises(f.FormatError) as err:
        f.encode_chunk(
            f.make_header(ns, 2, key, 48, segments, bytes(68), format_version=3),
            bytes(68),
        )
    assert err.value.reason is f.Reason.UNSUPPORTED_VERSION


# make_fenced's arguments for the tests below.
FENCED_ARGS = dict(
    model="zai-org/GLM-5.3",
    vllm_version="0.33.0",
    build_id="b",
    tp_size=2,
    kv_dtype="auto",
    hash_algorithm="sha256_cbor",
    num_speculative_tokens=0,
    page_sizes={0: 100},
    state_abi={},
)


def test_make_fenced_adds_the_writer_keys_it_checks(f) -> None:
    scheme = {"hash": "sha256_cbor", "seed": "default"}
    fenced = f.make_fenced(**FENCED_ARGS, key_scheme=scheme, layer_index="model")
    # The same dict the writer used to build by hand, so the same namespace.
    by_hand = {
        **f.make_fenced(**FENCED_ARGS),
        "key_scheme": scheme,
        "layer_index": "model",
    }
    assert f.namespace_hash(fenced) == f.namespace_hash(by_hand)
    assert "key_scheme" not in f.make_fenced(**FENCED_ARGS)
    identity = {"quantization": "fp8", "weights": "ab"}
    with_identity = f.make_fenced(**FENCED_ARGS, model_identity=identity)
    assert with_identity["model_identity"] == identity
    assert f.namespace_hash(with_identity) != f.namespace_hash(
        f.make_fenced(**FENCED_ARGS)
    )
    for bad in (
        {"key_scheme": {"hash": 1}},
        {"model_identity": {"dtype": None}},
        {"layer_index": ""},
        {"layer_index": 3},
    ):
        with pytest.raises(f.FormatError) as err:
            f.make_fenced(**FENCED_ARGS, **bad)
        assert err.value.reason is f.Reason.BAD_FIELD


def test_store_layout_paths(f) -> None:
    fenced = f.make_fenced(**FENCED_ARGS)
    ns = f.namespace_hash(fenced)
    layout = f.StoreLayout.create("/data/kv", "zai-org/GLM-5.3", ns, 1)
    short = ns.hex()[:16]
    assert layout.base == f"/data/kv/glm53kv_zai-org-GLM-5.3_{short}_r1"
    assert layout.namespace_record == layout.base + ".json"
    assert layout.lock == layout.base + "/.lock"
    key = "ab" * 32
    assert layout.chunk(key, 4) == f"{layout.base}/aba/ba_g4/{key}.bin"
    assert layout.manifest(3584, key) == f"{layout.base}/manifests/b3584_{key}.json"
    assert f.temp_name("x.bin", 10, 11) == "x.bin.tmp.10.11"
    assert f.parse_temp_name("x.bin.tmp.10.11") == ("x.bin", 10, 11)
    parsed = f.parse_rank_base_name(os.path.basename(layout.base))
    assert (parsed.model, parsed.ns_short, parsed.rank) == ("zai-org-GLM-5.3", short, 1)


def test_namespace_hash_ignores_info_and_key_order(f) -> None:
    fenced = {"format_version": 1, "b": [1, 2], "a": {"y": 1, "x": "\u00e9"}}
    reordered = {"a": {"x": "\u00e9", "y": 1}, "b": [1, 2], "format_version": 1}
    assert f.namespace_hash(fenced) == f.namespace_hash(reordered)
    assert (
        f.canonical_json(fenced)
        == b'{"a":{"x":"\\u00e9","y":1},"b":[1,2],"format_version":1}'
    )
    with pytest.raises(f.FormatError):
        f.canonical_json({"x": 1.5})


@pytest.mark.parametrize("package", [CODEC, ORACLE], ids=["native", "oracle"])
def test_codec_imports_only_the_standard_library(package: Path) -> None:
    import ast

    modules = set()
    siblings = {p.stem for p in package.glob("*.py")}
    for source in package.glob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Import):
                modules |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level:
                named = [node.module] if node.module else [a.name for a in node.names]
                assert node.level == 1 and set(named) <= siblings, source.name
            elif isinstance(node, ast.ImportFrom) and node.module:
                modules.add(node.module.split(".")[0])
    assert modules, "no imports found"
    assert modules <= set(sys.stdlib_module_names) | {"__future__"}, modules
