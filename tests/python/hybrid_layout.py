"""The 7-group hybrid vLLM layout that the harness-driven store tests boot.

It stands in for the requirements' model (a hybrid attention/mamba model with
an EAGLE drafter) on the patched offloading modules, loaded through the test
harness (real vLLM files, stubs for torch and the rest):

    g0 full attention (FullAttentionSpec)
    g1 scratch (CircularBufferSpec): not prefix-cacheable, never offloaded
    g2-g5 state groups (MambaSpec, "align" cache mode)
    g6 the EAGLE drafter (SlidingWindowSpec, window of two blocks)

HybridVllm also builds what a vLLM boot would hand the connector: the
VllmConfig, Requests and SchedulerOutputs. Callers differ only in the figures
(block size, number of blocks, model name, ...), so those are parameters.
"""

from __future__ import annotations

from types import SimpleNamespace

OFFLOADING = "vllm.distributed.kv_transfer.kv_connector.v1.offloading"
STATE_GROUPS = (2, 3, 4, 5)
NUM_GROUPS = 7


class HybridVllm:
    """The patched modules of a harness engine namespace, plus layout builders."""

    def __init__(self, ns) -> None:
        self.ns = ns
        self.kci = ns.load("vllm.v1.kv_cache_interface")
        self.torch = ns.load("torch")
        self.config = ns.load(f"{OFFLOADING}.config")
        self.scheduler = ns.load(f"{OFFLOADING}.scheduler")
        self.worker = ns.load(f"{OFFLOADING}.worker")
        self.common = ns.load(f"{OFFLOADING}.common")
        self.base = ns.load("vllm.v1.kv_offload.base")
        self.cpu = ns.load("vllm.v1.kv_offload.cpu.common")
        self.request_mod = ns.load("vllm.v1.request")
        self.register_spec_managers()

    def register_spec_managers(self) -> None:
        # vLLM registers a manager per spec type at boot; the stubbed boot
        # does not, so register the plain single-type manager for ours.
        registry = self.ns.load("vllm.v1.kv_cache_spec_registry").KVCacheSpecRegistry
        manager = self.ns.load("vllm.v1.core.single_type_kv_cache_manager")
        for spec_cls in (
            self.kci.FullAttentionSpec,
            self.kci.SlidingWindowSpec,
            self.kci.MambaSpec,
            self.kci.CircularBufferSpec,
        ):
            registry.register(
                spec_cls,
                type(
                    f"{spec_cls.__name__}Manager",
                    (manager.SingleTypeKVCacheManager,),
                    {
                        "supports_fine_grained_hash_lookup": True,
                        # Every block is reachable: no window, no retention.
                        "reachable_block_mask": classmethod(lambda cls, **kw: None),
                    },
                ),
            )

    def kv_cache_config(self, block: int, num_blocks: int):
        """g0 full, g1 scratch, g2-g5 mamba ("align"), g6 EAGLE drafter."""
        kci, bf16 = self.kci, self.torch.bfloat16
        specs = [
            (
                kci.FullAttentionSpec(
                    block_size=block, num_kv_heads=2, head_size=16, dtype=bf16
                ),
                False,
            ),
            (
                kci.CircularBufferSpec(
                    block_size=4, num_kv_heads=1, head_size=16, dtype=bf16
                ),
                False,
            ),
        ]
        specs += [
            (
                kci.MambaSpec(
                    block_size=block,
                    shapes=((2, 8), (4, 16)),
                    dtypes=(bf16, self.torch.float32),
                    mamba_cache_mode="align",
                ),
                False,
            )
            for _ in STATE_GROUPS
        ]
        specs.append(
            (
                kci.SlidingWindowSpec(
                    block_size=block,
                    num_kv_heads=2,
                    head_size=16,
                    dtype=bf16,
                    sliding_window=2 * block,
                ),
                True,
            )
        )
        groups = [
            kci.KVCacheGroupSpec(
                layer_names=[f"g{i}.l0"], kv_cache_spec=spec, is_eagle_group=eagle
            )
            for i, (spec, eagle) in enumerate(specs)
        ]
        return kci.KVCacheConfig(
            num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups
        )

    def vllm_config(
        self,
        block: int,
        hash_unit: int,
        max_model_len: int,
        model: str,
        engine_id: str,
    ):
        """One rank, prefix caching on, EAGLE with one speculative token."""
        VllmConfig = self.ns.load("vllm.config").VllmConfig
        return VllmConfig(
            kv_transfer_config=SimpleNamespace(
                kv_connector_extra_config={}, engine_id=engine_id
            ),
            parallel_config=SimpleNamespace(
                decode_context_parallel_size=1,
                prefill_context_parallel_size=1,
                tensor_parallel_size=1,
                pipeline_parallel_size=1,
                world_size=1,
                distributed_executor_backend="mp",
                nnodes_within_dp=1,
                rank=0,
                data_parallel_index=0,
                data_parallel_size=1,
                data_parallel_rank_local=None,
                cp_kv_cache_interleave_size=1,
            ),
            model_config=SimpleNamespace(
                use_mla=False,
                get_total_num_kv_heads=lambda: 2,
                model=model,
                dtype=self.torch.bfloat16,
                max_model_len=max_model_len,
            ),
            cache_config=SimpleNamespace(
                block_size=block,
                prefix_match_unit=hash_unit,
                enable_prefix_caching=True,
                cache_dtype="auto",
                kv_cache_layout=None,
                prefix_cache_retention_interval=None,
                prefix_caching_hash_algo="sha256",
            ),
            speculative_config=SimpleNamespace(
                method="eagle",
                num_speculative_tokens=1,
                use_eagle=lambda: True,
                use_eagle_block_drop=lambda: False,
            ),
            use_v2_model_runner=False,
            kv_events_config=None,
        )

    def request(self, req_id: str, block_hashes: list[bytes], num_tokens: int):
        """A running prompt of num_tokens tokens, nothing computed yet."""
        return self.request_mod.Request(
            request_id=req_id,
            block_hashes=block_hashes,
            num_tokens=num_tokens,
            num_prompt_tokens=num_tokens,
            num_computed_tokens=0,
            status=self.request_mod.RequestStatus.RUNNING,
            kv_transfer_params=None,
            kv_hints=None,
            shared_prefix_boundary=None,
            skip_reading_prefix_cache=False,
        )


def scheduler_output(request, block_ids, handoffs=None):
    """A step scheduling `request` afresh; handoffs are state-group offloads."""
    block_state = None
    if handoffs is not None:
        block_state = SimpleNamespace(boundary_state_offloads=handoffs)
    return SimpleNamespace(
        scheduled_new_reqs=[
            SimpleNamespace(req_id=request.request_id, block_ids=block_ids)
        ],
        scheduled_cached_reqs=SimpleNamespace(
            req_ids=[], new_block_ids=[], resumed_req_ids=set()
        ),
        kv_cache_block_copies=None,
        num_scheduled_tokens={request.request_id: request.num_tokens},
        finished_req_ids=set(),
        preempted_req_ids=set(),
        kv_connector_block_state=block_state,
    )
