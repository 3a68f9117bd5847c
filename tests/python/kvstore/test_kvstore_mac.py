"""kvstore and a keyed store (issue 38, FORMAT.md 3.6): `verify --key FILE`
checks every chunk's and manifest's MAC (one finding a bad file, exit 1),
the record's key id against the key; without --key a keyed store still
verifies and gc takes none of its sealed files for damage; the key file is
checked as the writer checks it (exit 2) and the key is never printed."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import crc_forge
import pytest
import store_local_support as sls
from kvstore_support import run
from overlay_modules import chunk_fmt, fmt


@pytest.fixture
def kv(kvstore_bin):
    return lambda *args: run(kvstore_bin, *args)


def _key(tmp_path: Path, name: str = "kvtier.key", mode: int = 0o600) -> Path:
    path = tmp_path / name
    path.write_bytes(os.urandom(32))
    path.chmod(mode)
    return path


@pytest.fixture
def keyed(tmp_path):
    """A store the keyed writer wrote (the store library): its root, key file,
    rank base and one full-group chunk's path."""
    key = _key(tmp_path)
    root = tmp_path / "kv"
    store, staging = sls.make_store(root, knobs=sls.knobs(root, key_file=str(key)))
    assert store.active, store.disabled_reason
    maker = sls.JobMaker(staging)
    for job in [
        maker.full_chunks(0, 2),
        *(maker.state(1, g) for g in sls.STATE_GROUPS),
    ]:
        sls.run_job(store, job)
    store.shutdown()
    (base,) = sls.rank_bases(root)
    (chunk,) = [p for p in sls.chunk_files(root) if "_g0/" in str(p)][:1]
    return root, key, base, chunk


def _rank(base: Path) -> int:
    return chunk_fmt.parse_rank_base_name(base.name).rank


def _findings(r) -> list[str]:
    return [
        line
        for line in r.out.splitlines()
        if ": " in line and not line.startswith("verify")
    ]


def test_a_keyed_store_verifies_with_and_without_its_key(kv, keyed):
    root, key, _, _ = keyed
    with_key = kv("verify", "--key", str(key), str(root))
    assert with_key.code == 0, with_key.out + with_key.err
    plain = kv("verify", str(root))
    assert plain.code == 0, plain.out + plain.err  # sealed files parse without it
    plan = kv("gc", "--json", str(root))
    assert plan.code == 0, plan.out + plan.err
    assert json.loads(plan.out)["plan"]["items"] == [], (
        plan.out
    )  # none taken for damage


def test_verify_key_finds_a_forged_chunk_that_every_crc_accepts(kv, keyed):
    root, key, _, chunk = keyed
    sealed = chunk.read_bytes()
    (hlen,) = struct.unpack_from("<I", sealed, 12)
    chunk.write_bytes(crc_forge.forged_sealed_chunk(sealed, hlen))
    assert kv("verify", str(root)).code == 0  # header, CRCs, manifest: all agree
    r = kv("verify", "--key", str(key), str(root))
    assert r.code == 1, r.out + r.err
    rel = str(chunk.relative_to(root))
    lines = _findings(r)
    # The chunk's own finding; its manifest names a damaged file (as for any).
    assert f"{rel}: corrupt: mac_mismatch: chunk MAC differs" in lines, r.out
    in_rank = str(chunk.relative_to(root / rel.split("/")[0]))
    assert len(lines) == 2 and f"names {in_rank}, which is damaged" in lines[1], r.out


def test_verify_key_binds_the_rank_of_the_folder_and_reads_v2_seals(kv, keyed):
    """verify --key takes the rank from the rank base's name: another rank's
    genuine chunk (v3) copied here is mac_mismatch; a chunk of the v2 seal
    an older store holds (no rank in it) still verifies."""
    root, key, base, chunk = keyed
    secret, rank = key.read_bytes(), _rank(base)
    plain = chunk_fmt.open_chunk(secret, chunk.read_bytes(), rank=rank)
    chunk.write_bytes(chunk_fmt.seal_chunk(secret, plain, rank=rank + 1))
    r = kv("verify", "--key", str(key), str(root))
    assert r.code == 1, r.out + r.err
    rel = str(chunk.relative_to(root))
    assert f"{rel}: corrupt: mac_mismatch: chunk MAC differs" in _findings(r), r.out
    chunk.write_bytes(chunk_fmt.seal_chunk_v2(secret, plain))
    r = kv("verify", "--key", str(key), str(root))
    assert r.code == 0, r.out + r.err
    assert kv("verify", str(root)).code == 0  # and without the key


