"""Keyed stores at the writer (issue 38, FORMAT.md 3.6): with
GLM53_KV_OFFLOAD_KEY_FILE set, the writer (its chunks through the native
store library) seals every chunk and manifest, the key's id is fenced in the namespace (another
key: another folder, never a load), and a key file others may read is
refused at boot before anything is created."""

from __future__ import annotations

import json
import os
import re
import struct
import sys
from pathlib import Path

import pytest
import store_local_support as sls
from conftest import REPO_ROOT
from kv_store_format import native
from kv_store_local.errors import StoreRefused
from overlay_modules import chunk_fmt, fmt

_RESTORE = REPO_ROOT / "overlays" / "kv-offload-restore"
if str(_RESTORE) not in sys.path:
    sys.path.insert(0, str(_RESTORE))

# A key file problem at boot refuses the tier the knob asked for (fail closed).
REFUSED = "KV store: GLM53_KV_OFFLOAD=1 is refused on this rank: "


def _key(tmp_path: Path, mode: int = 0o600, name: str = "kvtier.key") -> Path:
    path = tmp_path / name
    path.write_bytes(os.urandom(32))
    path.chmod(mode)
    return path


@pytest.fixture
def store_lib():
    """The writer's only path to chunk files: the build's store library."""
    return sls.store_library()


def _write(root: Path, key: Path | None, store_lib) -> tuple:
    knobs = sls.knobs(root, key_file=str(key) if key else "")
    store, staging = sls.make_store(root, knobs=knobs, store_lib=store_lib)
    assert store.active, store.disabled_reason
    maker = sls.JobMaker(staging)
    jobs = [maker.full_chunks(0, 2)]
    jobs += [maker.state(1, g) for g in sls.STATE_GROUPS]
    for job in jobs:
        sls.run_job(store, job)
    store.shutdown()
    return store, jobs


def test_a_key_file_others_may_read_is_refused_at_boot(tmp_path):
    key = _key(tmp_path, 0o644)
    root = tmp_path / "kv"
    refused = re.escape(
        f"{REFUSED}key file {key} has mode 0644: group/other may access it (chmod 600)"
    )
    with pytest.raises(StoreRefused, match=f"^{refused}$"):
        sls.make_store(root, knobs=sls.knobs(root, key_file=str(key)))
    assert not root.exists()  # refused before anything was made


def test_keyed_writer_seals_every_chunk_and_manifest(tmp_path, store_lib):
    key_file = _key(tmp_path)
    key = key_file.read_bytes()
    root = tmp_path / "kv"
    store, jobs = _write(root, key_file, store_lib)
    assert store.stats.keys_written == 6
    (base,) = sls.rank_bases(root)
    layout = fmt.StoreLayout(str(root), base.name)
    for job in jobs:
        for (hash_, group), payload in job.expected.items():
            data = Path(layout.chunk(hash_.hex(), group)).read_bytes()
            # Sealed (v3): a keyless reader refuses it, the key opens it
            # for this rank only.
            with pytest.raises(fmt.FormatError) as err:
                chunk_fmt.verify_chunk(data)
            assert err.value.reason is fmt.Reason.UNSUPPORTED_VERSION
            assert struct.unpack_from("<H", data, 8) == (fmt.SEALED_VERSION,)
            header = chunk_fmt.verify_sealed_chunk(key, data, rank=store.writer.rank)
            with pytest.raises(fmt.FormatError) as err:
                chunk_fmt.verify_sealed_chunk(key, data, rank=store.writer.rank + 1)
            assert err.value.reason is fmt.Reason.MAC_MISMATCH
            assert data[header.header_length : -fmt.MAC_SIZE] == payload
    (manifest,) = sls.manifests(base, key).values()
    assert manifest.boundary == 32
    with pytest.raises(fmt.FormatError):
        sls.manifests(base)  # no keyless reader takes it
    assert sls.verify_store(root, key) == []
    record = fmt.decode_namespace_record(Path(layout.namespace_record).read_bytes())
    assert record.fenced["mac_key_id"] == fmt.key_id(key)
    for path in [
        *sls.chunk_files(root),
        *base.rglob("*.json"),
        Path(layout.namespace_record),
    ]:
        assert key.hex() not in path.read_bytes().decode("latin-1")
        assert key not in path.read_bytes()[:-32]  # never the key itself


def test_keyed_writer_dedups_onto_its_own_sealed_chunks(tmp_path, store_lib):
    key_file = _key(tmp_path)
    root = tmp_path / "kv"
    _write(root, key_file, store_lib)
    again, _ = _write(root, key_file, store_lib)  # a restart, the same key
    assert again.stats.keys_written == 0 and again.stats.keys_deduplicated == 6
    assert sls.verify_store(root, key_file.read_bytes()) == []


def test_another_key_is_another_namespace_never_a_load(tmp_path, store_lib):
    root = tmp_path / "kv"
    first = _key(tmp_path, name="one.key")
    second = _key(tmp_path, name="two.key")
    _write(root, first, store_lib)
    other, _ = _write(root, second, store_lib)
    plain, _ = _write(root, None, store_lib)
    bases = sls.rank_bases(root)
    assert len(bases) == 3  # three namespaces side by side
    # Nothing of the first key's store was taken: every key written anew.
    assert other.stats.keys_deduplicated == 0 and other.stats.keys_written == 6
    assert plain.stats.keys_deduplicated == 0 and plain.stats.keys_written == 6
    assert other.writer.layout.base != plain.writer.layout.base


