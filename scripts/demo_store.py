"""Drive the patched worker-local store path with generated KV bytes.

The main job (scripts/demo.py) calls this on a tree patched by `overlay apply`.
It loads the PATCHED scheduler and worker modules of that tree through the
harness (sim/harness: real vLLM files, small stubs for torch and the rest),
builds the 7-group hybrid layout of sim/hybrid_layout.py, like the
requirements' model, and runs several requests through them:

    g0 full attention, g1 scratch (not prefix-cacheable), g2-g5 state (mamba),
    g6 an EAGLE drafter (sliding window)

For every scheduler step the real `build_connector_meta` creates the store jobs
and attaches the store side channel; the real worker remembers them; this
driver then plays the GPU: it fills the job's CPU staging rows with generated
bytes and reports the transfer finished, and the real worker captures the
bytes and hands them to the writer thread. Nothing here writes the store
itself.

Usage: demo_store.py TREE STORE_DIR  (prints one JSON line of figures)
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "sim"))

import harness  # noqa: E402
from demo_driver import run, set_store_knobs  # noqa: E402
from hybrid_layout import HybridVllm  # noqa: E402
from store_rig import StoreRig  # noqa: E402

BLOCK = 256  # tokens per block (and per offloaded chunk)
HASH = 64  # tokens per prefix-cache hash
NUM_BLOCKS = 256
ROW = 64 << 10  # one CPU staging row: room for the largest page
STAGING_ROWS = 512
# The engine's sizes, as HybridVllm takes them.
ENGINE = dict(
    block=BLOCK, hash_unit=HASH, num_blocks=NUM_BLOCKS, max_model_len=32 * BLOCK
)

# Chains: (request id, prompt blocks, the request it forks from, fork block).
# "b" shares a's first 4 blocks, so the store holds a forked chain.
REQUESTS = (
    ("a", 8, None, 0),
    ("b", 8, "a", 4),
    ("c", 6, None, 0),
)


def chain_hashes(req_id: str, blocks: int, parent: list[bytes] | None, fork: int):
    hashes = list(parent[: fork * (BLOCK // HASH)]) if parent else []
    while len(hashes) < blocks * (BLOCK // HASH):
        hashes.append(hashlib.sha256(f"{req_id}/{len(hashes)}".encode()).digest())
    return hashes


def drive(tree: Path, store_dir: Path) -> dict:
    set_store_knobs(store_dir, GLM53_KV_OFFLOAD_KEEP_BOUNDARIES="2")
    with harness.engine(tree) as ns:
        engine = HybridVllm(
            ns, **ENGINE, model="demo/hybrid-7g", engine_id="demo-engine"
        )
        rig = StoreRig(engine, rows=STAGING_ROWS, row_bytes=ROW)
        store, region = rig.store, rig.region
        if not store.active:
            raise SystemExit(f"demo_store: writer disabled: {store.disabled_reason}")

        chains: dict[str, list[bytes]] = {}
        generated = 0
        jobs = 0
        for n, (req_id, blocks, parent, fork) in enumerate(REQUESTS):
            hashes = chain_hashes(req_id, blocks, chains.get(parent), fork)
            chains[req_id] = hashes

            def dma(job, req_id=req_id) -> None:
                """Fill every staging row the job names with KV bytes."""
                nonlocal generated, jobs
                jobs += 1
                for chunk in job.dst_spec.block_ids:
                    row = int(chunk) * ROW
                    seed = hashlib.sha256(f"{req_id}/{chunk}".encode()).digest()
                    region[row : row + ROW] = seed * (ROW // len(seed))
                    generated += ROW

            rig.request(n, req_id, blocks, hashes, dma)
        if not store.writer.wait_idle(60):
            raise SystemExit("demo_store: the writer did not drain in 60 s")
        stats = store.stats
        rig.worker.shutdown()
        return {
            "requests": len(REQUESTS),
            "jobs": jobs,
            "staged_bytes": generated,
            "jobs_captured": stats.jobs_captured,
            "stats": {k: v for k, v in vars(stats).items() if isinstance(v, int)},
            "base": str(store.writer.layout.base),
        }


if __name__ == "__main__":
    run("demo_store.py", drive)
