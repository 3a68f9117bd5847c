"""A TP cluster in one process: the real patched scheduler, tiering manager and workers.

Used by tests/python/restore/test_kv_offload_restore.py and scripts/demo_restore.py. On a tree with
kv-offload-scope, kv-offload-store-local and kv-offload-restore applied, it
runs, through the test harness (real vLLM files, stubs for torch):

- the real ``OffloadingConnectorScheduler`` over a real
  ``TieringOffloadingManager`` whose primary is the real CPU manager and whose
  secondary tier is our ``LocalStoreTier``, created by vLLM's
  ``SecondaryTierFactory`` from the same ``module_path`` config a deployment
  uses;
- one real ``OffloadingConnectorWorker`` per TP rank, each with its own
  worker-local writer and restorer over its own store;
- one shared CPU region laid out like ``SharedOffloadRegion``: row ``c`` is
  ``| rank 0 slot | rank 1 slot |``; the scheduler's primary view is that
  region, each rank's staging is its own slot.

The GPU is played by ``Gpu``: a store "DMA" fills the rank's slot of the
job's rows with bytes derived from (rank, key); a load "DMA" copies the rank's
slot of the source rows into ``gpu.blocks``. The metadata each worker sees is
a pickled copy of the scheduler's, and worker metadata is aggregated over
ranks with vLLM's own ``aggregate``, as the executor does.
"""

from __future__ import annotations

import hashlib
import inspect
import pickle
import sys
from pathlib import Path
from types import SimpleNamespace

from fake_offloading import HostTensor
from hybrid_layout import STATE_GROUPS, HybridVllm, scheduler_output

REPO = Path(__file__).resolve().parents[1]
OFFLOADING = "vllm.distributed.kv_transfer.kv_connector.v1.offloading"
TIER_CONFIG = {"type": "LocalStoreTier", "module_path": f"{OFFLOADING}.kv_restore_tier"}
BLOCK = 256  # tokens per block and per chunk
HASH = 64
NUM_BLOCKS = 256
SLOT = 64 << 10  # one rank's share of a CPU row
NUM_CHUNKS = 128


