"""Who may read and change the store (kv_store_local.store_perms, issue 38).

The writer creates everything private to the serving user whatever the
umask (or readable by the knob's group), another uid cannot read a chunk or
the namespace record, and a store folder others can change is refused at
boot with one line naming the folder and its mode.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest
import store_local_support as sls
from kv_store_format import native
from kv_store_local import store_perms as perms
from kv_store_local.errors import StoreRefused

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (chown, setpriv)")

# What every boot-time problem starts with: GLM53_KV_OFFLOAD=1 asked for the
# tier, so an unsafe store refuses the boot (fail closed).
REFUSED = re.escape("KV store: GLM53_KV_OFFLOAD=1 is refused on this rank: ")


@pytest.fixture(autouse=True)
def private_modes():
    yield
    perms.use(perms.Modes())  # the process-wide modes, as a new process has them


@pytest.fixture
def open_tmp():
    """A folder every user may enter (the pytest tmp folders are 0700): only
    the store's own modes then keep another uid out."""
    d = tempfile.mkdtemp(prefix="kvtier-perms-", dir="/tmp")
    os.chmod(d, 0o755)
    yield Path(d)
    shutil.rmtree(d)


def write_some(root: Path, **knob_overrides):
    store, staging = sls.make_store(root, knobs=sls.knobs(root, **knob_overrides))
    assert store.active, store.disabled_reason
    maker = sls.JobMaker(staging)
    for job in [maker.full_chunks(0, 3)] + [
        maker.state(2, g) for g in sls.STATE_GROUPS
    ]:
        sls.run_job(store, job)
    store.writer.flush()
    return store


def modes_under(root: Path) -> tuple[dict[str, int], dict[str, int]]:
    dirs = {str(root): stat.S_IMODE(os.lstat(root).st_mode)}
    files = {}
    for here, subdirs, names in os.walk(root):
        for d in subdirs:
            dirs[os.path.join(here, d)] = stat.S_IMODE(
                os.lstat(os.path.join(here, d)).st_mode
            )
        for n in names:
            files[os.path.join(here, n)] = stat.S_IMODE(
                os.lstat(os.path.join(here, n)).st_mode
            )
    return dirs, files


@pytest.mark.parametrize("mask", [0o000, 0o022, 0o077])
def test_everything_the_writer_creates_is_private_whatever_the_umask(tmp_path, mask):
    root = tmp_path / "tier" / "kv"  # both folders made by the writer
    old = os.umask(mask)
    try:
        store = write_some(root)
        store.writer._pending_file.update({(0, "ab" * 32)})  # the pending record
        dirs, files = modes_under(tmp_path / "tier")
    finally:
        os.umask(old)
    kinds = {Path(f).suffix for f in files}
    assert {".json", ".bin"} <= kinds, kinds  # records, manifests, chunks
    assert store.writer.layout.lock in files
    assert store.writer.layout.namespace_record in files
    assert any("pending" in f for f in files)
    assert {m for m in dirs.values()} == {0o700}, dirs
    assert {m for m in files.values()} == {0o600}, files


def test_the_group_knob_makes_it_group_readable_never_world(tmp_path):
    root = tmp_path / "kv"
    old = os.umask(0o077)  # would take the group's bits away
    try:
        write_some(root, group="root")
        dirs, files = modes_under(root)
    finally:
        os.umask(old)
    assert set(dirs.values()) == {0o2750}, dirs
    assert set(files.values()) == {0o640}, files
    assert {os.lstat(p).st_gid for p in [*dirs, *files]} == {0}


def test_a_group_the_serving_user_is_not_in_is_refused(tmp_path):
    with pytest.raises(perms.UnsafeStore, match="does not exist"):
        perms.modes_for_group("no-such-group-kvtier")
    with pytest.raises(StoreRefused, match=REFUSED + ".*not in group 'nogroup'"):
        sls.make_store(
            tmp_path / "kv", knobs=sls.knobs(tmp_path / "kv", group="nogroup")
        )
    assert not (tmp_path / "kv").exists()  # refused before anything was made


def read_as_nobody(path: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "cat", path],
        capture_output=True,
    )


