"""engine/memstat.py: the host's memory counters a page-cache restore is judged with."""

from __future__ import annotations

import os
import sys

import pytest
from conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "engine"))

import memstat  # noqa: E402


def test_a_snapshot_reads_the_cgroup_limit_use_and_stat(tmp_path):
    (tmp_path / "memory.max").write_text("34359738368\n")
    (tmp_path / "memory.current").write_text("1048576\n")
    (tmp_path / "memory.stat").write_text("anon 10\nfile 20\nshmem 30\nkernel 99\n")
    got = memstat.snapshot(str(tmp_path))["cgroup"]
    assert got == {"max": 34359738368, "current": 1048576, "anon": 10, "file": 20,
                   "shmem": 30}  # fmt: skip


def test_an_unlimited_cgroup_says_max_and_a_missing_one_none(tmp_path):
    (tmp_path / "memory.max").write_text("max\n")
    assert memstat.snapshot(str(tmp_path))["cgroup"]["max"] == "max"
    assert memstat.snapshot(str(tmp_path / "none"))["cgroup"] == {
        "max": None,
        "current": None,
    }


def test_the_host_counters_grow_and_the_delta_is_their_growth():
    before = memstat.snapshot()
    assert "pgfault" in before["vmstat"] and "MemTotal" in before["meminfo_kb"]
    pages = bytearray(64 << 20)  # faults in 16k pages at least
    pages[::4096] = b"\x01" * len(pages[::4096])
    grown = memstat.delta(before, memstat.snapshot())
    assert grown["pgfault"] > 0
    assert all(v >= 0 for v in grown.values())
    assert memstat.delta({"vmstat": {"a": 1, "b": 5}}, {"vmstat": {"a": 4}}) == {"a": 3}


def test_residency_counts_the_cached_pages_of_the_files_under_a_folder(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "chunk").write_bytes(b"x" * (1 << 20))  # just written: cached
    (tmp_path / "empty").write_bytes(b"")
    (tmp_path / "link").symlink_to(tmp_path / "a" / "chunk")  # not counted twice
    got = memstat.resident(str(tmp_path))
    assert got["files"] == 2 and got["bytes"] == 1 << 20
    assert got["cached_bytes"] == 1 << 20


def test_an_evicted_file_counts_as_not_cached(tmp_path):
    path = tmp_path / "chunk"
    with open(path, "wb") as f:
        f.write(b"y" * (4 << 20))
        f.flush()
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    got = memstat.resident(str(tmp_path))
    if got["cached_bytes"] == got["bytes"]:
        pytest.skip("this file system keeps its pages (tmpfs)")
    assert got["cached_bytes"] < got["bytes"] // 2
