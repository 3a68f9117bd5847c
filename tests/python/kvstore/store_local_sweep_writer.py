"""The real store-local writer beside `kvstore gc --sweep` (issue 37).

Runs kv_store_local's WorkerStore (its writer thread, the hybrid layout of
store_local_support) on one rank and writes boundaries the way a hybrid
model's store jobs arrive: job 1 carries only full-attention chunks (so it
names no boundary candidate), the writer goes idle (it flushes and drops the
store lock), then job 2 carries the state payloads of the boundary and its
candidate. A sweep between the two jobs must not take job 1's chunks for
orphans, whatever its --grace.

usage: store_local_sweep_writer.py TIER STOP_FILE RANK MAX_BOUNDARIES [DISK_BYTES]
(DISK_BYTES: the writer keeps its store under that budget, evicting.)
Loops until STOP_FILE exists or MAX_BOUNDARIES boundaries were submitted,
then shuts the writer down cleanly and prints one JSON line: boundaries
submitted, manifests published and dropped (refused at publish), keys
written and failed. Every boundary has its own name, so published ==
boundaries means none was lost.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

# store_local_support is in tests/python, one folder up; sim/ is beside tests/.
TESTS_PYTHON = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS_PYTHON))
sys.path.insert(0, str(TESTS_PYTHON.parents[1] / "sim"))

import store_local_support as sls  # noqa: E402
from store_local_support import ksl  # noqa: E402

CHUNKS_PER_CONVERSATION = 6  # a new conversation (tree) after this many chunks


class Conversation:
    """Block hashes of one request and the positions of its offload keys."""

    def __init__(self, rank: int, number: int) -> None:
        self.prefix = f"{rank}:{number}"
        self.block_hashes: list[bytes] = []
        self.positions: dict[bytes, int] = {}
        self.req_context = type(
            "Ctx", (), {"get_offload_key_position": staticmethod(self.positions.get)}
        )()
        self.req = self  # SchedulerStoreMeta reads req.block_hashes

    def hash(self, i: int) -> bytes:
        while len(self.block_hashes) <= i:
            n = len(self.block_hashes)
            self.block_hashes.append(
                hashlib.sha256(f"{self.prefix}:{n}".encode()).digest()
            )
        return self.block_hashes[i]


class Jobs:
    def __init__(self, staging: sls.Staging) -> None:
        self.staging = staging
        self.layouts = {g.group: g for g in sls.group_layouts()}
        self.meta = sls.JobMaker(staging).meta
        self.next_row = 0
        self.next_job = 0

    def job(self, conv: Conversation, keys: list[tuple[int, int]]) -> sls.Job:
        """A store job of (chunk index, group) keys; staging filled as the DMA
        would fill it."""
        sizes = [0] * 5
        indices = [0] * 5
        offload = []
        for i, group in keys:
            slot = self.layouts[group].slot
            if sizes[slot] == 0:
                indices[slot] = i
            sizes[slot] += 1
            key = sls.offload_key(conv.hash(i), group)
            conv.positions[key] = (i + 1) * sls.TOKENS_PER_CHUNK
            offload.append(key)
        meta = self.meta.build(offload, conv)
        job = sls.Job(self.next_job, [], sizes, indices, meta)
        self.next_job += 1
        for key in meta["keys"]:
            row = self.next_row % sls.NUM_CHUNKS
            self.next_row += 1
            job.chunk_ids.append(row)
            group = ksl.side_channel.key_group(key)
            self.staging.dma(row, self.layouts[group], key)
        return job


def main() -> int:
    tier, stop = Path(sys.argv[1]), Path(sys.argv[2])
    rank, limit = int(sys.argv[3]), int(sys.argv[4])
    disk_bytes = int(sys.argv[5]) if len(sys.argv) > 5 else None
    try:
        store, staging = sls.make_store(
            tier,
            knobs=sls.knobs(tier, disk_bytes=disk_bytes),
            tp=lambda: (rank, sls.TP_SIZE),
            settings=sls.settings(config_rank=rank),
            budget=4 << 20,
            background=True,
        )
    except ksl.errors.StoreRefused as e:
        print(json.dumps({"error": str(e)}))
        return 1
    jobs = Jobs(staging)
    boundaries = 0
    conv_number = 0
    while boundaries < limit and not stop.exists():
        conv = Conversation(rank, conv_number)
        conv_number += 1
        for i in range(CHUNKS_PER_CONVERSATION):
            if boundaries >= limit or stop.exists():
                break
            # Job 1: the chunk's full-attention pages only, no candidate.
            sls.run_job(store, jobs.job(conv, [(i, 0)]))
            store.writer.wait_idle()  # flushed: the store lock is dropped
            time.sleep(0.002)  # a sweep may run between the jobs
            # Job 2: the boundary's state payloads, which name the candidate.
            sls.run_job(store, jobs.job(conv, [(i, g) for g in sls.STATE_GROUPS]))
            boundaries += 1
    store.writer.wait_idle()
    stats = store.stats
    store.shutdown()
    print(
        json.dumps(
            {
                "boundaries": boundaries,
                "published": stats.manifests_published,
                "dropped": stats.manifests_dropped,
                "keys_written": stats.keys_written,
                "keys_failed": stats.keys_failed,
                "chain_trees_evicted": stats.chain_trees_evicted,
                "writes_refused_disk_budget": stats.writes_refused_disk_budget,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
