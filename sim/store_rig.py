"""The patched connector's scheduler and worker, booted on the 7-group layout,
with a fake GPU and the staging rows in a bytearray.

The writer runs for real; only what needs a GPU is played here: the CPU
offloading worker (``FakeTransferWorker``) and its staging tensors (one
bytearray of ``rows`` rows). ``request`` runs one prompt through a scheduler
step, the DMA (``fill``) and the transfer's completion, the way vLLM calls the
connector. Used by the main job's store stage and the store-local tests.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from fake_offloading import FakeTransferWorker, HostTensor, make_spec
from hybrid_layout import NUM_GROUPS, OFFLOADING, STATE_GROUPS, HybridVllm
from hybrid_layout import scheduler_output as step_output


class StoreRig:
    def __init__(
        self,
        vllm: HybridVllm,
        *,
        rows: int,
        row_bytes: int,
        manager: Any = None,
        before_attach: Callable[[Any], None] | None = None,
        device: Any = None,
        gpu_blocks: int = 0,
    ) -> None:
        """manager: the offloading manager (default: the recording one,
        handing out rows in order); before_attach(store) runs before the
        worker attaches the writer (to change its settings). device: a
        capture device (kv_store_local.capture_device) standing in for the
        CUDA one, with ``gpu_blocks`` blocks of ``row_bytes`` in ``self.kv``
        as the GPU KV cache it copies from; None: the first capture copies
        out of staging (no CUDA worker here)."""
        self.vllm = vllm
        self.row_bytes = row_bytes
        kv_cache_config = vllm.hybrid_layout()
        vllm_config = vllm.vllm_config()
        self.gpu = FakeTransferWorker(vllm.base)
        self.spec = make_spec(
            vllm,
            vllm.offloading_config(vllm_config, kv_cache_config),
            worker=self.gpu,
            rows=rows,
            manager=manager,
        )
        self.manager = self.spec.manager
        self.scheduler = vllm.scheduler.OffloadingConnectorScheduler(
            self.spec, vllm_config, kv_cache_config
        )
        self.worker = vllm.worker.OffloadingConnectorWorker(
            self.spec, vllm_config, kv_cache_config
        )
        self.store = self.worker._kv_store
        self.region = bytearray(rows * row_bytes)
        self.kv = bytearray(gpu_blocks * row_bytes)
        if self.store is None:
            return  # the knob is off
        if before_attach is not None:
            before_attach(self.store)
        adapter = sys.modules[f"{OFFLOADING}.kv_store_local.vllm_worker"]
        staging = [adapter.StagingTensor(self.region, 0, row_bytes, row_bytes)]
        refs = [
            [vllm.base.CanonicalKVCacheRef(0, group.kv_cache_spec.page_size_bytes)]
            for group in (
                kv_cache_config.kv_cache_groups[c.group_id]
                for c in self.spec.config.groups
            )
        ]
        # The real lookup walks the CPU worker's torch storages; ours is one
        # bytearray, so it is swapped in while the worker attaches the writer.
        real = adapter.staging_from_worker, adapter.store_stream_device
        real_pinned = adapter.pinned_memory
        adapter.staging_from_worker = lambda worker, caches: staging
        if device is not None:
            devices = sys.modules[f"{OFFLOADING}.kv_store_local.capture_device"]
            kv = devices.BlockTensor(
                devices.host_address(self.kv), row_bytes, gpu_blocks
            )
            adapter.store_stream_device = lambda worker, caches: (device, [kv])
            adapter.pinned_memory = None  # a private pool: nothing to pin here
        try:
            self.worker._init_worker(
                vllm.base.CanonicalKVCaches(
                    [
                        vllm.base.CanonicalKVCacheTensor(
                            HostTensor(self.kv, row_bytes), row_bytes
                        )
                    ],
                    refs,
                )
            )
        finally:
            adapter.staging_from_worker, adapter.store_stream_device = real
            adapter.pinned_memory = real_pinned

    def request(
        self,
        n: int,
        req_id: str,
        blocks: int,
        hashes: list[bytes],
        fill: Callable[[Any], None],
    ) -> Any:
        """One prompt of ``blocks`` blocks, scheduled at once, with a state
        hand-off of every state group at every second block; ``fill(job)``
        plays the DMA of each store job; then every transfer completes and
        the scheduler hears of it. Returns the connector metadata."""
        vllm = self.vllm
        request = vllm.request(req_id, hashes, blocks * vllm.block)
        self.scheduler.on_new_request(request)
        self.scheduler.get_num_new_matched_tokens(request, 0)
        block_ids = tuple(
            [10000 * n + 100 * g + b + 1 for b in range(blocks)]
            for g in range(NUM_GROUPS)
        )
        handoffs = {
            req_id: [
                (g, 50000 + 1000 * n + 10 * g + b, b * vllm.block)
                for b in range(2, blocks + 1, 2)
                for g in STATE_GROUPS
            ]
        }
        meta = self.scheduler.build_connector_meta(
            step_output(request, block_ids, handoffs)
        )
        self.worker.prepare_store_kv(meta)
        self.worker.start_kv_transfers(
            vllm.common.OffloadingConnectorMetadata(load_jobs={}, store_jobs={})
        )
        for job in meta.store_jobs.values():
            fill(job)
        self.gpu.done, self.gpu.submitted = self.gpu.submitted, []
        self.worker.get_finished(set())
        outputs = vllm.ns.load("vllm.v1.outputs")
        self.scheduler.update_connector_output(
            outputs.KVConnectorOutput(
                kv_connector_worker_meta=self.worker.build_connector_worker_meta()
            )
        )
        return meta
