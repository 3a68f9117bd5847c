#!/usr/bin/env python3
"""The main job's disk budget: a store filled past GLM53_KV_OFFLOAD_DISK_GB
stays under it.

Usage: demo_budget.py STORE_DIR. Writes 20 one-boundary chains through the
store-local writer (the miniature 7-group layout of the writer's tests),
reopens the store with the budget set to what they hold, writes 20 more, and
prints one JSON line: the budget, what is held after, the chains evicted.
Exit 1 if the store ends over its budget or a write was refused.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "sim"))
sys.path.insert(0, str(REPO / "tests" / "python"))

import store_local_support as sls  # noqa: E402
from store_local_support import ksl  # noqa: E402

CHAINS = 20


def write(store, maker, branches) -> None:
    for b in branches:
        sls._INDEX.setdefault(sls.block_hash(0, b), 0)
        sls.run_job(store, maker.full_chunks(0, 1, b))
        for g in sls.STATE_GROUPS:
            sls.run_job(store, maker.state(0, g, b))
    store.writer.wait_idle()


def main() -> int:
    root = Path(sys.argv[1])
    root.mkdir(mode=0o700, parents=True)
    store, staging = sls.make_store(root)
    write(store, sls.JobMaker(staging), range(CHAINS))
    store.shutdown()
    budget = ksl.budget.scan(store.writer.layout).used
    knobs = sls.knobs(root, disk_bytes=budget)
    store, staging = sls.make_store(root, knobs=knobs)
    maker = sls.JobMaker(staging)
    maker.next_job = 1 << 20
    write(store, maker, range(CHAINS, 2 * CHAINS))
    stats = store.stats
    store.shutdown()
    view = ksl.budget.scan(store.writer.layout)
    out = {
        "budget": budget,
        "held": view.used,
        "chains_written": 2 * CHAINS,
        "chains_held": len(view.trees),
        "chain_trees_evicted": stats.chain_trees_evicted,
        "bytes_evicted": stats.bytes_evicted,
        "writes_refused_disk_budget": stats.writes_refused_disk_budget,
    }
    print(json.dumps(out))
    ok = view.used <= budget and stats.chain_trees_evicted > 0
    return 0 if ok and not stats.writes_refused_disk_budget else 1


if __name__ == "__main__":
    sys.exit(main())
