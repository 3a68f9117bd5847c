"""libkvtier_store.so through kv_store_format/native.py, against the Python
codec as the independent oracle (sim/restore_read_py.py for reads,
kv_store_format_oracle for writes): the same verdict for the same bytes, and
the refusals of a missing or mismatched library (the restore then refuses to
start)."""

from __future__ import annotations

import ctypes
import errno
import os
import struct
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO_ROOT as REPO

for folder in ("kv-offload-store-local", "kv-offload-restore"):
    if str(REPO / "overlays" / folder) not in sys.path:
        sys.path.insert(0, str(REPO / "overlays" / folder))

import kv_store_format  # noqa: E402
import kv_store_format_oracle as pyfmt  # noqa: E402  (tests/oracle/)
import restore_read_py as oracle  # noqa: E402  (sim/)
from chunk_calls import ChunkCalls, RankBaseName  # noqa: E402  (sim/)
from kv_store_format import native, read_queue  # noqa: E402
from store_local_support import store_library  # noqa: E402

fmt = ChunkCalls(kv_store_format)  # the package, and the chunk calls tests make

NS = bytes(range(32))
KEY = bytes(range(100, 132))
GROUP = 1
BOUNDARY = 512
SPECS = [
    (0, fmt.SegmentKind.KV, fmt.DType.BFLOAT16, (2, 16, 64), (1024, 64, 1)),
    (1, fmt.SegmentKind.KV, fmt.DType.BFLOAT16, (2, 16, 64), (1024, 64, 1)),
    (2, fmt.SegmentKind.CONV, fmt.DType.FLOAT32, (3, 5), (5, 1)),
]
SEGMENTS = fmt.make_segments(SPECS)
PAYLOAD = bytes((i * 31 + 7) % 251 for i in range(sum(s.length for s in SEGMENTS)))


@pytest.fixture(scope="module")
def lib() -> native.Library:
    return store_library()


def chunk() -> bytes:
    header = fmt.make_header(NS, GROUP, KEY, BOUNDARY, SEGMENTS, PAYLOAD)
    return fmt.encode_chunk(header, PAYLOAD)


def expectation(**change):
    good = fmt.decode_header(chunk())
    fields = {
        "namespace": NS,
        "group": GROUP,
        "key_hash": KEY,
        "boundary": BOUNDARY,
        "length": len(PAYLOAD),
        "checksum": good.payload_checksum,
        "segments": SEGMENTS,
    }
    fields.update(change)
    return fields


def _runs(length: int) -> tuple[bytearray, list[tuple[int, int]]]:
    """A buffer and three uneven runs covering it."""
    dest = bytearray(length)
    base = ctypes.addressof(ctypes.c_char.from_buffer(dest))
    cut = [0, 5, length - 100, length]
    return dest, [(base + a, b - a) for a, b in zip(cut, cut[1:], strict=False)]


def native_verdict(
    lib,
    path: Path,
    threads: int = 2,
    key: bytes | None = None,
    rank: int = 0,
    **change,
) -> tuple[str, bool]:
    """(library reason, its bytes == the payload) for one file."""
    e = expectation(**change)
    dest, runs = _runs(e["length"])
    request = native.ReadRequest(
        group=e["group"],
        namespace_hash=e["namespace"],
        key_hash=e["key_hash"],
        boundary=e["boundary"],
        payload_length=e["length"],
        payload_checksum=e["checksum"],
        segments=e["segments"],
        runs=runs,
        path=str(path),
    )
    read = lib.prepare_read([request], key=key, rank=rank)
    read.run(threads)
    (result,) = read.results()
    return result.reason, bytes(dest) == PAYLOAD


def verdicts(
    lib, path: Path, key: bytes | None = None, rank: int = 0, **change
) -> tuple[str, str, bool]:
    """(library reason, oracle reason, library bytes == payload)."""
    mine, landed = native_verdict(lib, path, key=key, rank=rank, **change)
    e = expectation(**change)
    _, runs = _runs(e["length"])
    fd = os.open(path, os.O_RDONLY)
    try:
        theirs = oracle.read_one(fd, runs=runs, key=key, rank=rank, **e)
    finally:
        os.close(fd)
    return mine, theirs, landed


