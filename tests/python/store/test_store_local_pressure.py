"""No lost chains under pressure, with vLLM's real CPU offloading manager.

Both overlays are applied to a copy of the pinned tree; the harness runs the
patched scheduler and worker with the tree's real ``CPUOffloadingManager``
(LRU, a CPU tier small enough to evict and reuse rows), so a key that is
already in the CPU tier is never offered for a store again. The test plays
the GPU (fills the staging rows each store job names) and holds the writer
back (it drains only every few steps), so captures overflow a small pool;
other runs fail writes with ENOSPC or EIO. Each run counts the boundary
manifests published against an unpressured run of the same workload, with
the recapture on and off (off = the writer before this fix).
"""

from __future__ import annotations

import errno
import functools
import hashlib
import os
import sys
from pathlib import Path

import harness
import pytest
from hybrid_layout import OFFLOADING, HybridVllm
from store_local_support import chunk_fmt, fmt
from store_rig import StoreRig
from trees import patched_copy

BLOCK = 256
HASH = 64
ROW = 64 << 10  # one staging row: the full-attention page (32 KiB) + room
FULL_PAGE = 32 << 10
CPU_CHUNKS = 256  # the CPU tier: larger than the pool, as in a deployment
# (request, prompt blocks, parent request, blocks shared with the parent)
WORKLOAD = (
    ("a", 8, None, 0),
    ("b", 8, "a", 4),
    ("c", 8, None, 0),
    ("d", 10, "b", 6),
    ("e", 8, "c", 6),
    ("f", 12, "d", 8),
    ("g", 8, None, 0),
    ("h", 10, "g", 4),
)


@pytest.fixture(scope="module")
def patched_tree(overlay_bin, engine_tree, manifests_dir, tmp_path_factory):
    dst = tmp_path_factory.mktemp("pressure")
    return patched_copy(
        overlay_bin,
        engine_tree,
        dst,
        manifests_dir,
        "kv-offload-scope,kv-offload-store-local",
    )


