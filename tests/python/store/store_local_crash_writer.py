"""Writes boundaries into a store forever; the crash test SIGKILLs it.

Usage: store_local_crash_writer.py ROOT SEED [native|budget]

The chunk files are written by the native store library (KVTIER_STORE_LIB),
as in the engine. With "budget" the writer keeps the store under a small disk
budget (BUDGET_BYTES), so kills land in evictions too; the first eviction of
a run creates ROOT/../evicted.

Each run reopens the same store (a new boot), writes conversations that share
prefixes with earlier runs (dedup, keep-K deletions) and new ones, and prints
"ready" once the store is open so the parent kills it mid-work.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import store_local_support as sls

# About two of the three conversations' trees: every run evicts.
BUDGET_BYTES = 30_000


def main() -> None:
    root = Path(sys.argv[1])
    rng = random.Random(int(sys.argv[2]))
    mode = sys.argv[3] if len(sys.argv) > 3 else "native"
    budget = BUDGET_BYTES if mode == "budget" else None
    knobs = sls.knobs(root, disk_bytes=budget)
    store, staging = sls.make_store(root, background=True, knobs=knobs)
    marker = root.parent / "evicted"
    assert store.active, store.disabled_reason
    maker = sls.JobMaker(staging)
    print("ready", flush=True)
    while True:
        branch = rng.randrange(3)
        end = rng.randrange(1, 12)
        # Under the budget every job starts at chunk 0: a chain waiting for
        # a prefix no job writes holds its chunks in the pending record,
        # which the budget never retires (a tiny budget fills with them).
        start = 0 if budget else rng.randrange(0, end)
        sls.run_job(store, maker.full_chunks(start, end - start + 1, branch))
        for g in sls.STATE_GROUPS:
            sls.run_job(store, maker.state(end, g, branch))
        store.writer.wait_idle()
        if store.stats.chain_trees_evicted and not marker.exists():
            marker.touch()


if __name__ == "__main__":
    main()
