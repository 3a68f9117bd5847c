"""kvstore and a store others can change (issue 38, docs/DEPLOY.md
"Security"): verify reports it as an `unsafe-folder` finding (exit 1), and
gc --sweep refuses it (exit 4) without deleting anything."""

from __future__ import annotations

import json

import pytest
from kvstore_support import FULL_GROUP, Store, age_tree, key_of, run


@pytest.fixture
def kv(kvstore_bin):
    return lambda *args: run(kvstore_bin, *args)


@pytest.fixture
def store(tmp_path) -> Store:
    s = Store(tmp_path / "tier")
    s.boundary(["a"])
    s.chunk(key_of("orphan"), FULL_GROUP, 64)  # what a sweep would delete
    age_tree(s.tier)
    return s


def chunk_files(store: Store) -> list[str]:
    return sorted(str(p) for p in store.tier.rglob("*.bin"))


def test_a_safe_store_verifies_clean_of_it(kv, store):
    r = kv("verify", "--json", str(store.tier))
    kinds = {f["kind"] for f in json.loads(r.out)["findings"]}
    assert "unsafe-folder" not in kinds, r.out


@pytest.mark.parametrize("where", ["store", "above"])
def test_verify_reports_a_writable_folder(kv, store, where):
    folder = store.tier if where == "store" else store.tier.parent
    folder.chmod(0o777)
    r = kv("verify", str(store.tier))
    assert r.code == 1, r.out + r.err
    line = f".: unsafe-folder: {folder} (mode 0777, uid 0) is group- and world-writable"
    assert line in r.out.splitlines(), r.out


def test_verify_reports_a_symlink_above(kv, store, tmp_path):
    (tmp_path / "link").symlink_to(tmp_path)
    r = kv("verify", str(tmp_path / "link" / "tier"))
    assert r.code == 1, r.out + r.err
    assert f".: unsafe-folder: {tmp_path / 'link'} is a symlink" in r.out


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o1777])
def test_sweep_refuses_a_writable_store_and_deletes_nothing(kv, store, mode):
    before = chunk_files(store)
    assert (
        kv("gc", str(store.tier)).out.count("would delete") >= 1
    )  # something to sweep
    store.tier.chmod(mode)
    r = kv("gc", "--sweep", str(store.tier))
    assert r.code == 4, r.out + r.err
    assert (
        f"kvstore: sweep refused, nothing deleted: store folder not safe: {store.tier} "
        f"(mode {mode:04o}, uid 0) is"
    ) in r.err
    assert chunk_files(store) == before
    store.tier.chmod(0o755)
    assert kv("gc", "--sweep", str(store.tier)).code == 0
    assert len(chunk_files(store)) < len(before)  # the refusal was the folder's mode