def row_bytes(key: bytes) -> bytes:
    return hashlib.sha256(key).digest() * (ROW // 32)


class Run:
    """One boot of the patched connector on the real manager, and its store."""

    def __init__(self, ns, monkeypatch, root, *, budget, recapture, drain_every):
        for name, value in {
            "GLM53_KV_OFFLOAD": "1",
            "GLM53_KV_OFFLOAD_DIR": str(root),
            "GLM53_KV_OFFLOAD_CPU_GB": "1",
            "GLM53_KV_OFFLOAD_KEEP_BOUNDARIES": "0",
        }.items():
            monkeypatch.setenv(name, value)
        vllm = HybridVllm(
            ns, block=BLOCK, hash_unit=HASH, num_blocks=512, max_model_len=64 * BLOCK
        )
        manager = ns.load("vllm.v1.kv_offload.cpu.manager")
        recap = ns.load(f"{OFFLOADING}.kv_store_local.recapture")

        def tune(store) -> None:
            # A pool a few chunks deep (the knob's floor is 16 MiB), the
            # writer on the test's thread, and the recapture on or off.
            store._budget = budget
            store._recapture_on = recapture
            store._owed = recap.OwedKeys(store.stats, keep=recapture)
            store.attach = functools.partial(
                type(store).attach, store, background=False
            )

        self.rig = StoreRig(
            vllm,
            rows=CPU_CHUNKS,
            row_bytes=ROW,
            manager=manager.CPUOffloadingManager(num_chunks=CPU_CHUNKS),
            before_attach=tune,
        )
        self.store = self.rig.store
        assert self.store.active, self.store.disabled_reason
        self.worker = self.rig.worker
        self.writer = self.store.writer
        self.writer.autodrain = False
        self.drain_every = drain_every
        self.steps = 0
        self.candidates: set[str] = set()

    def dma(self, job) -> None:
        region = self.rig.region
        for key, chunk in zip(
            job.kv_store_meta["keys"], job.dst_spec.block_ids, strict=True
        ):
            region[chunk * ROW : (chunk + 1) * ROW] = row_bytes(key)
        for c in job.kv_store_meta["candidates"]:
            self.candidates.add(
                fmt.manifest_file_name(c["boundary"], c["chain"][-1].hex())
            )

    def request(self, n: int, req_id: str, blocks: int, hashes: list[bytes]):
        self.rig.request(n, req_id, blocks, hashes, self.dma)
        self.steps += 1
        if self.steps % self.drain_every == 0:
            self.writer.drain()

    def conversations(self, first: int = 0, suffix: str = "", drain: bool = False):
        """The WORKLOAD's requests, in order (ids from ``first``)."""
        chains: dict[str, list[bytes]] = {}
        for n, (req_id, blocks, parent, shared) in enumerate(WORKLOAD):
            per = BLOCK // HASH
            hashes = list(chains[parent][: shared * per]) if parent else []
            while len(hashes) < blocks * per:
                hashes.append(
                    hashlib.sha256(f"{req_id}/{len(hashes)}".encode()).digest()
                )
            chains[req_id] = hashes
            self.request(first + n, req_id + suffix, blocks, hashes)
            if drain:
                self.writer.drain()

    def play(self) -> None:
        self.conversations()
        # The traffic goes on (new conversations), the writer catches up.
        for n in range(len(WORKLOAD), len(WORKLOAD) + 4):
            hashes = [hashlib.sha256(f"z{n}/{i}".encode()).digest() for i in range(8)]
            self.request(n, f"z{n}", 2, hashes)
        self.writer.drain()

    def published(self) -> set[str]:
        return {
            n
            for n in os.listdir(self.writer.layout.manifest_dir)
            if n.endswith(".json")
        }

    def check_payloads(self) -> None:
        """Every full-attention chunk holds its own row's bytes."""
        for path in sorted(
            p
            for p in Path(self.writer.layout.base).rglob("*.bin")
            if "_g0" in p.parent.name
        ):
            header = chunk_fmt.verify_chunk_file(str(path))
            key = header.key_hash + (0).to_bytes(4, "big")
            with open(path, "rb") as f:
                assert f.read()[-FULL_PAGE:] == row_bytes(key)[:FULL_PAGE]


def play(patched_tree, engine_name, monkeypatch, tmp_path, name, **kw) -> Run:
    with harness.engine(patched_tree, package=engine_name) as ns:
        run = Run(ns, monkeypatch, tmp_path / name, **kw)
        run.play()
        run.check_payloads()
        run.worker.shutdown()
    return run


def test_recapture_publishes_every_boundary_under_budget_pressure(
    patched_tree, engine_name, monkeypatch, tmp_path
):
    calm = play(
        patched_tree, engine_name, monkeypatch, tmp_path, "calm",
        budget=64 << 20, recapture=True, drain_every=1,
    )  # fmt: skip
    expected = calm.published()
    assert expected == calm.candidates and len(expected) >= 20
    figures = {}
    for recapture in (False, True):
        run = play(
            patched_tree, engine_name, monkeypatch, tmp_path, f"r{int(recapture)}",
            budget=6 * FULL_PAGE, recapture=recapture, drain_every=3,
        )  # fmt: skip
        assert run.candidates == expected  # the same workload, step for step
        figures[recapture] = (len(run.published()), run.store.stats.drops())
    print(
        f"\nbudget pressure: {len(expected)} boundaries without pressure; "
        f"before (no recapture) {figures[False][0]}, after {figures[True][0]}; "
        f"drops before {figures[False][1]}, after {figures[True][1]}"
    )
    assert figures[False][1]["budget"] > 0
    assert figures[False][0] < len(expected)  # chains lost without the fix
    assert figures[True][0] == len(expected)  # every boundary with it


@pytest.mark.parametrize("fault", [errno.ENOSPC, errno.EIO])
def test_recapture_publishes_every_boundary_after_write_faults(
    patched_tree, engine_name, monkeypatch, tmp_path, fault
):
    calm = play(
        patched_tree, engine_name, monkeypatch, tmp_path, "calm",
        budget=64 << 20, recapture=True, drain_every=1,
    )  # fmt: skip
    expected = calm.published()
    figures = {}
    for recapture in (False, True):
        run = FaultRun(patched_tree, engine_name, monkeypatch, tmp_path, fault)
        run.go(recapture)
        figures[recapture] = (len(run.published), run.drops)
    print(
        f"\n{errno.errorcode[fault]}: {len(expected)} boundaries without faults; "
        f"before (no recapture) {figures[False][0]}, after {figures[True][0]}; "
        f"drops before {figures[False][1]}, after {figures[True][1]}"
    )
    assert figures[False][0] < len(expected)
    assert figures[True][0] == len(expected)


class FaultRun:
    """A run whose native store library fails a burst of chunk writes
    (its test seam: the 10th to 13th file writes fail with the fault)."""

    def __init__(self, patched_tree, engine_name, monkeypatch, tmp_path, fault):
        self.tree = patched_tree
        self.engine = engine_name
        self.monkeypatch = monkeypatch
        self.root = tmp_path / f"{errno.errorcode[fault]}"
        self.fault = fault

    def go(self, recapture: bool) -> None:
        with harness.engine(self.tree, package=self.engine) as ns:
            native = ns.load(f"{OFFLOADING}.kv_store_format.native")
            run = Run(
                ns, self.monkeypatch, self.root / f"r{int(recapture)}",
                budget=64 << 20, recapture=recapture, drain_every=1,
            )  # fmt: skip
            run.writer.pause_seconds = 0.0  # ENOSPC: space is back at once
            run.store._owed.retry_failed_after = 0.0
            lib = run.writer.store_lib
            lib.test_fault(native.FAULT_WRITE, self.fault, 9, 4)
            try:
                run.play()
            finally:
                lib.test_fault(native.FAULT_NONE)
            run.check_payloads()
            run.worker.shutdown()
        self.published = run.published()
        self.drops = run.store.stats.drops()


def test_rows_reused_before_a_retry_are_offered_again(
    patched_tree, engine_name, monkeypatch, tmp_path
):
    """A CPU tier small enough to evict: an owed key whose row a new store
    takes is lost to the recapture (counted), but the manager evicted it, so
    the next request with that prefix offers it again and its chain
    completes; without recapture the keys still resident never do."""
    monkeypatch.setattr(sys.modules[__name__], "CPU_CHUNKS", 40)
    results = {}
    for recapture in (False, True):
        with harness.engine(patched_tree, package=engine_name) as ns:
            run = Run(
                ns, monkeypatch, tmp_path / f"r{int(recapture)}",
                budget=6 * FULL_PAGE, recapture=recapture, drain_every=3,
            )  # fmt: skip
            run.play()
            run.conversations(first=100, suffix="-again", drain=True)  # they return
            run.check_payloads()
            results[recapture] = (len(run.published()), run.store.stats.drops())
            expected = len(run.candidates)
            run.worker.shutdown()
    print(
        f"\neviction: {expected} candidate boundaries; before (no recapture) "
        f"{results[False][0]}, after {results[True][0]}; drops after {results[True][1]}"
    )
    assert results[True][1]["lost"] > 0  # rows really were reused first
    assert results[True][0] == expected
    assert results[False][0] < expected