def test_the_library_is_this_checkouts_version(lib):
    assert native.LIBRARY_VERSION == (REPO / "VERSION").read_text().strip()
    assert (lib.abi, lib.version) == (native.ABI_VERSION, native.LIBRARY_VERSION)


def test_a_missing_or_mismatched_library_is_refused_naming_the_file(
    lib, tmp_path, monkeypatch
):
    missing = tmp_path / "libkvtier_store.so"
    with pytest.raises(native.NativeLibraryError, match=str(missing)):
        native.load(str(missing))
    not_ours = tmp_path / "not_ours.so"
    not_ours.write_bytes(b"\x7fELF garbage")
    with pytest.raises(native.NativeLibraryError, match="cannot be loaded"):
        native.Library(str(not_ours))
    monkeypatch.setattr(native, "LIBRARY_VERSION", "0.0.0-other")
    with pytest.raises(native.NativeLibraryError, match="library version '0.1.0'"):
        native.Library(lib.path)
    monkeypatch.setattr(native, "ABI_VERSION", 99)
    with pytest.raises(native.NativeLibraryError, match="ABI version 7, this overlay"):
        native.Library(lib.path)


def test_the_restore_refuses_to_start_without_the_library(tmp_path, monkeypatch):
    missing = tmp_path / "gone" / "libkvtier_store.so"
    monkeypatch.setenv(native.ENV_LIBRARY, str(missing))
    monkeypatch.setenv("GLM53_KV_OFFLOAD_RESTORE", "1")
    # Imported here and dropped after: other tests check that no kv_restore
    # module is loaded while restore is off.
    before = set(sys.modules)
    try:
        import kv_restore_worker as krw

        with pytest.raises(krw.RestoreRefused, match=str(missing)):
            krw.WorkerRestore.from_env()
    finally:
        for name in set(sys.modules) - before:
            del sys.modules[name]


def test_the_default_path_is_beside_the_module(monkeypatch):
    monkeypatch.delenv(native.ENV_LIBRARY, raising=False)
    assert native.library_path() == os.path.join(
        os.path.dirname(native.__file__), "libkvtier_store.so"
    )


def test_every_verdict_equals_the_python_oracles(lib, tmp_path):
    good = chunk()
    header_length = fmt.decode_header(good).header_length
    files = {
        "good": good,
        "payload byte flipped": good[:-300] + bytes([good[-300] ^ 1]) + good[-299:],
        "truncated payload": good[:-1],
        "trailing byte": good + b"\0",
        "cut in the header": good[:100],
        "bad magic": b"X" + good[1:],
        "header byte flipped": good[:40] + bytes([good[40] ^ 4]) + good[41:],
        "header only": good[:header_length],
    }
    changes = {
        "foreign_namespace": {"namespace": bytes(32)},
        "wrong_group": {"group": GROUP + 1},
        "wrong_key": {"key_hash": KEY[:-1] + b"\0"},
        "wrong_boundary": {"boundary": BOUNDARY + 256},
        "manifest_mismatch": {"checksum": 12345},
    }
    seen = set()
    for name, data in files.items():
        path = tmp_path / f"{name.replace(' ', '_')}.bin"
        path.write_bytes(data)
        mine, theirs, landed = verdicts(lib, path)
        assert mine == theirs, name
        assert landed == (mine == ""), name
        seen.add(mine)
    path = tmp_path / "good.bin"
    for reason, change in changes.items():
        mine, theirs, _ = verdicts(lib, path, **change)
        assert mine == theirs == reason
        seen.add(mine)
    assert {"", "payload_checksum_mismatch", "truncated", "trailing_bytes"} <= seen
    assert {"bad_magic", "header_checksum_mismatch"} <= seen


def test_a_layout_that_differs_only_in_its_table_is_a_layout_mismatch(lib, tmp_path):
    path = tmp_path / "c.bin"
    path.write_bytes(chunk())
    other = list(SEGMENTS)
    other[2] = fmt.Segment(**{**other[2].__dict__, "stride": (6, 1)})
    mine, theirs, landed = verdicts(lib, path, segments=tuple(other))
    assert mine == theirs == "layout_mismatch" and not landed


