#!/usr/bin/env python3
"""Disk budget benchmark: prints figures (not a test).

1. fill: the writer (the store library, the miniature 7-group layout of
   tests/python/store_local_support) writes CHAINS one-boundary chains,
   unbounded;
2. at budget: the store is reopened with GLM53_KV_OFFLOAD_DISK_GB set to
   what it holds, and MORE new chains are written: every write retires the
   least recently used chains. Printed: write rate with and without the
   budget, evictions, and the eviction cost per written GB (the extra
   seconds the budget spent, over the bytes written), with and without the
   writer's scans of the store (one, its first job's, unless something
   forced a rescan: docs/FORMAT.md 8.1);
3. `kvstore verify` on the result (with --kvstore).

usage: bench/budget_bench.py [--dir D] [--chains N] [--more M] [--kvstore BIN]
(D defaults to a folder under /dev/shm: the figures are the policy's CPU
cost, not a disk's.)
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "sim"))
sys.path.insert(0, str(REPO / "tests" / "python"))

import store_local_support as sls  # noqa: E402
from store_local_support import ksl  # noqa: E402


def write_chains(store, maker, branches) -> float:
    start = time.perf_counter()
    for b in branches:
        sls._INDEX.setdefault(sls.block_hash(0, b), 0)  # its chunk index
        sls.run_job(store, maker.full_chunks(0, 1, b))
        for g in sls.STATE_GROUPS:
            sls.run_job(store, maker.state(0, g, b))
    store.writer.wait_idle()
    return time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", type=Path)
    ap.add_argument("--chains", type=int, default=10_000)
    ap.add_argument("--more", type=int, default=1_000)
    ap.add_argument("--kvstore", type=Path)
    a = ap.parse_args()
    parent = a.dir or Path(tempfile.mkdtemp(dir="/dev/shm", prefix="budget-bench-"))
    root = parent / "store"
    root.mkdir(mode=0o700, parents=True)
    try:
        store, staging = sls.make_store(root)
        maker = sls.JobMaker(staging)
        t_fill = write_chains(store, maker, range(a.chains))
        written_fill = store.stats.bytes_written
        store.shutdown()
        used = ksl.budget.scan(store.writer.layout).used
        print(f"fill: {a.chains} chains, {used} bytes held, {t_fill:.2f} s")
        print(
            f"  unbounded write: {a.chains / t_fill:.0f} chains/s, "
            f"{written_fill / t_fill / 1e6:.2f} MB/s of payload"
        )
        store, staging = sls.make_store(root, knobs=sls.knobs(root, disk_bytes=used))
        maker = sls.JobMaker(staging)
        maker.next_job = 1 << 20
        t_budget = write_chains(store, maker, range(a.chains, a.chains + a.more))
        s = store.stats
        budget = store.writer.budget
        store.shutdown()
        after = ksl.budget.scan(store.writer.layout)
        print(f"at budget ({used} bytes): {a.more} more chains, {t_budget:.2f} s")
        print(
            f"  write: {a.more / t_budget:.0f} chains/s, "
            f"{s.bytes_written / t_budget / 1e6:.2f} MB/s of payload; "
            f"{s.chain_trees_evicted} chains evicted ({s.bytes_evicted} bytes), "
            f"{s.writes_refused_disk_budget} writes refused"
        )
        print(
            f"  held after: {after.used} bytes (budget {used}), "
            f"{len(after.trees)} chains"
        )
        per_chain_unbounded = t_fill / a.chains
        extra = t_budget - per_chain_unbounded * a.more
        gb = (s.bytes_written or 1) / 1e9
        print(
            f"  eviction cost: {extra:.2f} s over {a.more} chains "
            f"= {extra / gb:.1f} s per written GB "
            f"({extra / max(s.chain_trees_evicted, 1) * 1e3:.2f} ms per evicted chain)"
        )
        rest = extra - budget.scan_seconds
        print(
            f"  writer's scans: {budget.scans} ({budget.scan_seconds:.2f} s); "
            f"without them: {rest / gb:.1f} s per written GB "
            f"({rest / max(s.chain_trees_evicted, 1) * 1e3:.2f} ms per evicted chain)"
        )
        if a.kvstore:
            done = subprocess.run(
                [str(a.kvstore), "verify", "-q", str(root)], capture_output=True
            )
            print(f"kvstore verify: exit {done.returncode}")
            if done.returncode != 0:
                return 1
        return 0 if after.used <= used and not s.writes_refused_disk_budget else 1
    finally:
        if a.dir is None:
            shutil.rmtree(parent, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
