"""kvstore and a store others can change (issue 38, docs/DEPLOY.md
"Security"): verify reports it as an `unsafe-folder` finding (exit 1), and
gc --sweep refuses it (exit 4) without deleting anything."""

from __future__ import annotations

import json
import os

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


def _inner(store: Store, which: str):
    """A folder of the rank base (issue 45): its path and its name as
    kvstore reports it (relative to the tier folder)."""
    chunk = next(store.base.rglob("*.bin"))
    path = {
        "rank": store.base,
        "manifests": store.base / "manifests",
        "top": chunk.parent.parent,
        "leaf": chunk.parent,
    }[which]
    return path, str(path.relative_to(store.tier))


def _snapshot(store: Store) -> dict[str, bytes]:
    """Every file's bytes (.lock left out: a sweep makes it to lock the rank)."""
    return {
        str(p): p.read_bytes()
        for p in sorted(store.tier.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


@pytest.mark.parametrize("which", ["rank", "manifests", "top", "leaf"])
def test_an_inner_folder_others_can_write_is_a_finding_and_refuses_the_sweep(
    kv, store, which
):
    """Issue 45, 3: the unsafe-folder check stopped at the store folder: a rank
    folder, manifests/ or a chunk folder with mode 0777 passed verify (exit 0)
    and the sweep. Each is an unsafe-folder finding, and the sweep refuses
    the rank (--force too), nothing deleted."""
    path, rel = _inner(store, which)
    path.chmod(0o777)
    r = kv("verify", str(store.tier))
    assert r.code == 1, r.out + r.err
    line = (
        f"{rel}: unsafe-folder: {rel} (mode 0777, uid 0) is group- and world-writable"
    )
    assert line in r.out.splitlines(), r.out
    before = _snapshot(store)
    for force in ([], ["--force"]):
        r = kv("gc", "--sweep", *force, str(store.tier))
        assert r.code == 4, r.out + r.err
        assert f"{rel}: store folder not safe: {rel} (mode 0777" in r.out + r.err
        assert _snapshot(store) == before
    path.chmod(0o700)
    assert "unsafe-folder" not in kv("verify", str(store.tier)).out


@pytest.mark.parametrize("which", ["rank", "manifests", "top", "leaf"])
def test_an_inner_folder_made_a_symlink_is_a_finding_not_followed(
    kv, store, tmp_path, which
):
    """Issue 45, 2: a store folder replaced by a link to a copy of it. kvstore
    never followed it, but called the store `mismatch` (and a linked rank
    folder "no store here", exit 8): it is an unsafe-folder finding about
    the link, and the sweep refuses."""
    path, rel = _inner(store, which)
    copy = tmp_path / "copy"
    path.rename(copy)
    path.symlink_to(copy)
    r = kv("verify", str(store.tier))
    assert r.code == 1, r.out + r.err
    assert f"{rel}: unsafe-folder: {rel} is a symlink where a " in r.out, r.out
    before = _snapshot(store)
    r = kv("gc", "--sweep", str(store.tier))
    assert r.code in (1, 4), r.out + r.err
    assert _snapshot(store) == before


def test_a_root_sweep_leaves_the_lock_to_the_store_owner(kv, store):
    """Issue 45, 5: `kvstore gc --sweep` as root made a missing .lock
    root:root 0600, and the serving user's writer could not open it at its
    next boot (`Permission denied: .../.lock`). The lock kvstore makes is
    the rank folder owner's."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    serving = 65534
    for path in [store.tier, *store.tier.rglob("*")]:
        os.chown(path, serving, serving, follow_symlinks=False)
    lock = store.base / ".lock"
    lock.unlink(missing_ok=True)
    r = kv("gc", "--sweep", str(store.tier))
    assert r.code == 0, r.out + r.err
    st = lock.stat()
    # 0600 and the serving user's: its writer's O_RDWR open works again.
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (serving, serving, 0o600)
