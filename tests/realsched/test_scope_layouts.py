"""kv-offload-scope on layouts vLLM's own offloading tests exercise, on the real worker.

A packed cache (two attention layers interleaved in one tensor row) beside a scratch group,
as upstream's test_register_packed_kv_caches_skips_scratch_group builds it: the real
OffloadingConnectorWorker registers real CPU tensors from vLLM's own allocate_kv_cache.
With the disk tier on or off the worker lays out upstream's groups (the scratch group never);
with it on, the disk writer refuses the packed group when it binds its layers, so nothing
is written and vLLM's CPU offloading runs on (docs/overlays/kv-offload-scope.md).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import realsched

BLOCK = 16
NUM_BLOCKS = 10


def packed_layout():
    import torch
    from vllm.v1.kv_cache_interface import (
        CircularBufferSpec,
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        KVCacheTensor,
    )

    attn = FullAttentionSpec(
        block_size=BLOCK, num_kv_heads=4, head_size=64, dtype=torch.float16
    )
    page = attn.page_size_bytes
    layers = ["model.layers.0.self_attn", "model.layers.1.self_attn"]
    config = KVCacheConfig(
        num_blocks=NUM_BLOCKS,
        kv_cache_tensors=[
            KVCacheTensor(
                size=2 * page * NUM_BLOCKS,
                layers=layers,
                layer_stride=page,
                block_stride=2 * page,
            )
        ],
        kv_cache_groups=[
            KVCacheGroupSpec(layers, attn),
            KVCacheGroupSpec(
                ["model.layers.2.scratch"],
                CircularBufferSpec(
                    block_size=4, num_kv_heads=1, head_size=1, dtype=torch.float16
                ),
            ),
        ],
    )
    return config, page


def registered_layout(kv_cache_config, refused: bool = False):
    """The real worker's register_kv_caches; the canonical caches it hands on. With
    ``refused`` the disk writer must refuse the boot after vLLM's worker got them (on
    this CPU host there is no CUDA source to copy from, whatever the layout)."""
    import torch
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.worker import (
        OffloadingConnectorWorker,
    )
    from vllm.v1.kv_cache_layout import KVCacheLayout
    from vllm.v1.worker.utils import allocate_kv_cache

    handed = []
    # The offloading config the scheduler side builds for this layout: group 0 only
    # (the scratch group is not prefix-cacheable).
    # (the scratch group is not prefix-cacheable). With the tier on the worker also
    # builds the disk writer from it, so it carries what the writer reads.
    group = kv_cache_config.kv_cache_groups[0]
    spec = SimpleNamespace(
        replicated_layout=False,
        blocks_per_chunk=1,
        config=SimpleNamespace(
            groups=(
                SimpleNamespace(
                    group_id=0,
                    layer_names=tuple(group.layer_names),
                    sliding_window_size_in_chunks=None,
                ),
            ),
            canonical_layout=False,
            parallel=SimpleNamespace(
                rank=0, tp_size=1, pp_size=1, pcp_size=1, dcp_size=1
            ),
            model=SimpleNamespace(name="test/packed", dtype="float16"),
        ),
        get_worker=lambda caches: (
            handed.append(caches) or realsched.FakeTransfers(caches, NUM_BLOCKS)
        ),
    )
    parallel = SimpleNamespace(
        tensor_parallel_size=1,
        decode_context_parallel_size=1,
        prefill_context_parallel_size=1,
        cp_kv_cache_interleave_size=1,
        world_size=1,
        rank=0,
        pipeline_parallel_size=1,
    )
    vllm_config = SimpleNamespace(
        parallel_config=parallel,
        model_config=SimpleNamespace(get_total_num_kv_heads=lambda: 4),
        kv_transfer_config=None,
        speculative_config=None,
        cache_config=SimpleNamespace(prefix_caching_hash_algo="sha256"),
    )
    worker = OffloadingConnectorWorker(spec, vllm_config, kv_cache_config)
    worker.worker = SimpleNamespace()
    caches = allocate_kv_cache(
        kv_cache_config,
        torch.device("cpu"),
        KVCacheLayout.LBNHC,
        [BLOCK] * len(kv_cache_config.kv_cache_groups),
    )
    if refused:
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.kv_store_local.errors import (  # noqa: E501
            StoreRefused,
        )

        with pytest.raises(StoreRefused, match="GLM53_KV_OFFLOAD=1 is refused"):
            worker.register_kv_caches(caches)
    else:
        worker.register_kv_caches(caches)
    (canonical,) = handed
    return [
        [(ref.tensor_idx, ref.page_size_bytes) for ref in refs]
        for refs in canonical.group_data_refs
    ], [tuple(t.tensor.shape) for t in canonical.tensors]


@pytest.mark.parametrize("tier", [None, "0", "1"])
def test_packed_cache_beside_a_scratch_group_registers_upstreams_layout(
    knobs, tier, tmp_path
):
    if tier == "1":
        knobs(**{"": "1", "DIR": str(tmp_path), "CPU_GB": "1"})
    else:
        knobs(**({"": tier} if tier is not None else {}))
    kv_cache_config, page = packed_layout()
    refs, shapes = registered_layout(kv_cache_config, refused=tier == "1")
    # Upstream's own expectation: one tensor, one ref for the packed group, no scratch.
    assert shapes == [(NUM_BLOCKS, 2 * page)]
    assert refs == [[(0, 2 * page)]]


def test_the_disk_writer_refuses_the_packed_group(knobs):
    """Two layers, one transfer ref: the writer cannot name each layer's bytes in a chunk
    header, so it refuses (WriterDisabled, the boot fails) before writing anything."""
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.kv_store_local import (
        errors,
        layout,
    )

    kv_cache_config, page = packed_layout()
    refs, _ = registered_layout(kv_cache_config)
    group = layout.GroupLayout(
        0,
        0,
        "full",
        tuple(layout.LayerLayout(-1, page, (), index) for index in (0, 1)),
    )
    with pytest.raises(errors.WriterDisabled, match="packed"):
        layout.bind_layers([group], refs)
