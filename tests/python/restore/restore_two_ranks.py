"""One TP rank of a two-process restore over real torch.distributed (gloo).

test_kv_offload_restore.py starts two of these with the real-vLLM venv's
python (real torch): rank 0 runs the patched scheduler (with its tiering
manager and LocalStoreTier) and worker 0, rank 1 runs worker 1, each over its
own CPU region, as on two nodes. Every step rank 0 broadcasts the pickled
connector metadata, each rank runs its worker step, and the pickled worker
metadata is all-gathered to rank 0, which aggregates it with vLLM's own
``aggregate``. The patched vLLM modules run under the test harness; only the
collectives use torch.

Usage: restore_two_ranks.py TREE STORE_DIR RANK INIT_FILE OUT_JSON
"""

from __future__ import annotations

import json
import pickle
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2] / "sim"))  # restore_rig, harness

import torch.distributed as dist  # noqa: E402  (real torch, before the harness)

# isort: split
import harness  # noqa: E402
from restore_rig import BLOCK, HASH, STATE_GROUPS, Rig, chain_hashes, pattern  # noqa: E402

PROMPT_BLOCKS = 8
STEPS = 12


def main() -> None:
    tree, store, rank, init, out = sys.argv[1:]
    rank = int(rank)
    dist.init_process_group(
        "gloo", init_method=f"file://{init}", rank=rank, world_size=2
    )
    hashes = chain_hashes("a", PROMPT_BLOCKS)
    eng = harness.engine(tree)
    with eng as ns:
        rig = Rig(ns, store, tp=2, ranks=[rank], scheduler=rank == 0)
        request = rig.request("b", hashes, PROMPT_BLOCKS * BLOCK)
        if rank == 0:
            rig.scheduler.on_new_request(request)
    hits = None
    for _ in range(STEPS):
        blob = [None]
        with eng:
            if rank == 0:
                if hits is None:
                    found, _ = rig.scheduler.get_num_new_matched_tokens(request, 0)
                    if found is not None:
                        hits = found
                        if hits:
                            rig.allocate(request, hits)
                blob = [pickle.dumps(rig.begin_step())]
        dist.broadcast_object_list(blob, src=0)
        with eng:
            mine = rig.worker_step(0, blob[0])
        gathered = [None, None]
        dist.all_gather_object(gathered, mine)
        with eng:
            if rank == 0:
                rig.end_step(gathered)
    result = [hits]
    dist.broadcast_object_list(result, src=0)
    gpu = rig.workers[0].gpu
    equal = []
    for b in range(6):
        key = hashes[(b + 1) * (BLOCK // HASH) - 1] + (0).to_bytes(4, "big")
        got = gpu.blocks.get(90000 + 9000 + b + 1)
        size = rig.page_bytes(key)
        equal.append(got is not None and got[:size] == pattern(rank, key, size))
    for g in STATE_GROUPS:
        key = hashes[6 * (BLOCK // HASH) - 1] + g.to_bytes(4, "big")
        got = gpu.blocks.get(90000 + 9000 + 100 * g + 6)
        size = rig.page_bytes(key)
        equal.append(got is not None and got[:size] == pattern(rank, key, size))
    restorer = rig.restorers[0]
    Path(out).write_text(
        json.dumps(
            {
                "rank": rank,
                "hits": result[0],
                "loads": len(gpu.loads),
                "bytes_equal": equal,
                "jobs_ok": restorer.stats.jobs_ok,
                "failures": dict(restorer.stats.failures),
            }
        )
    )
    with eng:
        rig.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
