"""kv-offload-store-local: every folder below the store folder (issue 45).

The writer (the native library, as vLLM runs it) put chunks and manifests
through a chunk folder, `manifests/` or a rank folder replaced by a symlink
to elsewhere, and wrote into folders others could write (mode 0777): the
check of docs/DEPLOY.md "Security" stopped at the store folder. Now a link
anywhere on a store path is refused (never followed), and each folder of
the rank base is checked like the store folder: at boot (the rank base,
`manifests/`, `pending/`: the boot is refused, one line naming the
folder) or at its first use (a chunk folder: nothing written into it or
taken from it, the key's write fails and says why).
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

import pytest
import store_local_support as sls
from kv_store_format import native
from kv_store_local.errors import StoreRefused
from store_local_support import fmt


@pytest.fixture(scope="module")
def lib():
    path = native.library_path()
    if not os.path.isfile(path):
        pytest.skip(f"{path} is not built (set KVTIER_BUILD_DIR or build kvtier_store)")
    return native.load(path)


def first_tree(root: Path, lib) -> fmt.StoreLayout:
    """One published boundary (branch 0), the writer shut down cleanly."""
    store, staging = sls.make_store(root, store_lib=lib)
    assert store.active, store.disabled_reason
    maker = sls.JobMaker(staging)
    sls.run_job(store, maker.full_chunks(0, 1))
    for g in sls.STATE_GROUPS:
        sls.run_job(store, maker.state(0, g))
    layout = store.writer.layout
    store.shutdown()
    assert len(sls.manifests(Path(layout.base))) == 1
    return layout


def files_under(folder: Path) -> list[str]:
    return sorted(str(p) for p in folder.rglob("*"))


@pytest.mark.parametrize("which", ["rank", "manifests"])
@pytest.mark.parametrize("how", ["link", "0777"])
def test_a_rank_folder_others_could_change_refuses_the_boot(tmp_path, lib, which, how):
    root = tmp_path / "kv"
    layout = first_tree(root, lib)
    path = Path(layout.base if which == "rank" else layout.manifest_dir)
    elsewhere = tmp_path / "elsewhere"
    if how == "link":
        path.rename(elsewhere)
        path.symlink_to(elsewhere)
        want = f"store folder not safe: {path} is a symlink"
    else:
        path.chmod(0o777)
        want = f"store folder not safe: {path} (mode 0777, uid {os.geteuid()}) is "
    before = files_under(tmp_path)
    refused = re.escape(f"KV store: GLM53_KV_OFFLOAD=1 is refused on this rank: {want}")
    with pytest.raises(StoreRefused, match=f"^{refused}"):
        sls.make_store(root, store_lib=lib)
    assert files_under(tmp_path) == before  # nothing written, here or there


def next_leaf(layout: fmt.StoreLayout, branch: int) -> Path:
    """The chunk folder the next job's key (chunk 0 of ``branch``, group 0)
    goes to; its top folder not made yet."""
    path = Path(layout.chunk(sls.block_hash(0, branch).hex(), 0))
    assert not path.parent.parent.exists()
    return path.parent


@pytest.mark.parametrize("which", ["top", "leaf"])
@pytest.mark.parametrize("how", ["link", "0777"])
def test_a_chunk_folder_others_could_change_gets_no_chunk(tmp_path, lib, which, how):
    """The writer is up; the key whose folder is a link (to a real folder
    elsewhere) or writable by others is not written (keys_failed, a warning
    naming the folder), no manifest names it, nothing lands elsewhere."""
    root = tmp_path / "kv"
    layout = first_tree(root, lib)
    leaf = next_leaf(layout, branch=1)
    folder = leaf if which == "leaf" else leaf.parent
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    if which == "leaf":
        leaf.parent.mkdir(mode=0o700)
    if how == "link":
        if which == "top":
            (elsewhere / leaf.name).mkdir(mode=0o700)
        folder.symlink_to(elsewhere)
    else:
        folder.mkdir(mode=0o700)
        folder.chmod(0o777)
        if which == "top":
            leaf.mkdir(mode=0o700)
    store, staging = sls.make_store(root, store_lib=lib)
    assert store.active, store.disabled_reason
    maker = sls.JobMaker(staging)
    job = maker.full_chunks(0, 1, branch=1)
    sls.run_job(store, job)
    for g in sls.STATE_GROUPS:
        sls.run_job(store, maker.state(0, g, branch=1))
    stats = store.stats
    store.shutdown()
    # The top folder holds every group's folder of that key: all five fail.
    failed = 1 if which == "leaf" else 5
    assert stats.keys_failed == failed and stats.keys_written == 5 - failed
    assert not any(p.is_file() for p in elsewhere.rglob("*"))
    assert not any(leaf.glob("*.bin")) if how == "0777" else True
    names = {m.chain[0] for m in sls.manifests(Path(layout.base)).values()}
    assert names == {sls.block_hash(0, 0).hex()}  # branch 1 never published
    assert sls.verify_store(root) == []


@pytest.mark.parametrize("how", ["link", "0777"])
def test_a_chunk_in_a_folder_others_could_change_is_never_deduplicated(
    tmp_path, lib, how
):
    """A chunk folder of the published tree moved elsewhere and linked back,
    or made writable by others (every chunk in it genuine): the writer once
    deduplicated onto what it found through the link and republished. It
    takes nothing through a link or from such a folder, though the file
    reads well (the lookup opens the file before it checks the folder)."""
    root = tmp_path / "kv"
    layout = first_tree(root, lib)
    chunk = Path(layout.chunk(sls.block_hash(0, 0).hex(), 0))
    elsewhere = tmp_path / "elsewhere"
    if how == "link":
        chunk.parent.rename(elsewhere)
        chunk.parent.symlink_to(elsewhere)
    else:
        chunk.parent.chmod(0o777)
        elsewhere = chunk.parent
    kept = elsewhere / chunk.name
    before = kept.read_bytes()
    store, staging = sls.make_store(root, store_lib=lib)
    assert store.active, store.disabled_reason
    maker = sls.JobMaker(staging)
    sls.run_job(store, maker.full_chunks(0, 1))
    stats = store.stats
    store.shutdown()
    assert stats.keys_deduplicated == 0 and stats.keys_failed == 1
    assert kept.read_bytes() == before and sorted(elsewhere.iterdir()) == [kept]


@pytest.mark.parametrize("walk", [False, True], ids=["openat2", "walk"])
def test_a_store_open_never_follows_a_link_on_the_path(tmp_path, monkeypatch, walk):
    """The codec's open (every Python read and create of a store file):
    a symlink as the file or as any folder on the way is refused (ELOOP),
    with openat2 and with the component walk kernels without it get."""
    from kv_store_format import store_file

    if walk:
        monkeypatch.setattr(store_file, "_WALK", native.OPEN_WALK)
    real = tmp_path / "real" / "leaf"
    real.mkdir(parents=True)
    (real / "f").write_bytes(b"bytes")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    (real / "flink").symlink_to(real / "f")
    fd = fmt.open_nofollow(str(real / "f"), os.O_RDONLY)
    assert os.read(fd, 9) == b"bytes"
    os.close(fd)
    for path in ("link/leaf/f", "link/leaf", "link", "real/leaf/flink"):
        with pytest.raises(OSError) as err:
            fmt.open_nofollow(str(tmp_path / path), os.O_RDONLY)
        assert err.value.errno == errno.ELOOP and "symlink" in str(err.value), path
    with pytest.raises(FileNotFoundError):
        fmt.open_nofollow(str(real / "missing"), os.O_RDONLY)
    made = fmt.open_nofollow(
        str(real / "new"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600
    )
    os.close(made)
    assert (real / "new").is_file()
    with pytest.raises(OSError) as err:
        fmt.open_nofollow(
            str(tmp_path / "link" / "leaf" / "new2"),
            os.O_WRONLY | os.O_CREAT | os.O_EXCL,
            0o600,
        )
    assert err.value.errno == errno.ELOOP
    assert not (real / "new2").exists()