def test_a_plain_chunk_planted_in_a_keyed_store_is_not_dedup_d(tmp_path, store_lib):
    """Someone who can write the folder plants a plain chunk (valid CRC and
    namespace hash) before the writer writes that key: the keyed writer never
    takes it for its own, it writes the key anew."""
    key_file = _key(tmp_path)
    root = tmp_path / "kv"
    store, jobs = _write(root, key_file, store_lib)
    layout = store.writer.layout
    (hash_, group), payload = next(iter(jobs[0].expected.items()))
    path = layout.chunk(hash_.hex(), group)
    sealed = Path(path).read_bytes()
    plain = chunk_fmt.open_chunk(key_file.read_bytes(), sealed, rank=store.writer.rank)
    chunk_fmt.verify_chunk(plain)  # CRC and namespace hash are right
    Path(path).write_bytes(bytes(plain))
    again, _ = _write(root, key_file, store_lib)
    assert again.stats.keys_written == 1 and again.stats.keys_deduplicated == 5
    rewritten = Path(path).read_bytes()
    # Sealed again: the same header and payload, a fresh salt (so a new tag).
    assert rewritten[:-32] == sealed[:-32] and rewritten[-32:-16] != sealed[-32:-16]
    assert (
        chunk_fmt.open_chunk(key_file.read_bytes(), rewritten, rank=again.writer.rank)
        == plain
    )


def _set_manifest_mac(base: Path, mac: str) -> Path:
    """A kept manifest's ``"mac"`` value replaced (the file's JSON stays
    valid; its checksum does not cover the MAC)."""
    (path,) = (base / fmt.MANIFEST_DIR).glob("*.json")
    manifest = json.loads(path.read_bytes())
    manifest["mac"] = mac
    path.write_text(json.dumps(manifest, ensure_ascii=False), encoding="utf-8")
    return path


@pytest.mark.parametrize("mac", ["\u00e9" * 64, "\U0001f511" * 64, "A" * 64])
def test_a_manifest_mac_that_is_no_hex_is_one_mac_mismatch(tmp_path, mac):
    """Issue 45, 1: a kept manifest whose "mac" is not ASCII made
    hmac.compare_digest raise TypeError out of the writer's boot (and out of
    every restore scan and budget rescan). It is that manifest's
    mac_mismatch, nothing else is affected."""
    lib = native.load(native.library_path())
    key_file = _key(tmp_path)
    key = key_file.read_bytes()
    root = tmp_path / "kv"
    _write(root, key_file, lib)
    (base,) = sls.rank_bases(root)
    path = _set_manifest_mac(base, mac)
    with pytest.raises(fmt.FormatError) as err:
        fmt.decode_manifest(path.read_bytes(), key)
    assert err.value.reason is fmt.Reason.MAC_MISMATCH
    # The writer boots (with its disk budget, whose scan reads the manifests
    # too), does not take the manifest for its own, and writes on.
    knobs = sls.knobs(root, key_file=str(key_file), disk_bytes=1 << 30)
    store, staging = sls.make_store(root, knobs=knobs, store_lib=lib)
    assert store.active, store.disabled_reason
    assert path.name not in store.writer.published
    index = store.writer.budget.rescan()
    assert str(path) not in index._root_of
    maker = sls.JobMaker(staging)
    sls.run_job(store, maker.full_chunks(0, 3, branch=1))
    assert store.stats.keys_written == 3
    store.shutdown()
    # The restore's inventory rejects that manifest and loads the others.
    import kv_restore_inventory

    record = fmt.decode_namespace_record(
        Path(store.writer.layout.namespace_record).read_bytes()
    )
    inventory = kv_restore_inventory.Inventory(
        str(base / fmt.MANIFEST_DIR), record.namespace_hash, sls.RANK, key
    )
    loaded, rejected = inventory.scan()
    assert (loaded, rejected) == (0, 1)
    assert path.name in inventory.bad


def test_a_key_inside_the_store_folder_or_all_zero_is_refused_at_boot(tmp_path):
    """Issue 45: a key kept in the store folder (whoever can write the store
    can read or swap it; kvstore called it `foreign`) and an all-zero key
    were accepted. Both refuse the boot, one line, nothing written."""
    root = tmp_path / "kv"
    root.mkdir(mode=0o700)
    inside = _key(root, name="kvtier.key")
    inside_problem = re.escape(
        f"{REFUSED}key file {inside} is inside the store folder {root}: refused"
    )
    with pytest.raises(StoreRefused, match=f"^{inside_problem}"):
        sls.make_store(root, knobs=sls.knobs(root, key_file=str(inside)))
    assert sorted(root.iterdir()) == [inside]
    zero = tmp_path / "zero.key"
    zero.write_bytes(bytes(32))
    zero.chmod(0o600)
    zero_problem = re.escape(f"{REFUSED}key file {zero} holds only zero bytes")
    with pytest.raises(StoreRefused, match=f"^{zero_problem}"):
        sls.make_store(root, knobs=sls.knobs(root, key_file=str(zero)))
    assert sorted(root.iterdir()) == [inside]


def test_a_fifo_as_the_key_file_is_refused_not_waited_on(tmp_path):
    """load_key once opened a FIFO blocking and hung the boot. The store
    library's check (format/key_file.cpp) refuses it without opening it; a
    FIFO swapped in after its first look is refused on the descriptor (the
    open does not block): format/key_file_test.cpp swaps one in."""
    import signal

    fifo = tmp_path / "fifo.key"
    os.mkfifo(fifo, 0o600)

    def hung(signum, frame):
        raise TimeoutError("load_key blocked on the FIFO")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(10)
    try:
        with pytest.raises(fmt.KeyFileError, match="is not a regular file: refused"):
            fmt.load_key(str(fifo))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
