"""Write a store, restart, restore it, then restore from a corrupted copy.

The main job (scripts/demo.py) calls this on a tree patched by `overlay apply`
with every overlay of ORDER (kv-offload-restore included). It runs the
PATCHED scheduler, tiering manager and workers of that tree through the
harness (sim/restore_rig.py: real vLLM files, stubs for torch) for a TP pair:

1. write: request A (8 blocks of 256 tokens) is stored by both ranks'
   writers, each rank its own bytes;
2. restart: a fresh scheduler, manager, workers and CPU rows over the same
   store; request B with A's prefix restores from disk; every GPU block each
   rank received is compared with the bytes that rank wrote;
3. corrupt: one payload byte of a full-attention chunk on rank 1 is flipped;
   after another restart request C recomputes (no hit, nothing loaded on any
   rank) and the failure is counted.

Usage: demo_restore.py TREE STORE_DIR  (prints one JSON line of figures)
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "sim"))

import harness  # noqa: E402
from demo_driver import run, set_store_knobs  # noqa: E402
from restore_rig import (  # noqa: E402
    BLOCK,
    HASH,
    STATE_GROUPS,
    Rig,
    chain_hashes,
    pattern,
)

PROMPT_BLOCKS = 8
TP = 2


def restore(ns, store: Path, name: str, hashes, n: int) -> tuple[Rig, int]:
    rig = Rig(ns, store, tp=TP)
    request = rig.request(name, hashes, PROMPT_BLOCKS * BLOCK)
    rig.scheduler.on_new_request(request)
    hits, _ = rig.lookup(request)
    if hits:
        rig.load(request, hits, n)
    return rig, hits


def bytes_equal(rig: Rig, hashes, hits: int, n: int) -> int:
    """How many GPU blocks, over all ranks, hold exactly what that rank wrote."""
    per_chunk = BLOCK // HASH
    last = hits // BLOCK - 1
    expected = {
        90000 + 1000 * n + b + 1: hashes[(b + 1) * per_chunk - 1]
        + (0).to_bytes(4, "big")
        for b in range(last + 1)
    }
    for g in STATE_GROUPS:
        key = hashes[(last + 1) * per_chunk - 1] + g.to_bytes(4, "big")
        expected[90000 + 1000 * n + 100 * g + last + 1] = key
    equal = 0
    for rank, worker in enumerate(rig.workers):
        if sorted(worker.gpu.blocks) != sorted(expected):
            raise SystemExit(f"demo_restore: rank {rank} loaded other blocks")
        for block, key in expected.items():
            size = rig.page_bytes(key)
            if worker.gpu.blocks[block][:size] != pattern(rank, key, size):
                raise SystemExit(f"demo_restore: rank {rank} block {block} differs")
            equal += 1
    return equal


OFFLOADING = "vllm.distributed.kv_transfer.kv_connector.v1.offloading"


def exported_counters(ns, rig: Rig) -> list[str]:
    """The tier's counters as vLLM's Prometheus endpoint would show them.

    The payload is the one the patched engine sends: each rank's through the
    worker hook's function (kv_store_local/exported.worker_stats), summed over
    ranks and merged with the real scheduler's get_stats (our tier's), as vLLM
    does before its Prometheus logger observes it. The demo has no
    prometheus_client (it runs on stubs, without the real-vLLM venv), so the
    lines are written here in the form /metrics serves (counters get _total).
    """
    exported = ns.load(f"{OFFLOADING}.kv_store_local.exported")
    total = None
    for worker in rig.workers:
        stats = exported.worker_stats(worker)
        if stats is not None:
            total = stats if total is None else total.aggregate(stats)
    sched = rig.scheduler.get_stats()
    if sched is not None:
        total = sched if total is None else total.aggregate(sched)
    ours = {row.name: row.label[0] if row.label else None for row in exported.COUNTERS}
    lines = []
    for name, series in sorted((total.data["data"] if total else {}).items()):
        if name not in ours:
            continue
        for labels, value in sorted(series.items()):
            shown = f'{{{ours[name]}="{labels[0]}"}}' if labels else ""
            lines.append(f"{name}_total{shown} {value:g}")
    return lines


def drive(tree: Path, store: Path) -> dict:
    set_store_knobs(store, GLM53_KV_OFFLOAD_RESTORE="1", PYTHONHASHSEED="0")
    hashes = chain_hashes("a", PROMPT_BLOCKS)
    with harness.engine(tree) as ns:
        writer = Rig(ns, store, tp=TP)
        writer.store_request("a", hashes, PROMPT_BLOCKS, 0)
        written = sum(w._kv_store.stats.keys_written for w in writer.workers)
        writer.shutdown()  # the writer drains first: its last writes are counted
        write_counters = exported_counters(ns, writer)

        restored, hits = restore(ns, store, "b", hashes, 9)
        if not hits:
            raise SystemExit("demo_restore: the restarted engine restored nothing")
        equal = bytes_equal(restored, hashes, hits, 9)
        restored_bytes = sum(r.stats.bytes_restored for r in restored.restorers)
        counters = exported_counters(ns, restored)
        victim_key = hashes[2 * (BLOCK // HASH) - 1] + (0).to_bytes(4, "big")
        victim = Path(
            restored.workers[1]._kv_store.writer.layout.chunk(victim_key[:-4].hex(), 0)
        )
        restored.shutdown()

        data = bytearray(victim.read_bytes())
        data[-1] ^= 0x01
        victim.write_bytes(bytes(data))
        again, recompute_hits = restore(ns, store, "c", hashes, 10)
        loads = sum(len(w.gpu.loads) for w in again.workers)
        failures = {}
        for r in again.restorers:
            for reason, count in r.stats.failures.items():
                failures[reason] = failures.get(reason, 0) + count
        corrupt_counters = exported_counters(ns, again)
        again.shutdown()
        if recompute_hits or loads:
            raise SystemExit("demo_restore: a corrupted chunk was loaded")
    return {
        "ranks": TP,
        "chunks_written": written,
        "restored_tokens": hits,
        "restored_bytes": restored_bytes,
        "blocks_equal": equal,
        "corrupted": str(victim.relative_to(store)),
        "after_corruption_hits": recompute_hits,
        "after_corruption_loads": loads,
        "failures": failures,
        "exported_counters": {
            "write": write_counters,
            "restart": counters,
            "corrupted": corrupt_counters,
        },
    }


if __name__ == "__main__":
    run("demo_restore.py", drive)
