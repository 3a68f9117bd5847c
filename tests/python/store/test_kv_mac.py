"""Keyed stores (FORMAT.md 3.6, issue 38): the MAC on chunks and manifests,
the key's id in the namespace, the key file's checks, and the readers that
take a key (manifest decode, header read, streaming seal), on both codecs
(the fixture ``f``: the shipped kv_store_format, whose MACs are the C++
codec's, and the pure-Python oracle); the oracle's own MAC pieces (the
subkey, the manifest object's seal, its libcrypto) on the oracle."""

from __future__ import annotations

import hashlib
import hmac
import os
import struct
from pathlib import Path

import pytest
from chunk_calls import ChunkCalls
from conftest import REPO_ROOT as REPO
from conftest import load_module

CODEC = REPO / "overlays" / "kv-offload-store-local" / "kv_store_format"
ORACLE = REPO / "tests" / "oracle" / "kv_store_format_oracle"
KNOBS = REPO / "overlays" / "kv-offload-scope" / "kv_offload_knobs.py"


CODECS = {
    # The package and the chunk calls only tests make (sim/chunk_calls.py).
    "native": ChunkCalls(load_module("kvtier_kv_store_format_mac", CODEC)),
    "oracle": load_module("kvtier_kv_store_format_oracle_mac", ORACLE),
}
oracle = CODECS["oracle"]
knobs = load_module("kvtier_kv_offload_knobs_mac", KNOBS)


@pytest.fixture(params=sorted(CODECS))
def f(request):
    """Each codec in turn: the shipped (native) one and the oracle."""
    return CODECS[request.param]


KEY = bytes(range(32))
OTHER_KEY = bytes(range(1, 33))
# Pinned: a change here is a format change (both codecs' vectors move).
KEY_ID = "3f03aa1bf45caef5"
NS = hashlib.sha256(b"namespace").digest()
# The seals of _chunk(f) and the MAC of the manifest below under KEY: the
# vectors a C++ codec must reproduce byte for byte (format/mac_test.cpp).
RANK = 3
SALT = bytes(range(0xA0, 0xB0))
SUBKEY = "5063a0944cbae323c83fe9e81496f2eeadabaf0860ede35085074a56e1ac9474"
CHUNK_TAG = "c114d29f2be869b8cf4cf9eda8517931"  # v3: GMAC under SUBKEY
CHUNK_MAC = "14e8b1ff016a611f6c9b2fdc46e4df103af368d39640feaaa1ae574f06fffe19"  # v2
MANIFEST_MAC = "73c0b7ac96107c9a0af4d3c718ddba263d019e13c3df93c5e1e2dfff3dd70a16"


def _chunk(f, payload: bytes = b"\x01\x02\x03\x04" * 4) -> bytes:
    segments = f.make_segments(
        [(0, f.SegmentKind.KV, f.DType.UINT8, (len(payload),), (1,))]
    )
    header = f.make_header(NS, 0, b"\xab" * 16, 16, segments, payload)
    return f.encode_chunk(header, payload)


def test_key_id_is_pinned_and_not_the_key(f) -> None:
    want = hmac.new(KEY, b"kvtier key id", hashlib.sha256).hexdigest()[:16]
    assert f.key_id(KEY) == want == KEY_ID
    assert KEY.hex()[:16] != KEY_ID
    assert f.key_id(OTHER_KEY) != KEY_ID


def test_sealed_chunk_layout_vector(f) -> None:
    plain = _chunk(f)
    sealed = f.seal_chunk(KEY, plain, rank=RANK, salt=SALT)
    assert len(sealed) == len(plain) + 32
    assert struct.unpack_from("<HH", sealed, 8) == (3, 1)  # version 3, the flag
    (hlen,) = struct.unpack_from("<I", sealed, 12)
    assert sealed[hlen:-32] == plain[hlen:]  # the payload is untouched
    subkey = hmac.new(
        KEY, b"kvtier chunk mac v3" + SALT + struct.pack("<I", RANK), hashlib.sha256
    ).digest()
    assert subkey.hex() == SUBKEY == oracle.chunk_subkey(KEY, SALT, RANK).hex()
    assert sealed[-32:] == SALT + bytes.fromhex(CHUNK_TAG)
    assert f.open_chunk(KEY, sealed, rank=RANK) == plain
    f.verify_chunk(f.open_chunk(KEY, sealed, rank=RANK))