def test_another_uid_cannot_read_a_chunk_or_the_namespace_record(open_tmp):
    root = open_tmp / "kv"
    store = write_some(root)
    layout = store.writer.layout
    (chunk,) = [
        os.path.join(d, n)
        for d, _, names in os.walk(layout.base)
        for n in names
        if n.endswith(".bin")
    ][:1]
    for path in (chunk, layout.namespace_record):
        denied = read_as_nobody(path)
        assert denied.returncode != 0
        assert b"Permission denied" in denied.stderr, denied.stderr
    # The same reader gets through where the modes would let it: the
    # refusal above is the store's modes, not the test's setup.
    control = open_tmp / "control.txt"
    control.write_bytes(b"visible")
    control.chmod(0o644)
    assert read_as_nobody(str(control)).stdout == b"visible"


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o757, 0o1777])
def test_a_store_folder_others_can_change_is_refused_at_boot(tmp_path, mode):
    root = tmp_path / "kv"
    root.mkdir()
    root.chmod(mode)
    problem = re.escape(f"store folder not safe: {root} (mode {mode:04o}")
    with pytest.raises(StoreRefused, match=f"{REFUSED}{problem}.*writable"):
        sls.make_store(root)
    assert os.listdir(root) == []  # nothing written
    assert stat.S_IMODE(os.lstat(root).st_mode) == mode  # nor changed


def test_a_folder_above_the_store_others_can_change_is_refused(tmp_path):
    above = tmp_path / "shared"
    (above / "kv").mkdir(parents=True)
    above.chmod(0o777)
    problem = re.escape(f"{above} (mode 0777, uid 0) is group- and world-writable")
    with pytest.raises(StoreRefused, match=f"{REFUSED}.*{problem}"):
        sls.make_store(above / "kv")
    assert os.listdir(above / "kv") == []


def test_a_symlink_on_the_way_is_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    problem = re.escape(f"{tmp_path / 'link'} is a symlink")
    with pytest.raises(StoreRefused, match=f"{REFUSED}.*{problem}"):
        sls.make_store(tmp_path / "link" / "kv")
    assert os.listdir(real) == []


def test_a_store_folder_of_another_user_is_refused(tmp_path):
    root = tmp_path / "kv"
    root.mkdir(mode=0o700)
    os.chown(root, 65534, 65534)
    problem = re.escape(f"{root} (mode 0700, uid 65534) is owned by another user")
    with pytest.raises(StoreRefused, match=f"{REFUSED}.*{problem}"):
        sls.make_store(root)
    assert os.listdir(root) == []


def test_a_root_owned_sticky_folder_above_is_safe(tmp_path):
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    assert perms.store_problem(str(sticky / "kv")) is None  # made 0700 below it
    store = write_some(sticky / "kv")
    assert store.active
    # The sticky folder itself is no store folder: others can add entries.
    assert "world-writable" in perms.store_problem(str(sticky))


def test_the_existing_modes_are_kept(tmp_path):
    root = tmp_path / "kv"
    root.mkdir()
    root.chmod(0o750)  # the operator's choice, narrower than 0755
    write_some(root)
    assert stat.S_IMODE(os.lstat(root).st_mode) == 0o750


@pytest.mark.parametrize("group_read", [False, True])
def test_the_native_chunk_write_is_private_or_group_read_whatever_the_umask(
    tmp_path, group_read
):
    path = native.library_path()
    if not os.path.isfile(path):
        pytest.skip(f"{path} is not built")
    lib = native.load(path)
    segments = sls.fmt.make_segments(
        [(0, sls.fmt.SegmentKind.KV, sls.fmt.DType.UINT8, (64,), (1,))]
    )
    buf = bytearray(64)
    runs = [(ctypes.addressof(ctypes.c_char.from_buffer(buf)), 64)]
    for mask in (0o000, 0o077):
        target = tmp_path / f"c{mask}.bin"
        request = native.WriteRequest(
            str(target), 0, bytes(32), bytes(32), 16, segments, runs
        )
        old = os.umask(mask)
        try:
            (result,) = lib.write_chunks([request], 1, group_read=group_read)
        finally:
            os.umask(old)
        assert result.ok, result.message
        assert stat.S_IMODE(target.stat().st_mode) == (0o640 if group_read else 0o600)