def test_the_read_queue_runs_cancels_and_closes(lib, tmp_path):
    """read_queue.ReadQueue: a call runs on the library's thread and reads what
    PreparedRead.run reads; one queued behind a held call is cancelled untouched; after close a
    call that never reported is ended but not done, and a new one is refused."""
    folder = tmp_path / "held"
    folder.mkdir()
    path = folder / "c.bin"
    path.write_bytes(chunk())

    def prepared() -> tuple[bytearray, native.PreparedRead]:
        e = expectation()
        dest, runs = _runs(e["length"])
        request = native.ReadRequest(
            group=e["group"], namespace_hash=e["namespace"], key_hash=e["key_hash"],
            boundary=e["boundary"], payload_length=e["length"],
            payload_checksum=e["checksum"], segments=e["segments"], runs=runs,
            path=str(path),
        )  # fmt: skip
        return dest, lib.prepare_read([request])

    queue = read_queue.ReadQueue(lib)
    dest, read = prepared()
    first = queue.submit(read, 2, stop_on_failure=True)
    assert first.wait(10) and first.done and first.failed == 0 and first.seconds > 0
    assert bytes(dest) == PAYLOAD and read.results()[0].ok
    lib.test_hold_reads(str(folder) + os.sep)
    try:
        # (the held read writes into _held_dest: it must live until the close)
        (_held_dest, held), (queued_dest, queued) = prepared(), prepared()
        running, behind = queue.submit(held, 2), queue.submit(queued, 2)
        deadline = time.monotonic() + 10
        while not running.poll() and running.state != read_queue.RUNNING:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        assert not running.wait(0.05)  # held: running, not ended
        behind.cancel()
        assert (
            behind.wait(1) and behind.state == read_queue.CANCELLED and not behind.done
        )
        assert bytes(queued_dest) == bytes(len(PAYLOAD))
    finally:
        lib.test_hold_reads(None)
    queue.close()  # waits for the released call
    assert running.poll() and not running.done  # never reported before the close
    with pytest.raises(ValueError, match="refused"):
        queue.submit(prepared()[1], 2)


def test_symlinks_and_missing_files_are_refused(lib, tmp_path):
    target = tmp_path / "c.bin"
    target.write_bytes(chunk())
    link = tmp_path / "link.bin"
    link.symlink_to(target)
    mine, landed = native_verdict(lib, link)
    assert mine == "io_error" and not landed
    assert native_verdict(lib, target) == ("", True)
    assert native_verdict(lib, tmp_path / "absent.bin")[0] == "missing_file"


def test_writes_are_what_the_python_codec_reads(lib, tmp_path):
    buf = bytearray(PAYLOAD)
    base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    runs = [(base, 10), (base + 10, len(buf) - 10)]
    paths = [tmp_path / f"c{i}.bin" for i in range(6)]
    requests = [
        native.WriteRequest(str(p), GROUP, NS, KEY, BOUNDARY, SEGMENTS, runs)
        for p in paths
    ]
    results = lib.write_chunks(requests, 3)
    want = fmt.decode_header(chunk())
    for p, r in zip(paths, results, strict=True):
        assert r.ok, r.message
        assert fmt.verify_chunk_file(str(p)) == want
        assert pyfmt.verify_chunk_file(str(p)) == pyfmt.decode_header(chunk())
        assert p.read_bytes() == chunk()
        assert (r.payload_checksum, r.header_length, r.bytes) == (
            want.payload_checksum,
            want.header_length,
            len(chunk()),
        )
    assert sorted(os.listdir(tmp_path)) == sorted(p.name for p in paths)


def test_a_full_disk_is_no_space_and_leaves_no_file(lib, tmp_path):
    buf = bytearray(PAYLOAD)
    base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    request = native.WriteRequest(
        str(tmp_path / "c.bin"), GROUP, NS, KEY, BOUNDARY, SEGMENTS, [(base, len(buf))]
    )
    lib.test_fault(native.FAULT_WRITE, errno.ENOSPC, 0, 1)
    try:
        (result,) = lib.write_chunks([request], 1)
    finally:
        lib.test_fault(native.FAULT_NONE)
    assert (result.status, result.reason, result.sys_errno) == (
        native.E_NO_SPACE,
        "no_space",
        errno.ENOSPC,
    )
    assert os.listdir(tmp_path) == []