def test_chunk_tag_is_aes_gcm_with_the_chunk_as_aad_only(f) -> None:
    """The tag, computed by another AES-GCM than libcrypto's EVP through
    ctypes: the construction is standard GMAC, IV 0^96, no plaintext."""
    from cryptography.hazmat.primitives.ciphers import (
        aead,
    )  # scripts/setup.sh installs it

    sealed = f.seal_chunk(KEY, _chunk(f), rank=RANK, salt=SALT)
    want = aead.AESGCM(bytes.fromhex(SUBKEY)).encrypt(bytes(12), b"", sealed[:-32])
    assert want.hex() == CHUNK_TAG


def test_v2_sealed_chunk_of_an_older_store_still_opens(f) -> None:
    plain = _chunk(f)
    sealed = f.seal_chunk_v2(KEY, plain)
    assert struct.unpack_from("<HH", sealed, 8) == (2, 1)
    want = hmac.new(KEY, sealed[:-32], hashlib.sha256).digest()
    assert sealed[-32:] == want
    assert want.hex() == CHUNK_MAC
    # The v2 seal binds no rank: every rank's reader takes it.
    assert f.open_chunk(KEY, sealed, rank=RANK) == plain
    assert f.open_chunk(KEY, sealed, rank=0) == plain
    with pytest.raises(f.FormatError) as err:
        f.open_chunk(OTHER_KEY, sealed, rank=RANK)
    assert err.value.reason is f.Reason.MAC_MISMATCH


def _mismatch(f, data: bytes, rank: int = RANK) -> None:
    with pytest.raises(f.FormatError) as err:
        f.open_chunk(KEY, data, rank=rank)
    assert err.value.reason is f.Reason.MAC_MISMATCH


def test_forged_chunk_with_valid_crc_and_namespace_is_refused(f) -> None:
    # The attacker can write the folder, knows the namespace hash and the
    # CRC: a fully valid plain chunk with payload of its choosing.
    forged = _chunk(f, b"\xee" * 16)
    f.verify_chunk(forged)  # CRC and namespace alone accept it
    with pytest.raises(f.FormatError) as err:
        f.open_chunk(KEY, forged, rank=RANK)
    assert err.value.reason is f.Reason.MAC_MISSING
    # Sealed with a key it guessed: the MAC differs.
    _mismatch(f, f.seal_chunk(OTHER_KEY, forged, rank=RANK))
    # A genuine chunk with its payload swapped and the CRC fixed up.
    sealed = bytearray(f.seal_chunk(KEY, _chunk(f), rank=RANK))
    (hlen,) = struct.unpack_from("<I", sealed, 12)
    sealed[hlen : hlen + 16] = b"\xee" * 16
    _mismatch(f, bytes(sealed))


def test_another_ranks_chunk_and_tampered_trailers_are_refused(f) -> None:
    sealed = f.seal_chunk(KEY, _chunk(f), rank=RANK, salt=SALT)
    _mismatch(f, sealed, rank=RANK + 1)  # rank 3's genuine file in rank 4's folder
    salted = bytearray(sealed)
    salted[-32] ^= 1  # the salt: another subkey
    _mismatch(f, bytes(salted))
    tagged = bytearray(sealed)
    tagged[-1] ^= 0x80
    _mismatch(f, bytes(tagged))
    _mismatch(f, sealed[:-1])  # cut
    _mismatch(f, sealed + b"\0")  # extended
    # Downgraded to a v2 seal (version 2, header CRC redone): its trailer is
    # no HMAC; a version no seal has is no MAC this reader knows.
    (hlen,) = struct.unpack_from("<I", sealed, 12)
    for version in (2, 1, 4, 0xFFFF):
        changed = bytearray(sealed)
        struct.pack_into("<H", changed, 8, version)
        struct.pack_into("<I", changed, hlen - 4, f.crc32(changed[: hlen - 4]))
        _mismatch(f, bytes(changed))


