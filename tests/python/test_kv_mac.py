"""Keyed stores (FORMAT.md 3.6, issue 38): the Python codec's MAC on chunks
and manifests, the key's id in the namespace, the key file's checks, and the
readers that take a key (manifest decode, header read, streaming seal)."""

from __future__ import annotations

import hashlib
import hmac
import os
import struct
from pathlib import Path

import pytest
from conftest import load_module

REPO = Path(__file__).resolve().parents[2]
CODEC = REPO / "overlays" / "kv-offload-store-local" / "kv_store_format"
KNOBS = REPO / "overlays" / "kv-offload-scope" / "kv_offload_knobs.py"


f = load_module("kvtier_kv_store_format_mac", CODEC)
knobs = load_module("kvtier_kv_offload_knobs_mac", KNOBS)

KEY = bytes(range(32))
OTHER_KEY = bytes(range(1, 33))
# Pinned: a change here is a format change (both codecs' vectors move).
KEY_ID = "3f03aa1bf45caef5"
NS = hashlib.sha256(b"namespace").digest()
# The MAC of _chunk() and of the manifest below under KEY: the vectors a C++
# codec must reproduce byte for byte.
CHUNK_MAC = "14e8b1ff016a611f6c9b2fdc46e4df103af368d39640feaaa1ae574f06fffe19"
MANIFEST_MAC = "73c0b7ac96107c9a0af4d3c718ddba263d019e13c3df93c5e1e2dfff3dd70a16"


def _chunk(payload: bytes = b"\x01\x02\x03\x04" * 4) -> bytes:
    segments = f.make_segments(
        [(0, f.SegmentKind.KV, f.DType.UINT8, (len(payload),), (1,))]
    )
    header = f.make_header(NS, 0, b"\xab" * 16, 16, segments, payload)
    return f.encode_chunk(header, payload)


def test_key_id_is_pinned_and_not_the_key() -> None:
    want = hmac.new(KEY, b"kvtier key id", hashlib.sha256).hexdigest()[:16]
    assert f.key_id(KEY) == want == KEY_ID
    assert KEY.hex()[:16] != KEY_ID
    assert f.key_id(OTHER_KEY) != KEY_ID


def test_sealed_chunk_layout_vector() -> None:
    plain = _chunk()
    sealed = f.seal_chunk(KEY, plain)
    assert len(sealed) == len(plain) + 32
    assert struct.unpack_from("<H", sealed, 10) == (1,)
    (hlen,) = struct.unpack_from("<I", sealed, 12)
    assert sealed[hlen:-32] == plain[hlen:]  # the payload is untouched
    want = hmac.new(KEY, sealed[:-32], hashlib.sha256).digest()
    assert sealed[-32:] == want
    assert want.hex() == CHUNK_MAC
    assert f.open_chunk(KEY, sealed) == plain
    f.verify_chunk(f.open_chunk(KEY, sealed))


def test_forged_chunk_with_valid_crc_and_namespace_is_refused() -> None:
    # The attacker can write the folder, knows the namespace hash and the
    # CRC: a fully valid plain chunk with payload of its choosing.
    forged = _chunk(b"\xee" * 16)
    f.verify_chunk(forged)  # CRC and namespace alone accept it
    with pytest.raises(f.FormatError) as err:
        f.open_chunk(KEY, forged)
    assert err.value.reason is f.Reason.MAC_MISSING
    # Sealed with a key it guessed: the MAC differs.
    with pytest.raises(f.FormatError) as err:
        f.open_chunk(KEY, f.seal_chunk(OTHER_KEY, forged))
    assert err.value.reason is f.Reason.MAC_MISMATCH
    # A genuine chunk with its payload swapped and the CRC fixed up.
    sealed = bytearray(f.seal_chunk(KEY, _chunk()))
    (hlen,) = struct.unpack_from("<I", sealed, 12)
    sealed[hlen : hlen + 16] = b"\xee" * 16
    with pytest.raises(f.FormatError) as err:
        f.open_chunk(KEY, bytes(sealed))
    assert err.value.reason is f.Reason.MAC_MISMATCH


def test_keyed_chunk_read_without_key_is_refused() -> None:
    sealed = f.seal_chunk(KEY, _chunk())
    with pytest.raises(f.FormatError) as err:
        f.verify_chunk(sealed)
    assert err.value.reason is f.Reason.RESERVED_NONZERO


def test_another_key_is_another_namespace() -> None:
    fenced = f.make_fenced(
        model="m",
        vllm_version="0.33.0",
        build_id="",
        tp_size=1,
        kv_dtype="bfloat16",
        hash_algorithm="sha256",
        num_speculative_tokens=0,
        page_sizes={0: 4096},
        state_abi={},
    )
    plain = f.namespace_hash(fenced)
    assert f.namespace_hash(f.fence_key(fenced, None)) == plain
    one = f.namespace_hash(f.fence_key(fenced, KEY))
    two = f.namespace_hash(f.fence_key(fenced, OTHER_KEY))
    assert len({plain, one, two}) == 3
    assert f.fence_key(fenced, KEY)["mac_key_id"] == KEY_ID
    assert KEY.hex() not in repr(f.fence_key(fenced, KEY))


