"""engine/read_diag.py's read replay (KVTIER_SUITE_READ_REPLAY=1): the largest
promotion's prepared read call run again with one thing varied at a time, on
the real store library and real chunk files."""

from __future__ import annotations

import ctypes
import os
import sys
from types import SimpleNamespace

import pytest
from conftest import REPO_ROOT as REPO

for folder in ("overlays/kv-offload-store-local", "engine"):
    if str(REPO / folder) not in sys.path:
        sys.path.insert(0, str(REPO / folder))

import kv_store_format  # noqa: E402
import read_diag  # noqa: E402
from chunk_calls import ChunkCalls  # noqa: E402
from kv_store_format import native  # noqa: E402
from store_local_support import store_library  # noqa: E402

fmt = ChunkCalls(kv_store_format)  # the package, and the chunk calls tests make

NS = bytes(range(32))
SPECS = [(0, fmt.SegmentKind.KV, fmt.DType.BFLOAT16, (2, 16, 64), (1024, 64, 1))]
SEGMENTS = fmt.make_segments(SPECS)
LENGTH = sum(s.length for s in SEGMENTS)
FILES = 70  # more than the replay's "first 64" and than two calls of 32


@pytest.fixture(scope="module")
def lib() -> native.Library:
    return store_library()


def payload(i: int) -> bytes:
    return bytes((i * 7 + j) % 251 for j in range(LENGTH))


def prepared(lib, tmp_path) -> tuple[native.PreparedRead, bytearray, list]:
    """FILES chunk files read into one buffer, two runs a file (as rows)."""
    dest = bytearray(FILES * LENGTH)
    base = ctypes.addressof(ctypes.c_char.from_buffer(dest))
    requests, paths = [], []
    for i in range(FILES):
        key = i.to_bytes(32, "big")
        header = fmt.make_header(NS, 0, key, 64 * (i + 1), SEGMENTS, payload(i))
        path = tmp_path / f"{i}.bin"
        path.write_bytes(fmt.encode_chunk(header, payload(i)))
        paths.append(path)
        at = base + i * LENGTH
        requests.append(
            native.ReadRequest(
                group=0,
                namespace_hash=NS,
                key_hash=key,
                boundary=64 * (i + 1),
                payload_length=LENGTH,
                payload_checksum=header.payload_checksum,
                segments=SEGMENTS,
                runs=[(at, 100), (at + 100, LENGTH - 100)],
                path=str(path),
            )
        )
    return lib.prepare_read(requests), dest, paths


def test_every_variant_reads_every_file_and_leaves_the_rows_as_they_were(lib, tmp_path):
    read, dest, _ = prepared(lib, tmp_path)
    read.run(4, **read_diag.ENGINE_FLAGS)
    assert all(r.ok for r in read.results())
    restore = SimpleNamespace(_probe_replay=(FILES, read))
    rows = read_diag.replay_reads(restore)
    names = [r["variant"] for r in rows]
    assert names[0] == "as the engine" and "first 64 into private memory" in names
    for row in rows:
        assert row["failed"] == 0, row
        assert row["gb_per_s"] and row["gb_per_s"] > 0, row
    by = {r["variant"]: r for r in rows}
    assert by["as the engine"]["files"] == FILES
    assert by["first 64, 1 thread"]["files"] == 64
    assert by["calls of 32 files"]["calls"] == 3
    assert bytes(dest) == b"".join(payload(i) for i in range(FILES))


def test_a_refused_file_shows_in_every_variant_that_reads_it(lib, tmp_path):
    read, _, paths = prepared(lib, tmp_path)
    read.run(4, **read_diag.ENGINE_FLAGS)
    raw = bytearray(paths[3].read_bytes())
    raw[-1] ^= 1  # a payload byte: the CRC refuses the file
    paths[3].write_bytes(bytes(raw))
    rows = read_diag.replay_reads(SimpleNamespace(_probe_replay=(FILES, read)))
    assert all(r["failed"] >= 1 for r in rows), rows


def test_no_kept_job_replays_nothing():
    assert read_diag.replay_reads(SimpleNamespace()) == []


def test_the_gil_watch_sees_a_long_hold_a_collection_and_each_read():
    import gc
    import time

    def hold_the_gil() -> int:
        # One C call (no bytecode, so no switch point) that runs ~0.1-0.5 s.
        return sum(range(20_000_000))

    reads, finished = [], []
    restore = SimpleNamespace(
        _queue_read=reads.append, _finish=lambda job: finished.append(job) or True
    )
    watch = read_diag.watch_gil(restore)
    time.sleep(0.05)  # the watch thread is running
    hold_the_gil()
    garbage = [[i] for i in range(300_000)]
    for a, b in zip(garbage, garbage[1:]):
        a.append(b)
        b.append(a)  # cycles: only the collector frees them
    del garbage, a, b
    gc.collect()
    job = SimpleNamespace(keys=[b"k"] * 3, seconds=0.01)
    restore._queue_read(job)
    time.sleep(0.02)
    assert restore._finish(job) is True
    time.sleep(0.05)
    report = read_diag.gil_report(watch)
    read_diag.stop_gil_watch(watch)
    assert report["gaps"], report
    assert any("hold_the_gil" in " ".join(where) for _, _, where in report["gaps"])
    assert any(gen == 2 and n > 0 for _, _, gen, n in report["gc"]), report["gc"]
    ((_, reported_after, library_s, keys),) = report["reads"]
    assert keys == 3 and library_s == 0.01 and reported_after >= 0.02
    assert reads == [job] and finished == [job]
    main = report["threads"]["main"]  # this test runs on the main thread
    assert main["cpus"] and main["nice"] == os.getpriority(os.PRIO_PROCESS, 0)
    assert main["policy"] == os.sched_getscheduler(0)
    assert read_diag.gil_report(None) is None