def test_every_keyed_verdict_equals_the_python_oracles(lib, tmp_path):
    """A keyed store (FORMAT.md 3.6): the library's MAC-first verdicts are the
    codec's (open_chunk, then the plain checks), forgeries included."""
    import crc_forge

    key, other, rank = b"\x11" * 32, b"\x22" * 32, 7
    good = chunk()
    sealed = fmt.seal_chunk(key, good, rank=rank)
    header_length = fmt.decode_header(good).header_length

    def genuine(ns=NS, group=GROUP, name=KEY, boundary=BOUNDARY, payload=PAYLOAD):
        # A chunk the key's holder sealed, for this rank, of other fields:
        # a replay under this chunk's name.
        header = fmt.make_header(ns, group, name, boundary, SEGMENTS, payload)
        return fmt.encode_chunk(header, payload)

    other_boundary = genuine(boundary=BOUNDARY + 256)
    older = bytes(PAYLOAD[:-1]) + bytes([PAYLOAD[-1] ^ 1])
    downgraded = bytearray(sealed)
    downgraded[8] = 2  # version 3 -> 2, the header CRC redone: read as a v2 seal
    struct.pack_into(
        "<I",
        downgraded,
        header_length - 4,
        fmt.crc32(downgraded[: header_length - 4]),
    )
    files = {
        "sealed": sealed,
        "v2 sealed (an older store)": fmt.seal_chunk_v2(key, good),
        "plain (planted)": good,
        "another key": fmt.seal_chunk(other, good, rank=rank),
        "another rank": fmt.seal_chunk(key, good, rank=rank + 1),
        "v2, another key": fmt.seal_chunk_v2(other, good),
        "salt flipped": sealed[:-32] + bytes([sealed[-32] ^ 1]) + sealed[-31:],
        "downgraded to v2": bytes(downgraded),
        "extended": sealed + b"\0",
        "payload same CRC": crc_forge.forged_sealed_chunk(sealed, header_length),
        "payload byte flipped": sealed[:-300]
        + bytes([sealed[-300] ^ 1])
        + sealed[-299:],
        "tag flipped": sealed[:-1] + bytes([sealed[-1] ^ 1]),
        "header byte flipped": sealed[:40] + bytes([sealed[40] ^ 4]) + sealed[41:],
        "cut": sealed[:-7],
        "tiny": sealed[:100],
        "genuine, another boundary": fmt.seal_chunk(key, other_boundary, rank=rank),
        "v2, another boundary": fmt.seal_chunk_v2(key, other_boundary),
        "genuine, another name": fmt.seal_chunk(
            key, genuine(name=bytes(32)), rank=rank
        ),
        "genuine, another group": fmt.seal_chunk(key, genuine(group=2), rank=rank),
        "genuine, another namespace": fmt.seal_chunk(
            key, genuine(ns=bytes(32)), rank=rank
        ),
        "genuine, an older payload": fmt.seal_chunk(
            key, genuine(payload=older), rank=rank
        ),
    }
    seen = {}
    for name, data in files.items():
        path = tmp_path / f"{name.replace(' ', '_').replace(',', '')}.bin"
        path.write_bytes(data)
        mine, theirs, landed = verdicts(lib, path, key=key, rank=rank)
        assert mine == theirs, name
        # A refused file's rows are garbage (they may hold its bytes: the MAC
        # is judged over them once they landed); only a good one must land.
        assert landed or mine != "", name
        seen[name] = mine
    assert seen["sealed"] == seen["v2 sealed (an older store)"] == ""
    assert seen["plain (planted)"] == "mac_missing"
    for name in ("another key", "another rank", "v2, another key", "salt flipped",
                 "downgraded to v2", "extended", "payload same CRC",
                 "payload byte flipped", "tag flipped", "header byte flipped",
                 "cut"):  # fmt: skip
        assert seen[name] == "mac_mismatch", name
    assert seen["tiny"] == "truncated"
    assert seen["genuine, another boundary"] == "wrong_boundary"
    assert seen["v2, another boundary"] == "wrong_boundary"
    assert seen["genuine, another name"] == "wrong_key"
    assert seen["genuine, another group"] == "wrong_group"
    assert seen["genuine, another namespace"] == "foreign_namespace"
    assert seen["genuine, an older payload"] == "manifest_mismatch"


