"""The store-local writer on vLLM's real SharedOffloadRegion (real torch, no GPU).

The writer reads the staging rows through torch views of the region's shared
mmap. vLLM's CPU worker shuts down by clearing its own views and then calling
``SharedOffloadRegion.cleanup``, which closes the mmap; any view still alive
holds a buffer export, the close raises BufferError and vLLM logs "Keeping
... mapped" and leaves the region mapped. The writer's shutdown (the hook runs
before the worker's) must let go of every view it made.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import realsched
from chunk_calls import ChunkCalls

OFFLOADING = "vllm.distributed.kv_transfer.kv_connector.v1.offloading"
PAGE = 4096  # bytes of one layer's page, one block a chunk
ROWS = 4


def test_shutdown_releases_the_real_staging_region(knobs, tmp_path):
    import importlib

    from vllm.v1.kv_offload.base import CanonicalKVCacheRef
    from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion

    package = f"{OFFLOADING}.kv_store_local"
    vllm_worker = importlib.import_module(f"{package}.vllm_worker")
    layout = importlib.import_module(f"{package}.layout")
    worker_store = importlib.import_module(f"{package}.worker_store")
    kv_knobs = importlib.import_module(f"{OFFLOADING}.kv_offload_knobs")
    fmt = ChunkCalls(importlib.import_module(f"{OFFLOADING}.kv_store_format"))

    # Two workers' slots a row; this is rank 1 with two layer tensors.
    region = SharedOffloadRegion(
        f"kvtier-writer-test-{os.getpid()}",
        num_chunks=ROWS,
        rank=1,
        kv_bytes_per_chunk=4 * PAGE,
        cpu_page_size=2 * PAGE,
    )
    views = [region.create_next_worker_view(PAGE) for _ in range(2)]
    handler = SimpleNamespace(**{realsched.staging_attr(): list(views)})
    worker = SimpleNamespace(_store_handler=handler)
    caches = SimpleNamespace(
        tensors=[None, None],
        group_data_refs=[[CanonicalKVCacheRef(0, PAGE), CanonicalKVCacheRef(1, PAGE)]],
    )
    settings = worker_store.WorkerSettings(
        model="test/region",
        vllm_version="0.33.0",
        kv_dtype="bfloat16",
        hash_algorithm="sha256",
        num_speculative_tokens=0,
        tp_size=2,
        config_rank=1,
        blocks_per_chunk=1,
        groups=[
            layout.GroupLayout(
                0,
                0,
                "full",
                (layout.LayerLayout(-1, PAGE), layout.LayerLayout(-1, PAGE)),
            )
        ],
    )
    store = vllm_worker.VllmWorkerStore(
        kv_knobs.Knobs(True, str(tmp_path), 1, False, 2, "test", 16),
        settings,
        tp=lambda: (1, 2),
    )
    store.attach_worker(worker, caches, True)
    assert store.active, store.disabled_reason

    # The DMA: this rank's slot of row 2, layer by layer.
    views[0][2].fill_(7)
    views[1][2].fill_(9)
    key = bytes(range(32))
    entry = SimpleNamespace(
        src_spec=SimpleNamespace(group_sizes=[1], block_indices=[0]),
        dst_spec=SimpleNamespace(block_ids=[2]),
        kv_store_meta={
            "version": 1,
            "keys": [key + (0).to_bytes(4, "big")],
            "groups": [0],
            "tokens": [16],
            "candidates": [],
        },
    )
    store.remember(5, entry)
    store.capture(5)
    assert store.writer.wait_idle()
    path = store.writer.layout.chunk(key.hex(), 0)
    header = fmt.verify_chunk_file(path)
    with open(path, "rb") as f:
        assert f.read()[header.header_length :] == bytes([7]) * PAGE + bytes([9]) * PAGE

    # vLLM's order: the connector worker's shutdown (our hook first), then
    # the CPU worker's handler drops its views, then the region is cleaned.
    store.shutdown()
    getattr(handler, realsched.staging_attr()).clear()
    views.clear()
    region.cleanup()
    assert region.mmap_obj is None, "the region stayed mapped: a view is still held"