def pattern(rank: int, key: bytes, size: int) -> bytes:
    seed = hashlib.sha256(b"%d/" % rank + bytes(key)).digest()
    return (seed * (size // len(seed) + 1))[:size]


def chain_hashes(name: str, blocks: int, prefix: list[bytes] | None = None):
    hashes = list(prefix or [])
    while len(hashes) < blocks * (BLOCK // HASH):
        hashes.append(hashlib.sha256(f"{name}/{len(hashes)}".encode()).digest())
    return hashes


def empty_output():
    return SimpleNamespace(
        scheduled_new_reqs=[],
        scheduled_cached_reqs=SimpleNamespace(
            req_ids=[], new_block_ids=[], resumed_req_ids=set()
        ),
        kv_cache_block_copies=None,
        num_scheduled_tokens={},
        finished_req_ids=set(),
        preempted_req_ids=set(),
        kv_connector_block_state=None,
    )


class Region:
    """Stands in for SharedOffloadRegion: one bytearray, rows of tp slots."""

    def __init__(self, tp: int) -> None:
        self.row = tp * SLOT
        self.data = bytearray(NUM_CHUNKS * self.row)

    def create_kv_memoryview(self) -> memoryview:
        return memoryview(self.data).cast("B", (NUM_CHUNKS, self.row))

    def cleanup(self) -> None:
        return

    def slot(self, rank: int, chunk: int, size: int) -> bytes:
        start = chunk * self.row + rank * SLOT
        return bytes(self.data[start : start + size])


class Gpu:
    """Plays one rank's CPU offloading worker; transfers finish when told."""

    def __init__(self, rig: Rig, rank: int) -> None:
        self.rig = rig
        self.rank = rank
        self.stores: list[tuple[int, object]] = []
        self.loads: list[tuple[int, list[int], object]] = []
        self.blocks: dict[int, bytes] = {}  # GPU block id -> bytes loaded
        self.done: list[int] = []
        # Where the GPU blocks' addresses point: row b is block b (never read).
        self.rows = bytearray(SLOT)
        self.tensor = HostTensor(self.rows, SLOT)

    def gpu_blocks(self, gpu) -> list[int]:
        """The GPU block ids of a transfer: vLLM 0.34.0 passes their addresses
        (DevicePointers, from the canonical tensor), 0.33.0 the spec."""
        if hasattr(gpu, "block_ids"):
            return [int(b) for b in gpu.block_ids]
        base = self.tensor.data_ptr()
        return [(int(p) - base) // SLOT for p in gpu.ptrs]

    def submit_store(self, job_id, src, dst_spec):
        self.stores.append((job_id, dst_spec))
        return True

    def submit_load(self, job_id, src_spec, dst, expedited=False):
        chunks = [int(c) for c in src_spec.block_ids]
        self.loads.append((job_id, chunks, dst))
        for chunk, block in zip(chunks, self.gpu_blocks(dst), strict=False):
            self.blocks[block] = self.rig.region.slot(self.rank, chunk, SLOT)
        self.done.append(job_id)
        return True

    def get_finished(self):
        done, self.done = self.done, []
        return [self.rig.vllm.base.TransferResult(j, True, 1, 0.001) for j in done]

    def wait(self, job_ids):
        return

    def shutdown(self):
        return


class Rig(HybridVllm):
    """tp ranks over one store root; the real scheduler, manager and workers."""

    def __init__(
        self,
        ns,
        root,
        tp: int = 1,
        region: Region | None = None,
        tier: bool = True,
        ranks: list[int] | None = None,
        scheduler: bool = True,
        hash_algo: str = "sha256",
    ):
        """``ranks``/``scheduler``: what this process runs (all of it by default)."""
        super().__init__(
            ns,
            block=BLOCK,
            hash_unit=HASH,
            num_blocks=NUM_BLOCKS,
            max_model_len=64 * BLOCK,
            model="test/restore-7g",
            engine_id="restore-engine",
        )
        self.vllm = self
        self.tp = tp
        self.root = root
        self.region = region or Region(tp)
        self.with_tier = tier
        self.hash_algo = hash_algo
        # Promotions run on each worker's read queue; by default a step
        # waits for the ones it started, as if the disk were fast (False: they
        # report whenever a later step finds them done).
        self.wait_promotions = True
        self.layout = self.hybrid_layout()
        self.keys_written: dict[bytes, int] = {}  # key -> group
        self.scheduler = self._make_scheduler() if scheduler else None
        self.ranks = list(range(tp)) if ranks is None else list(ranks)
        self.workers = [self._make_worker(rank) for rank in self.ranks]
        self.restorers = [getattr(w, "_kv_restore", None) for w in self.workers]

    def rank_config(self, rank: int):
        cfg = self.vllm_config()
        p = cfg.parallel_config
        p.tensor_parallel_size = p.world_size = self.tp
        p.rank = rank
        cfg.cache_config.prefix_caching_hash_algo = self.hash_algo
        return cfg

    def _spec(self, rank: int, manager=None, gpu=None):
        base = self.base
        offloading_config = self.config.build_offloading_config(
            self.rank_config(rank), self.layout
        )

        class Spec(base.OffloadingSpec):
            def get_manager(self):
                return manager_box[0]

            def get_worker(self, kv_caches):
                return gpu

        manager_box = [manager]
        spec = Spec(offloading_config)
        spec.manager_box = manager_box
        return spec

    def _make_scheduler(self):
        tiering = self.ns.load("vllm.v1.kv_offload.tiering.manager")
        factory = self.ns.load("vllm.v1.kv_offload.tiering.factory")
        spec = self._spec(0)
        primary = tiering.CPUPrimaryTierOffloadingManager(
            num_chunks=NUM_CHUNKS, mmap_region=self.region
        )
        # Without the tier: the store-only deployment (no secondary tiers).
        self.tier = None
        if self.with_tier:
            self.tier = factory.SecondaryTierFactory.create_secondary_tier(
                dict(TIER_CONFIG), primary.get_kv_memoryview(), spec
            )
        # 0.33.0 paces its tier polls (0: every step, as releases before it did).
        poll = (
            {"tier_poll_interval_s": 0}
            if "tier_poll_interval_s"
            in inspect.signature(tiering.TieringOffloadingManager).parameters
            else {}
        )
        self.manager = tiering.TieringOffloadingManager(
            primary, [self.tier] if self.tier else [], **poll
        )
        spec.manager_box[0] = self.manager
        self.spec = spec
        return self.scheduler_mod.OffloadingConnectorScheduler(
            spec, self.rank_config(0), self.layout
        )

    @property
    def scheduler_mod(self):
        return self.ns.load(f"{OFFLOADING}.scheduler")

    def _make_worker(self, rank: int):
        gpu = Gpu(self, rank)
        spec = self._spec(rank, gpu=gpu)
        worker = self.worker.OffloadingConnectorWorker(
            spec, self.rank_config(rank), self.layout
        )
        worker.gpu = gpu
        store = worker._kv_store
        adapter = sys.modules[f"{OFFLOADING}.kv_store_local.vllm_worker"]
        staging = [
            adapter.StagingTensor(self.region.data, rank * SLOT, self.region.row, SLOT)
        ]
        # The real lookup walks the CPU worker's torch tensors; ours is a bytearray.
        adapter.staging_from_worker = lambda w, caches: staging
        pages = [
            self.layout.kv_cache_groups[g.group_id].kv_cache_spec.page_size_bytes
            for g in spec.config.groups
        ]
        refs = [[self.base.CanonicalKVCacheRef(0, p)] for p in pages]
        worker._init_worker(
            self.base.CanonicalKVCaches(
                [self.base.CanonicalKVCacheTensor(gpu.tensor, SLOT)], refs
            )
        )
        assert store.active, store.disabled_reason
        return worker

    def page_bytes(self, key: bytes) -> int:
        group = int.from_bytes(key[-4:], "big")
        return self.layout.kv_cache_groups[group].kv_cache_spec.page_size_bytes

    # -- one engine step --------------------------------------------------------

    def step(self, output=None):
        """build_connector_meta, every rank's worker step, update_connector_output."""
        meta = self.begin_step(output)
        blob = pickle.dumps(meta)  # each rank gets its own copy, as over the wire
        self.end_step([self.worker_step(i, blob) for i in range(len(self.workers))])
        return meta

    def begin_step(self, output=None):
        return self.scheduler.build_connector_meta(output or empty_output())

    def worker_step(self, index: int, blob: bytes) -> bytes:
        """One rank's step on its copy of the metadata; its pickled worker meta."""
        common = self.common
        rank, worker = self.ranks[index], self.workers[index]
        mine = pickle.loads(blob)
        worker.handle_preemptions(mine)
        worker.start_kv_transfers(mine)
        worker.prepare_store_kv(mine)
        # The deferred stores start at once here (the next step's start).
        worker.start_kv_transfers(common.OffloadingConnectorMetadata({}, {}))
        for job_id, dst in worker.gpu.stores:
            keys = mine.store_jobs[job_id].kv_store_meta["keys"]
            for key, chunk in zip(keys, dst.block_ids, strict=True):
                start = int(chunk) * self.region.row + rank * SLOT
                self.region.data[start : start + SLOT] = pattern(rank, key, SLOT)
                self.keys_written[bytes(key)] = int.from_bytes(key[-4:], "big")
            worker.gpu.done.append(job_id)
        worker.gpu.stores.clear()
        worker.get_finished(set())
        restorer = getattr(worker, "_kv_restore", None)
        if self.wait_promotions and restorer is not None:
            # The reads finish within the step (a fast disk): reported now.
            assert restorer.wait_idle(60)
        return pickle.dumps(worker.build_connector_worker_meta())

    def end_step(self, blobs: list[bytes]) -> None:
        """Aggregate the ranks' worker metadata as the executor does; deliver it."""
        total = self.common.OffloadingWorkerMetadata()
        for blob in blobs:
            wm = pickle.loads(blob)
            if wm is not None:
                total = total.aggregate(wm)
        self.scheduler.update_connector_output(
            SimpleNamespace(kv_connector_worker_meta=total)
        )

    def drain_writers(self) -> None:
        for w in self.workers:
            assert w._kv_store.writer.wait_idle(60)

    # -- requests ---------------------------------------------------------------

    def store_request(self, req_id: str, hashes: list[bytes], blocks: int, n: int):
        """Schedule a prompt afresh; its chunks and state boundaries get stored."""
        request = self.request(req_id, hashes, blocks * BLOCK)
        self.scheduler.on_new_request(request)
        self.scheduler.get_num_new_matched_tokens(request, 0)
        block_ids = tuple(
            [10000 * n + 100 * g + b + 1 for b in range(blocks)] for g in range(7)
        )
        handoffs = {
            req_id: [
                (g, 50000 + 1000 * n + 10 * g + b, b * BLOCK)
                for b in range(2, blocks + 1, 2)
                for g in STATE_GROUPS
            ]
        }
        self.step(scheduler_output(request, block_ids, handoffs))
        self.step()  # acks reach the scheduler, cascades complete
        self.drain_writers()
        return request

    def lookup(self, request, max_steps: int = 20):
        """get_num_new_matched_tokens until it stops deferring, stepping between."""
        for _ in range(max_steps):
            hits = self.scheduler.get_num_new_matched_tokens(request, 0)
            if hits[0] is not None:
                return hits
            self.step()
        raise AssertionError("lookup still deferred")

    def load(self, request, hits: int, n: int = 9):
        """Allocate GPU blocks for the hit and run the load job on every rank."""
        self.allocate(request, hits, n)
        return self.step()

    def allocate(self, request, hits: int, n: int = 9) -> None:
        """The KV cache manager's allocation of the hit: update_state_after_alloc.

        State groups get one real block, at the boundary (vLLM's sparse
        mamba "align" layout); the other groups one block per token block.
        """
        blocks_needed = hits // BLOCK + 1
        groups = []
        for g in range(7):
            group = []
            for b in range(blocks_needed):
                null = g in STATE_GROUPS and b != hits // BLOCK - 1
                group.append(
                    SimpleNamespace(
                        block_id=0 if null else 90000 + 1000 * n + 100 * g + b + 1,
                        is_null=null,
                        block_hash=None,
                    )
                )
            groups.append(group)
        self.scheduler.update_state_after_alloc(
            request, SimpleNamespace(blocks=groups), hits
        )

    def shutdown(self) -> None:
        for w in self.workers:
            w.shutdown()


def env_on(monkeypatch, root, restore: bool = True) -> None:
    monkeypatch.setenv("GLM53_KV_OFFLOAD", "1")
    monkeypatch.setenv("GLM53_KV_OFFLOAD_DIR", str(root))
    monkeypatch.setenv("GLM53_KV_OFFLOAD_BUILD_ID", "restore-test")
    monkeypatch.setenv("GLM53_KV_OFFLOAD_CPU_GB", "1")
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    if restore:
        monkeypatch.setenv("GLM53_KV_OFFLOAD_RESTORE", "1")
    else:
        monkeypatch.delenv("GLM53_KV_OFFLOAD_RESTORE", raising=False)


def rescan_now(rig: Rig) -> None:
    for r in rig.restorers:
        r.rescan_seconds = 0.0
