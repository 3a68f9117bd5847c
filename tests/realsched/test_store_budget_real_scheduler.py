"""The writer at its disk budget (issue 33), on the real scheduler.

The real Scheduler and OffloadingConnector (scheduler role, with the CPU offloading
manager) build the store jobs of eight distinct conversations, one after the other; the
real, patched OffloadingConnectorWorker hands them to the real writer, whose store may
hold about three of them (GLM53_KV_OFFLOAD_DISK_GB). Only the DMA is played
(realsched.FakeTransfers). Two layouts: plain attention (three
boundaries a conversation, keep-2 supersedes one) and the hybrid (mamba state groups:
a state payload per boundary). At every step the store is under its budget; at the end
the newest trees hold every chunk and their last boundary, the oldest are gone whole,
every boundary the scheduler named was published, the writer's index is what a fresh
scan sees (one scan, at its first job), and `kvstore verify` exits 0.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import realsched
from test_store_tail_real_scheduler import boot_engine

OFFLOADING = "vllm.distributed.kv_transfer.kv_connector.v1.offloading"
PROMPT = 700  # tokens: 43 full blocks of 16, prefilled in three 256-token steps
CONVERSATIONS = 8
# One conversation: 43 full blocks of two 8 KiB attention pages, with its
# manifests and (hybrid) state payloads about 720 kB: the budget holds three.
DISK_GB = "0.0025"
BUDGET = 2_500_000


def prompt(r: int) -> list[int]:
    """Conversation r: its first block differs from every other's (its own tree)."""
    return [(r * 131 + i * 7) % 500 + 3 for i in range(PROMPT)]


def held(tier: Path) -> int:
    """Bytes under the rank base now; the writer renames and unlinks while this
    walks, so a file gone before its stat is not counted."""
    total = 0
    for base in (p for p in tier.iterdir() if p.is_dir()):
        for folder, _, files in os.walk(base):
            for name in files:
                try:
                    total += os.lstat(os.path.join(folder, name)).st_size
                except FileNotFoundError:
                    pass
    return total


def manifests(base: Path) -> list[dict]:
    return [json.loads(p.read_bytes()) for p in (base / "manifests").glob("*.json")]