def test_keyed_chunk_read_without_key_is_refused(f) -> None:
    sealed = f.seal_chunk(KEY, _chunk(f), rank=RANK)
    with pytest.raises(f.FormatError) as err:
        f.verify_chunk(sealed)
    assert err.value.reason is f.Reason.UNSUPPORTED_VERSION  # version 3
    with pytest.raises(f.FormatError) as err:
        f.verify_chunk(f.seal_chunk_v2(KEY, _chunk(f)))
    assert err.value.reason is f.Reason.RESERVED_NONZERO  # a v2 seal: its flag


def test_fresh_salts_so_no_subkey_seals_twice(f) -> None:
    plain = _chunk(f)
    trailers = {f.seal_chunk(KEY, plain, rank=RANK)[-32:] for _ in range(8)}
    assert len({t[:16] for t in trailers}) == 8


def test_no_libcrypto_is_a_clear_error(monkeypatch) -> None:
    """Python has no AES of its own: without a libcrypto the v3 seal cannot
    be checked or made, and says so; a v2 seal (HMAC) still opens."""
    f = oracle  # its own libcrypto binding; the native one: format/mac_test.cpp
    sealed = f.seal_chunk(KEY, _chunk(f), rank=RANK)
    monkeypatch.setattr(f.mac, "_libcrypto_candidates", lambda: [])
    monkeypatch.setattr(f.mac, "_crypto", None)
    with pytest.raises(f.MacUnavailable, match="no libcrypto with AES-256-GCM"):
        f.open_chunk(KEY, sealed, rank=RANK)
    with pytest.raises(f.MacUnavailable):
        f.seal_chunk(KEY, _chunk(f), rank=RANK)
    assert f.open_chunk(KEY, f.seal_chunk_v2(KEY, _chunk(f)), rank=RANK) == _chunk(f)


def test_another_key_is_another_namespace(f) -> None:
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
    f = oracle  # its own libcrypto binding; the native one: format/mac_test.cpp
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


def test_key_file_private_is_loaded(f, tmp_path: Path) -> None:
    assert f.load_key(str(_key_file(tmp_path, 0o600))) == KEY
    assert f.load_key(str(_key_file(tmp_path, 0o400))) == KEY


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644, 0o610])
def test_key_file_others_may_access_is_refused(f, tmp_path: Path, mode: int) -> None:
    path = _key_file(tmp_path, mode)
    with pytest.raises(f.KeyFileError) as err:
        f.load_key(str(path))
    assert str(path) in str(err.value) and f"{mode:04o}" in str(err.value)
    assert KEY.hex() not in str(err.value)


def test_key_file_symlink_short_missing_are_refused(f, tmp_path: Path) -> None:
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


def _manifest(f):
    entry = f.ManifestEntry("ab" * 16, 16, 0x1234)
    return f.BoundaryManifest(
        namespace=NS.hex(),
        rank=0,
        boundary=16,
        chunk_tokens=16,
        chain=("ab" * 16,),
        groups=(f.ManifestGroup(0, f.GROUP_KIND_FULL, (entry,)),),
    )


def test_manifest_encode_decode_with_a_key(f) -> None:
    m = _manifest(f)
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


def test_streaming_seal_equals_seal_chunk_and_headers_read_with_a_key(
    f, tmp_path
) -> None:
    # The streaming sealer is the oracle's (the library seals inside its write
    # call); each codec then reads and checks what it sealed.
    payload = b"\x01\x02\x03\x04" * 4
    plain = _chunk(f, payload)
    (hlen,) = struct.unpack_from("<I", plain, 12)
    head, running = oracle.seal_header(KEY, plain[:hlen], rank=RANK)
    running.update(payload)
    streamed = head + payload + running.digest()
    assert streamed == f.seal_chunk(KEY, plain, rank=RANK, salt=running.salt)
    path = tmp_path / "c.bin"
    path.write_bytes(streamed)
    assert f.read_chunk_header(str(path), KEY) == f.decode_header(plain)
    assert f.verify_chunk_file(str(path), key=KEY, rank=RANK) == f.decode_header(plain)
    with pytest.raises(f.FormatError) as err:
        f.verify_chunk_file(str(path), key=KEY, rank=RANK + 1)
    assert err.value.reason is f.Reason.MAC_MISMATCH
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
