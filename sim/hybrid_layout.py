"""The 7-group hybrid vLLM layout, and builders for the inputs vLLM hands the
offloading connector, inside one harness engine namespace.

It stands in for the requirements' model (a hybrid attention/mamba model with
an EAGLE drafter) on the real offloading modules of a tree (pristine or
patched), loaded through the harness (real vLLM files, stubs for torch):

    g0 full attention (FullAttentionSpec)
    g1 scratch (CircularBufferSpec): not prefix-cacheable, never offloaded
    g2-g5 state groups (MambaSpec, "align" cache mode)
    g6 the EAGLE drafter (SlidingWindowSpec, window of two blocks)

The scope tests, the store-local hook tests and the main job's store stage
differ only in figures (block size, hash unit, number of blocks, model
name), so those are constructor arguments; each spec builder takes the
variations a test needs.
"""

from __future__ import annotations

from dataclasses import fields, replace
from types import SimpleNamespace

from harness import release

OFFLOADING = "vllm.distributed.kv_transfer.kv_connector.v1.offloading"
STATE_GROUPS = (2, 3, 4, 5)
NUM_GROUPS = 7


class HybridVllm:
    """The offloading modules of a harness engine namespace, plus builders."""

    def __init__(
        self,
        ns,
        *,
        block: int = 256,
        hash_unit: int = 64,
        num_blocks: int = 64,
        max_model_len: int | None = None,
        model: str = "test/model",
        engine_id: str = "engine-0",
    ) -> None:
        self.ns = ns
        self.block = block
        self.hash_unit = hash_unit
        self.num_blocks = num_blocks
        self.max_model_len = max_model_len or 16 * block
        self.model = model
        self.engine_id = engine_id
        self.kci = ns.load("vllm.v1.kv_cache_interface")
        self.torch = ns.load("torch")
        self.config = ns.load(f"{OFFLOADING}.config")
        self.scheduler = ns.load(f"{OFFLOADING}.scheduler")
        self.worker = ns.load(f"{OFFLOADING}.worker")
        self.common = ns.load(f"{OFFLOADING}.common")
        self.base = ns.load("vllm.v1.kv_offload.base")
        self.cpu = ns.load("vllm.v1.kv_offload.cpu.common")
        self.request_mod = ns.load("vllm.v1.request")
        self._register_spec_managers()

    def _register_spec_managers(self) -> None:
        # vLLM registers a manager per spec type at boot; the stubbed boot
        # does not. The scheduler reads two things from a manager class; both
        # follow vLLM's dense base policy (every block reachable), the same
        # on pristine and patched trees.
        module = self.ns.load("vllm.v1.kv_cache_spec_registry")
        registry = module.KVCacheSpecRegistry
        base = self.ns.load(
            "vllm.v1.core.single_type_kv_cache_manager"
        ).SingleTypeKVCacheManager
        kci = self.kci
        for spec_cls in (
            kci.FullAttentionSpec,
            kci.SlidingWindowSpec,
            kci.MambaSpec,
            kci.CircularBufferSpec,
        ):
            if spec_cls in module._REGISTRY_KVCACHESPEC_LIST:
                continue  # this namespace was set up by an earlier instance
            registry.register(
                spec_cls,
                type(
                    f"{spec_cls.__name__}Manager",
                    (base,),
                    {
                        "supports_fine_grained_hash_lookup": True,
                        "reachable_block_mask": classmethod(lambda cls, **kw: None),
                    },
                ),
            )

    # Specs -----------------------------------------------------------------

    def full(self, block: int | None = None):
        return self.kci.FullAttentionSpec(
            block_size=block or self.block,
            num_kv_heads=2,
            head_size=16,
            dtype=self.torch.bfloat16,
        )

    def mla(self, block: int | None = None):
        return self.kci.MLAAttentionSpec(
            block_size=block or self.block,
            num_kv_heads=1,
            head_size=32,
            dtype=self.torch.bfloat16,
        )

    def scratch(self):
        return self.kci.CircularBufferSpec(
            block_size=4, num_kv_heads=1, head_size=16, dtype=self.torch.bfloat16
        )

    def mamba(self, block: int | None = None, mode: str = "align", **kwargs):
        """A conv state (bf16) and a temporal state (f32) per layer."""
        values = dict(
            block_size=block or self.block,
            shapes=((2, 8), (4, 16)),
            dtypes=(self.torch.bfloat16, self.torch.float32),
            mamba_cache_mode=mode,
        )
        values.update(kwargs)
        return self.kci.MambaSpec(**values)

    def swa(self, block: int | None = None):
        return self.kci.SlidingWindowSpec(
            block_size=block or self.block,
            num_kv_heads=2,
            head_size=16,
            dtype=self.torch.bfloat16,
            sliding_window=2 * self.block,
        )

    def swa_mla(self, block: int | None = None):
        return self.kci.SlidingWindowMLASpec(
            block_size=block or self.block,
            num_kv_heads=1,
            head_size=32,
            dtype=self.torch.bfloat16,
            sliding_window=2 * self.block,
        )

    @property
    def marks_draft_layers(self) -> bool:
        """Whether this vLLM marks draft layers (KVCacheSpec.is_draft, 0.33.0
        on); a release before 0.33.0 did not, so a drafter group was only is_eagle_group."""
        return any(f.name == "is_draft" for f in fields(self.kci.KVCacheSpec))

    def draft(self, spec):
        """The spec of a draft layer: marked is_draft where vLLM marks one."""
        return replace(spec, is_draft=True) if self.marks_draft_layers else spec

    def wrap(self, *specs):
        return self.kci.UniformTypeKVCacheSpecs(
            block_size=specs[0].block_size,
            kv_cache_specs={f"w{i}": spec for i, spec in enumerate(specs)},
        )

    # Configs ---------------------------------------------------------------

    def kv_cache_config(self, *groups: tuple):
        """groups: (spec, is_eagle_group) or (spec, is_eagle_group, layers).

        By default group i holds one layer, `model.layers.{i}.mixer`.
        """
        group_specs = []
        for index, (spec, is_eagle, *layers) in enumerate(groups):
            names = layers[0] if layers else [f"model.layers.{index}.mixer"]
            group_specs.append(
                self.kci.KVCacheGroupSpec(
                    layer_names=list(names), kv_cache_spec=spec, is_eagle_group=is_eagle
                )
            )
        return self.kci.KVCacheConfig(
            num_blocks=self.num_blocks,
            kv_cache_tensors=[],
            kv_cache_groups=group_specs,
        )

    def hybrid_layout(self, *, scratch: bool = True, drafter: str | None = "default"):
        """g0 full, [g1 scratch], four mamba groups, [drafter].

        The default drafter is "eagle" where vLLM marks draft layers and None
        where it does not (before 0.33.0): there the tier refuses an is_eagle_group
        group unless GLM53_KV_OFFLOAD_DRAFTER=1, and without it the eligible
        groups are the same (g0, g2-g5), so the store and restore rigs keep
        their expectations on both releases.

        drafter: "eagle" (an is_eagle_group SWA group of draft layers), "swa"
        (a target SlidingWindowSpec group, neither EAGLE nor draft),
        "eagle-full" (an is_eagle_group full-attention group of draft layers)
        or None.
        """
        if drafter == "default":
            drafter = "eagle" if self.marks_draft_layers else None
        groups: list[tuple] = [(self.full(), False)]
        if scratch:
            groups.append((self.scratch(), False))
        groups += [(self.mamba(), False) for _ in STATE_GROUPS]
        # vLLM marks the specs of draft layers (KVCacheSpec.is_draft).
        if drafter == "eagle":
            groups.append((self.draft(self.swa()), True))
        elif drafter == "swa":
            groups.append((self.swa(), False))
        elif drafter == "eagle-full":
            groups.append((self.draft(self.full()), True))
        return self.kv_cache_config(*groups)

    def vllm_config(
        self,
        *,
        speculative: str | None = "eagle",
        world_size: int = 1,
        pipeline_parallel_size: int = 1,
        prefix_match_unit: int | None = -1,
        layout=None,
        lookahead: int = 0,
    ):
        """One rank, prefix caching on, by default EAGLE with one token.
        ``lookahead``: vLLM 0.34.0's hash lookahead tokens (0: legacy hashes)."""
        if prefix_match_unit == -1:
            prefix_match_unit = self.hash_unit
        if layout is not None and len(layout.kv_cache_groups) == 1:
            # One group hashes at its block size; vLLM refuses anything else.
            prefix_match_unit = None
        speculative_config = None
        if speculative is not None:
            speculative_config = SimpleNamespace(
                method=speculative,
                num_speculative_tokens=1,
                use_eagle=lambda: speculative in ("eagle", "eagle3", "mtp"),
                use_eagle_block_drop=lambda: False,
            )
        VllmConfig = self.ns.load("vllm.config").VllmConfig
        return VllmConfig(
            kv_transfer_config=SimpleNamespace(
                kv_connector_extra_config={}, engine_id=self.engine_id
            ),
            parallel_config=SimpleNamespace(
                decode_context_parallel_size=1,
                prefill_context_parallel_size=1,
                tensor_parallel_size=1,
                pipeline_parallel_size=pipeline_parallel_size,
                world_size=world_size,
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
                model=self.model,
                dtype=self.torch.bfloat16,
                max_model_len=self.max_model_len,
            ),
            cache_config=SimpleNamespace(
                block_size=self.block,
                prefix_match_unit=prefix_match_unit,
                enable_prefix_caching=True,
                cache_dtype="auto",
                kv_cache_layout=None,
                prefix_cache_retention_interval=None,
                prefix_caching_hash_algo="sha256",
            ),
            speculative_config=speculative_config,
            # The sim schedules a prompt whole: a prefill step holds at most one.
            scheduler_config=SimpleNamespace(max_num_batched_tokens=self.max_model_len),
            kv_events_config=None,
            # Each set only where the release has it: 0.33.0's use_v2_model_runner
            # (a property there, gone in 0.34.0), 0.34.0's hash lookahead.
            **{
                name: value
                for name, value in (
                    ("use_v2_model_runner", False),
                    ("num_hash_lookahead_tokens", lookahead),
                )
                if name
                in (
                    release.members(self.ns.tree, "vllm.config.vllm", "VllmConfig")
                    or ()
                )
            },
        )

    def offloading_config(self, vllm_config, kv_cache_config):
        return self.config.build_offloading_config(vllm_config, kv_cache_config)

    # Requests --------------------------------------------------------------

    def request(self, req_id: str, block_hashes: list[bytes], num_tokens: int):
        """A running prompt of num_tokens tokens, nothing computed yet."""
        attrs = dict(
            request_id=req_id,
            block_hashes=block_hashes,
            num_tokens=num_tokens,
            num_prompt_tokens=num_tokens,
            num_computed_tokens=0,
            status=self.request_mod.RequestStatus.RUNNING,
            kv_transfer_params=None,
            kv_hints=None,
            shared_prefix_boundary=None,
        )
        # What the release's own Request has (the stub refuses anything else):
        # vLLM 0.34.0 reads skip_reading_external_kv and resumable, 0.33.0
        # skip_reading_prefix_cache.
        real = release.members(self.ns.tree, "vllm.v1.request", "Request") or ()
        for flag in (
            "skip_reading_prefix_cache",
            "skip_reading_external_kv",
            "resumable",
        ):
            if flag in real:
                attrs[flag] = False
        return self.request_mod.Request(**attrs)


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