def boot_hybrid(tmp_path):
    """boot_engine's worker on realsched's hybrid layout: every layer its own
    tensor of padded pages, each ref the layer's real (unpadded) page bytes,
    as vLLM's canonical caches give them."""
    import math

    import torch
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import (
        OffloadingConnector,
    )
    from vllm.v1.kv_cache_interface import MambaSpec
    from vllm.v1.kv_offload.base import (
        CanonicalKVCacheRef,
        CanonicalKVCaches,
        CanonicalKVCacheTensor,
    )

    booted = realsched.boot(cpu_bytes=8 << 20)
    connector = OffloadingConnector(
        booted.vllm_config, KVConnectorRole.WORKER, booted.worker_kv_cache_config
    )
    worker = connector.connector_worker
    groups = worker.spec.config.groups
    specs = realsched.layer_specs()
    names = sorted({n for g in groups for n in g.layer_names})
    page = next(iter(specs.values())).page_size_bytes
    num_blocks = booted.worker_kv_cache_config.num_blocks
    gen = torch.Generator().manual_seed(29)
    tensors = [
        CanonicalKVCacheTensor(
            torch.randint(
                -128, 127, (num_blocks, page), dtype=torch.int8, generator=gen
            ),
            page,
        )
        for _ in names
    ]

    def real(n):
        s = specs[n]
        if isinstance(s, MambaSpec):
            return sum(
                math.prod(sh) * torch.tensor([], dtype=dt).element_size()
                for sh, dt in zip(s.shapes, s.dtypes)
            )
        return s.page_size_bytes

    canonical = CanonicalKVCaches(
        tensors,
        [
            [CanonicalKVCacheRef(names.index(n), real(n)) for n in g.layer_names]
            for g in groups
        ],
    )
    transfers = realsched.FakeTransfers(canonical, rows=(8 << 20) // page)
    worker.spec.get_worker = lambda kv_caches: transfers
    worker._init_worker(canonical)
    return booted, worker, transfers


@pytest.mark.parametrize("target", ["attention", "hybrid"])
def test_the_writer_keeps_its_disk_budget_under_the_real_scheduler(
    knobs, tmp_path, target
):
    import importlib

    tier = tmp_path / "tier"
    knobs(**{"": "1", "DIR": str(tier), "CPU_GB": "1", "DISK_GB": DISK_GB})
    boot = boot_engine if target == "attention" else boot_hybrid
    booted, worker, transfers = boot(tmp_path)
    store = worker._kv_store
    assert store.writer.budget is not None and store.writer.budget.limit == BUDGET
    engine = realsched.Engine(booted)  # its block hasher; it does not step here
    s = booted.scheduler
    # The manifests the scheduler's store jobs name, by the root of their chain.
    named: dict[str, dict[int, str]] = {}
    fmt = importlib.import_module(f"{OFFLOADING}.kv_store_format")
    schedule = s.schedule

    def schedule_and_watch():
        out = schedule()
        jobs = getattr(out.kv_connector_metadata, "store_jobs", None) or {}
        for job in jobs.values():
            for c in (job.kv_store_meta or {}).get("candidates") or []:
                name = fmt.manifest_file_name(c["boundary"], c["chain"][-1].hex())
                named.setdefault(c["chain"][0].hex(), {})[c["boundary"]] = name
        return out

    s.schedule = schedule_and_watch
    chains: list[list[str]] = []
    for r in range(CONVERSATIONS):
        rid = f"c{r}"
        engine.add(rid, prompt(r), max_tokens=1)
        chains.append([bytes(h).hex() for h in s.requests[rid].block_hashes])
        finished: set[str] = set()
        for _ in range(50):
            if not s.has_requests():  # the busy loop (vllm serve)
                break
            realsched.step_worker(booted, worker, finished)
            # Under the budget at every step, the writer still busy: its files
            # in flight are counted through their jobs' bounds.
            assert held(tier) <= BUDGET, (r, held(tier), store.stats)
        else:
            raise AssertionError(f"conversation {r} did not end")
        assert store.writer.wait_idle()
        assert held(tier) <= BUDGET, (r, held(tier), store.stats)
    (base,) = [p for p in tier.iterdir() if p.is_dir()]
    stats = store.stats
    budget = store.writer.budget
    try:
        assert stats.chain_trees_evicted >= 3, stats
        assert stats.writes_refused_disk_budget == 0, stats
        assert stats.keys_lost == 0 and stats.manifests_dropped == 0, stats
        assert budget.scans == 1  # seeded once; the rest from its own writes
        index = budget.index.snapshot()
        layout = store.writer.layout
        scanned = importlib.import_module(f"{OFFLOADING}.kv_store_local.budget")
        assert index == scanned.scan(layout).snapshot()
    finally:
        worker.shutdown()
    roots = {m["chain"][0] for m in manifests(base)}
    full = PROMPT // realsched.BLOCK  # its full blocks, each a chunk
    stored = {p.stem for p in base.rglob("*.bin") if ".tmp." not in p.name}
    oldest = CONVERSATIONS - len(roots)
    assert oldest >= 3 and len(roots) >= 2, roots
    # Least recently used first: the newest conversations are what is left.
    assert roots == {chains[r][0] for r in range(oldest, CONVERSATIONS)}
    on_disk = {p.name for p in (base / "manifests").glob("*.json")}
    for r in range(oldest, CONVERSATIONS):  # every chunk, the last boundary
        assert set(chains[r][:full]) <= stored, r
        last = named[chains[r][0]]
        assert last[max(last)] in on_disk, r
    for r in range(oldest):  # retired whole: no manifest, no chunk they named
        # (A full block past the last state boundary is named by no manifest
        # of the hybrid's: a pending chunk, counted, never the budget's.)
        named_chunks = chains[r][: max(named[chains[r][0]]) // realsched.BLOCK]
        assert not set(named_chunks) & stored, r
    boundaries = sum(len(b) for b in named.values())
    assert len(named) == CONVERSATIONS, named
    assert stats.manifests_published == boundaries, (stats, boundaries)
    build = Path(os.environ.get("KVTIER_BUILD_DIR", realsched.REPO / "build"))
    done = subprocess.run(
        [str(build / "kvstore" / "kvstore"), "verify", str(tier)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