# --- the name calls and kvtier_open (ABI 6) -------------------------------------


def test_names_are_the_librarys_built_and_parsed_back(lib) -> None:
    """FORMAT.md 2's names come from format/'s layout through the name calls,
    the same verdicts as the oracle's, and parse back to their parts."""
    base = fmt.rank_base_name("glm53kv", "zai-org/GLM-5.3", NS, 3)
    assert base == pyfmt.rank_base_name("glm53kv", "zai-org/GLM-5.3", NS, 3)
    assert fmt.parse_rank_base_name(base) == RankBaseName(
        "glm53kv", "zai-org-GLM-5.3", NS.hex()[:16], 3
    )
    assert fmt.pending_file_name(12, 34) == "12.34.json"
    assert fmt.parse_pending_file_name("12.34.json") == (12, 34)
    # A final name may hold a newline: it comes back whole, last.
    assert fmt.parse_temp_name(fmt.temp_name("a\nb.json", 5, 6)) == ("a\nb.json", 5, 6)
    assert fmt.sanitize_model("M\u00f6del/\udcff") == "M-del"
    for bad in (
        lambda: fmt.rank_base_name("Glm", "m", NS, 0),
        lambda: fmt.rank_base_name("glm", "m", NS, -1),
        lambda: fmt.rank_base_name("glm", "m", NS[:16], 0),
        lambda: fmt.chunk_rel_path("ab" * 8, 1024),
        lambda: fmt.manifest_file_name(-1, "ab" * 8),
        lambda: fmt.pending_file_name(0, 1),
        lambda: fmt.parse_pending_file_name("01.2.json"),
        lambda: fmt.parse_manifest_file_name("b1_xyz.json"),
    ):
        with pytest.raises(fmt.FormatError) as err:
            bad()
        assert err.value.reason is fmt.Reason.BAD_NAME
    assert fmt.parse_temp_name("x.tmp.0.1") is None
    with pytest.raises(ValueError, match="unknown name kind"):
        native.call("kvtier_parse_name", 99, b"x", 1)


@pytest.mark.parametrize("walk", [0, native.OPEN_WALK], ids=["openat2", "walk"])
def test_open_regular_refuses_what_a_read_would_wait_on(
    lib, tmp_path, monkeypatch, walk
) -> None:
    """kvtier_open's OSErrors as the Python open raised them: EINVAL naming
    the path for a FIFO or a folder, FileNotFoundError, ELOOP for a link."""
    from kv_store_format import store_file

    monkeypatch.setattr(store_file, "_WALK", walk)
    (tmp_path / "f").write_bytes(b"12345")
    os.mkfifo(tmp_path / "fifo")
    assert fmt.read_regular(str(tmp_path / "f"), 3) == b"1234"
    for path in ("fifo", "."):
        with pytest.raises(OSError) as err:
            fmt.open_regular(str(tmp_path / path))
        assert err.value.errno == errno.EINVAL
        assert err.value.filename == str(tmp_path / path)
        assert "not a regular file" in str(err.value)
    with pytest.raises(FileNotFoundError):
        fmt.open_regular(str(tmp_path / "missing"))
    (tmp_path / "link").symlink_to(tmp_path / "f")
    with pytest.raises(OSError) as err:
        fmt.read_regular(str(tmp_path / "link"), 9)
    assert err.value.errno == errno.ELOOP and "symlink" in str(err.value)
    fd = fmt.open_nofollow(str(tmp_path / "f"), os.O_RDONLY)
    try:
        assert os.get_inheritable(fd) is False  # O_CLOEXEC added
    finally:
        os.close(fd)