def test_verify_key_finds_a_plain_chunk_planted_in_a_keyed_store(kv, keyed):
    root, key, base, chunk = keyed
    plain = chunk_fmt.open_chunk(key.read_bytes(), chunk.read_bytes(), rank=_rank(base))
    chunk_fmt.verify_chunk(plain)  # a valid chunk of this namespace: anyone writes it
    chunk.write_bytes(bytes(plain))
    r = kv("verify", "--key", str(key), "--json", str(root))
    assert r.code == 1, r.out + r.err
    found = json.loads(r.out)["findings"]
    mine = [f for f in found if f["path"] == str(chunk.relative_to(root))]
    assert [(f["kind"], f["detail"]) for f in mine] == [
        ("corrupt", "mac_missing: chunk has no MAC; the store is keyed")
    ], found
    assert [f["kind"] for f in found if f not in mine] == ["mismatch"], found


def test_verify_key_finds_a_forged_manifest(kv, keyed, tmp_path):
    root, key, base, _ = keyed
    (path,) = (base / fmt.MANIFEST_DIR).glob("*.json")
    manifest = fmt.decode_manifest(path.read_bytes(), key.read_bytes())
    path.write_bytes(fmt.encode_manifest(manifest, os.urandom(32)))  # a guessed key
    r = kv("verify", "--key", str(key), str(root))
    assert r.code == 1, r.out + r.err
    rel = str(path.relative_to(root))
    assert f"{rel}: bad-manifest: mac_mismatch: manifest mac differs" in _findings(r), (
        r.out
    )


def test_verify_with_another_key_says_so_once(kv, keyed, tmp_path):
    root, _, base, _ = keyed
    other = _key(tmp_path, "other.key")
    r = kv("verify", "--key", str(other), str(root))
    assert r.code == 1, r.out + r.err
    lines = _findings(r)
    assert len(lines) == 1 and "written with another key" in lines[0], r.out
    assert lines[0].startswith(f"{base.name}.json: bad-namespace: ")


def test_a_key_file_others_may_read_is_refused_and_never_printed(kv, keyed, tmp_path):
    root, key, _, _ = keyed
    key.chmod(0o640)
    r = kv("verify", "--key", str(key), "--json", str(root))
    assert r.code == 2, r.out + r.err
    assert f"key file {key} has mode 0640" in r.err
    secret = key.read_bytes()
    for text in (r.out, r.err):
        assert secret.hex() not in text and secret.hex()[:16] not in text
    key.chmod(0o600)
    ok = kv("verify", "--key", str(key), "--json", str(root))
    assert ok.code == 0 and secret.hex() not in ok.out + ok.err
    assert str(key) not in ok.out  # not even its path in the report


def test_inspect_reads_a_sealed_chunk_and_says_its_mac_is_not_checked(kv, keyed):
    _, _, _, chunk = keyed
    r = kv("inspect", "--json", str(chunk))
    assert r.code == 0, r.out + r.err
    doc = json.loads(r.out)
    assert doc["valid"] and doc["sealed"] and doc["payload"] == "ok"
    assert doc["file_size"] == chunk.stat().st_size
    assert doc["header_length"] + doc["payload_length"] + 32 == doc["file_size"]
    text = kv("inspect", str(chunk)).out
    assert "mac                 present, not checked (kvstore verify --key)" in text
    data = bytearray(chunk.read_bytes())
    data[doc["header_length"]] ^= 1  # the payload, before the MAC
    chunk.write_bytes(bytes(data))
    bad = kv("inspect", "--json", str(chunk))
    assert (
        bad.code == 1 and json.loads(bad.out)["payload"] == "payload_checksum_mismatch"
    )


# -- issue 45, the smaller findings ---------------------------------------