def test_manifest_mac() -> None:
    manifest = {"format": 2, "boundary": 16, "groups": []}
    sealed = f.seal_manifest(KEY, manifest)
    assert sealed["mac"] == MANIFEST_MAC
    assert f.open_manifest(KEY, sealed) == manifest
    with pytest.raises(f.FormatError) as err:
        f.open_manifest(KEY, manifest)
    assert err.value.reason is f.Reason.MAC_MISSING
    with pytest.raises(f.FormatError) as err:
        f.open_manifest(OTHER_KEY, sealed)
    assert err.value.reason is f.Reason.MAC_MISMATCH
    with pytest.raises(f.FormatError) as err:
        f.open_manifest(KEY, {**sealed, "boundary": 32})
    assert err.value.reason is f.Reason.MAC_MISMATCH


def _key_file(tmp_path: Path, mode: int, data: bytes = KEY) -> Path:
    path = tmp_path / "key"
    path.write_bytes(data)
    os.chmod(path, mode)
    return path


def test_key_file_private_is_loaded(tmp_path: Path) -> None:
    assert f.load_key(str(_key_file(tmp_path, 0o600))) == KEY
    assert f.load_key(str(_key_file(tmp_path, 0o400))) == KEY


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644, 0o610])
def test_key_file_others_may_access_is_refused(tmp_path: Path, mode: int) -> None:
    path = _key_file(tmp_path, mode)
    with pytest.raises(f.KeyFileError) as err:
        f.load_key(str(path))
    assert str(path) in str(err.value) and f"{mode:04o}" in str(err.value)
    assert KEY.hex() not in str(err.value)


def test_key_file_symlink_short_missing_are_refused(tmp_path: Path) -> None:
    real = _key_file(tmp_path, 0o600)
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(f.KeyFileError, match="symlink"):
        f.load_key(str(link))
    short = tmp_path / "short"
    short.write_bytes(b"x" * 31)
    os.chmod(short, 0o600)
    with pytest.raises(f.KeyFileError, match="31 bytes"):
        f.load_key(str(short))
    with pytest.raises(f.KeyFileError, match="not a regular file"):
        f.load_key(str(tmp_path))
    with pytest.raises(f.KeyFileError, match="missing"):
        f.load_key(str(tmp_path / "missing"))


def test_key_file_knob_is_in_the_contract() -> None:
    env = {"GLM53_KV_OFFLOAD_KEY_FILE": "/etc/kvtier/key"}
    assert knobs.read_knobs(env).key_file == "/etc/kvtier/key"
    assert knobs.read_knobs({}).key_file == ""
    with pytest.raises(knobs.KnobError, match="KEY_FILE"):
        knobs.read_knobs({"GLM53_KV_OFFLOAD_KEY_FILE": "key"})


def _manifest():
    entry = f.ManifestEntry("ab" * 16, 16, 0x1234)
    return f.BoundaryManifest(
        namespace=NS.hex(),
        rank=0,
        boundary=16,
        chunk_tokens=16,
        chain=("ab" * 16,),
        groups=(f.ManifestGroup(0, f.GROUP_KIND_FULL, (entry,)),),
    )


def test_manifest_encode_decode_with_a_key() -> None:
    m = _manifest()
    sealed = f.encode_manifest(m, KEY)
    assert b'"mac":"' in sealed and f.decode_manifest(sealed, KEY) == m
    with pytest.raises(f.FormatError) as err:
        f.decode_manifest(sealed)  # keyless: the CRC (over the rest) takes "mac" in
    assert err.value.reason is f.Reason.MANIFEST_CHECKSUM_MISMATCH
    with pytest.raises(f.FormatError) as err:
        f.decode_manifest(f.encode_manifest(m), KEY)
    assert err.value.reason is f.Reason.MAC_MISSING
    with pytest.raises(f.FormatError) as err:
        f.decode_manifest(f.encode_manifest(m, OTHER_KEY), KEY)
    assert err.value.reason is f.Reason.MAC_MISMATCH


def test_streaming_seal_equals_seal_chunk_and_headers_read_with_a_key(tmp_path) -> None:
    payload = b"\x01\x02\x03\x04" * 4
    plain = _chunk(payload)
    (hlen,) = struct.unpack_from("<I", plain, 12)
    head, running = f.seal_header(KEY, plain[:hlen])
    running.update(payload)
    streamed = head + payload + running.digest()
    assert streamed == f.seal_chunk(KEY, plain)
    path = tmp_path / "c.bin"
    path.write_bytes(streamed)
    assert f.read_chunk_header(str(path), KEY) == f.decode_header(plain)
    assert f.verify_chunk_file(str(path), key=KEY) == f.decode_header(plain)
    rotten = bytearray(streamed)
    rotten[20] ^= 1  # a header byte: without the MAC, the header CRC tells
    path.write_bytes(bytes(rotten))
    with pytest.raises(f.FormatError) as err:
        f.read_chunk_header(str(path), KEY)
    assert err.value.reason is f.Reason.HEADER_CHECKSUM_MISMATCH
    path.write_bytes(plain)
    with pytest.raises(f.FormatError) as err:
        f.read_chunk_header(str(path), KEY)
    assert err.value.reason is f.Reason.MAC_MISSING