def test_verify_without_the_key_says_the_macs_went_unchecked(kv, keyed):
    root, key, _, _ = keyed
    plain = kv("verify", str(root))
    assert plain.code == 0, plain.out + plain.err
    assert "MACs not checked in 1 keyed rank(s) (give --key FILE" in plain.out
    doc = json.loads(kv("verify", "--json", str(root)).out)
    assert doc["summary"]["macs_unchecked"] == 1 == doc["summary"]["keyed_ranks"]
    checked = kv("verify", "--key", str(key), str(root))
    assert checked.code == 0 and "MACs not checked" not in checked.out


def test_verify_without_the_key_finds_unsealed_files_in_a_keyed_store(kv, keyed):
    """The record fences a mac_key_id, which verify reads without the key:
    a plain chunk or a manifest without "mac" is mac_missing there too."""
    root, key, base, chunk = keyed
    plain = chunk_fmt.open_chunk(key.read_bytes(), chunk.read_bytes(), rank=_rank(base))
    chunk.write_bytes(bytes(plain))
    (path,) = (base / fmt.MANIFEST_DIR).glob("*.json")
    manifest = fmt.decode_manifest(path.read_bytes(), key.read_bytes())
    path.write_bytes(fmt.encode_manifest(manifest))  # no "mac"
    r = kv("verify", str(root))
    assert r.code == 1, r.out + r.err
    lines = _findings(r)
    rel = str(chunk.relative_to(root))
    assert f"{rel}: corrupt: mac_missing: chunk has no MAC; the store is keyed" in lines
    mrel = str(path.relative_to(root))
    assert any(line.startswith(f"{mrel}: bad-manifest: mac_missing") for line in lines)
    # gc (no key, nothing to judge a seal with) plans no deletion of them.
    plan = json.loads(kv("gc", "--json", str(root)).out)
    assert plan["plan"]["items"] == [], plan


def test_a_manifest_key_spelled_with_escapes_is_read_alike(kv, keyed):
    """`"\\u006dac"` is the key "mac" to JSON: the restore's Python codec used
    such a manifest, while the C++ reader (looking for the bytes "mac")
    called it mac_missing under --key and gc refused the sweep."""
    root, key, base, _ = keyed
    (path,) = (base / fmt.MANIFEST_DIR).glob("*.json")
    data = path.read_bytes()
    assert data.count(b'"mac":') == 1
    path.write_bytes(data.replace(b'"mac":', b'"\\u006dac":'))
    assert fmt.decode_manifest(path.read_bytes(), key.read_bytes()) is not None
    r = kv("verify", "--key", str(key), str(root))
    assert r.code == 0, r.out + r.err
    done = kv("gc", "--sweep", str(root))
    assert done.code == 0, done.out + done.err
    assert path.exists()


@pytest.mark.parametrize("cut", [-32, -1, 1, 32])
def test_verify_key_judges_a_sealed_chunk_by_its_mac_first(kv, keyed, cut):
    """FORMAT.md 3.6 and the restore: a keyed file's MAC is judged before
    anything else, so a chunk with its MAC cut, or bytes appended, is
    mac_mismatch; verify --key called them truncated / trailing_bytes."""
    root, key, _, chunk = keyed
    data = chunk.read_bytes()
    chunk.write_bytes(data[:cut] if cut < 0 else data + b"\0" * cut)
    r = kv("verify", "--key", str(key), str(root))
    assert r.code == 1, r.out + r.err
    rel = str(chunk.relative_to(root))
    mine = [line for line in _findings(r) if line.startswith(f"{rel}: ")]
    assert mine == [f"{rel}: corrupt: mac_mismatch: chunk MAC differs"], r.out


def test_verify_refuses_a_key_inside_the_store_or_all_zero(kv, keyed, tmp_path):
    root, key, _, _ = keyed
    inside = root / "kvtier.key"
    inside.write_bytes(key.read_bytes())
    inside.chmod(0o600)
    r = kv("verify", "--key", str(inside), str(root))
    assert r.code == 2, r.out + r.err
    assert f"key file {inside} is inside the store folder {root}: refused" in r.err
    inside.unlink()
    zero = _key(tmp_path, "zero.key")
    zero.write_bytes(bytes(32))
    r = kv("verify", "--key", str(zero), str(root))
    assert r.code == 2, r.out + r.err
    assert f"key file {zero} holds only zero bytes" in r.err
