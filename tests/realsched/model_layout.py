"""Prints, as one JSON line, the KV-cache layout vLLM builds for a model of engine/models and
what the offloading connector on the path makes of it, on CPU.

    python tests/realsched/model_layout.py glm5next [--block-size 64] [--prompt 700]
        [--store TOKENS | --restore TOKENS [--corrupt]]

The model is vLLM's own class built on the meta device (no weights, no kernels run): every
attention, indexer, tail and linear-attention layer reports the KV spec it would on the GPU,
vLLM's planner groups them, and the real Scheduler boots with the OffloadingConnector. Then
one prompt runs through the played model (realsched.Engine) and the store jobs are counted
per group. A boot that fails prints {"error": ...}: the pristine engine's answer for a layout
it does not support. The tests run it with the patched tree on PYTHONPATH and without.

Three things differ from a GPU boot, all below the layout: the CPU platform keeps prefix
caching and chunked prefill on for MLA (it turns them off: no CPU kernels), a sparse MLA
layer gets FlashMLA's sparse backend class (the one the H200 stage selects), and the
block size comes from the backends' kernel block sizes and the hybrid alignment, as the GPU
executor computes it after loading the model. The worker side binds the caches as the GPU
model runner does (worker_side: vLLM's init_attn_backend and init_kv_cache), so a backend
that needs blocks smaller than the manager's gets kernel-block views (glm5wide's indexer
keys) and engine/probe.py reads them through the runner's attn_groups. Other attention
layers keep the CPU platform's backend (qwen3next CPU_ATTN, dsv2lite AMX_MLA, not the
GPU's), so their kernel block sizes are those backends'.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import socket
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(
    1, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../engine")
)

import realsched  # noqa: E402

SPARSE_MLA = "vllm.v1.attention.backends.mla.flashmla_sparse.FlashMLASparseBackend"
RESTORE_TIER = {
    "type": "LocalStoreTier",
    "module_path": "vllm.distributed.kv_transfer.kv_connector.v1.offloading"
    ".kv_restore_tier",
}
# What engine/suite_models.py gives each model's stages beyond the common arguments.
ADDITIONAL = {
    "glm5next": {"kda_prefill_backend": "triton"},
    "glm5wide": {"kda_prefill_backend": "triton"},
}


def cpu_platform_for_layouts() -> None:
    from vllm.platforms.cpu import CpuPlatform

    realsched.use_cpu_platform()
    check = CpuPlatform.check_and_update_config.__func__
    backend = CpuPlatform.get_attn_backend_cls.__func__

    def check_and_update_config(cls, vllm_config) -> None:
        prefix = vllm_config.cache_config.enable_prefix_caching
        chunked = vllm_config.scheduler_config.enable_chunked_prefill
        check(cls, vllm_config)
        vllm_config.cache_config.enable_prefix_caching = prefix
        vllm_config.scheduler_config.enable_chunked_prefill = chunked

    def get_attn_backend_cls(
        cls, selected_backend=None, attn_selector_config=None, num_heads=None
    ) -> str:
        if attn_selector_config.use_sparse:
            return SPARSE_MLA
        return backend(cls, selected_backend, attn_selector_config, num_heads=num_heads)

    CpuPlatform.check_and_update_config = classmethod(check_and_update_config)
    CpuPlatform.get_attn_backend_cls = classmethod(get_attn_backend_cls)
    # 0.34.0's sparse MLA backend asks the accelerator for its index when it is built (for
    # the SM count); on a CPU-only host torch answers by initialising CUDA. The CPU
    # platform's count ignores the index.
    import torch

    if not torch.cuda.is_available():
        torch.accelerator.current_device_index = lambda: 0


def mtp_model(model: str) -> str:
    """The model folder with GLM-5.3's MTP drafter: vLLM's speculative config derives the
    drafter (`Glm5NextMTPModel`) only from the checkpoint's outer config (model_type
    `glm5_next`, the text config inside), so the suite's text config is wrapped."""
    text = json.loads((realsched.MODELS / model / "config.json").read_text())
    folder = tempfile.mkdtemp(prefix=f"{model}-mtp.")
    outer = {"architectures": text["architectures"], "model_type": "glm5_next"}
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({**outer, "text_config": text}, f)
    return folder


def engine_config(
    model: str,
    block_size: int | None,
    cpu_bytes: int,
    restore: bool = False,
    mtp: bool = False,
    max_model_len: int = 4096,
):
    from vllm.engine.arg_utils import EngineArgs

    connector = realsched.connector_config(cpu_bytes)
    if restore:  # the tier docs/DEPLOY.md's restore recipe adds
        connector["kv_connector_extra_config"]["secondary_tiers"] = [RESTORE_TIER]
    spec = {"method": "mtp", "num_speculative_tokens": 1} if mtp else None
    return EngineArgs(
        model=mtp_model(model) if mtp else str(realsched.MODELS / model),
        speculative_config=spec,
        skip_tokenizer_init=True,
        load_format="dummy",
        enforce_eager=True,
        dtype="bfloat16",
        max_model_len=max_model_len,
        enable_prefix_caching=True,
        block_size=block_size,
        max_num_seqs=8,
        max_num_batched_tokens=256,
        kv_transfer_config=connector,
        additional_config=ADDITIONAL.get(model, {}),
    ).create_engine_config()


def layer_specs(vc) -> tuple[dict, list[str]]:
    """Every KV-holding layer's spec, as the GPU worker's get_kv_cache_spec collects them."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.distributed.kv_transfer.kv_connector.utils import (
        get_current_attn_backends,
    )
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.platforms import current_platform
    from vllm.platforms.interface import Platform
    from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts
    from vllm.v1.kv_cache_interface import AttentionSpec
    from vllm.v1.worker.utils import customize_attention_spec
    from vllm.v1.worker.workspace import init_workspace_manager

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with set_current_vllm_config(vc):
        init_distributed_environment(
            world_size=1,
            rank=0,
            distributed_init_method=f"tcp://127.0.0.1:{port}",
            local_rank=0,
            backend="gloo",
        )
        initialize_model_parallel(1, 1)
        init_workspace_manager(torch.device("cpu"))
        with torch.device("meta"):
            initialize_model(vllm_config=vc)
            if vc.speculative_config is not None:  # as the proposer's load_model
                from vllm.compilation.backends import set_model_tag
                from vllm.config.vllm import get_layers_from_vllm_config

                target = set(get_layers_from_vllm_config(vc, AttentionLayerBase))
                with set_model_tag("eagle_head"):
                    initialize_model(
                        vllm_config=vc,
                        model_config=vc.speculative_config.draft_model_config,
                    )
                drafted = get_layers_from_vllm_config(vc, AttentionLayerBase)
                for name in set(drafted) - target:
                    drafted[name].is_draft_layer = True
        # As the GPU executor does after load_model: the backends' kernel block sizes,
        # then the hybrid alignment of attention and state pages (Platform's own, not
        # the CPU platform's: a CUDA platform does not override it).
        Platform.update_block_size_for_backend.__func__(type(current_platform), vc)
    # The GPU model runner's get_kv_cache_spec: each layer's spec as its backend
    # customizes it; and the layouts the backends support (get_supported_kv_cache_layouts).
    specs = {}
    for name, layer in vc.compilation_config.static_forward_context.items():
        if isinstance(layer, AttentionLayerBase):
            spec = layer.get_kv_cache_spec(vc)
            if isinstance(spec, AttentionSpec):
                spec = customize_attention_spec(layer.get_attn_backend(), spec)
            if spec is not None and getattr(layer, "is_draft_layer", False):
                spec = dataclasses.replace(spec, is_draft=True)
            if spec is not None:
                specs[name] = spec
    layouts = get_supported_kv_cache_layouts(get_current_attn_backends(vc))
    return specs, [layout.name for layout in layouts]


def worker_side(booted, seed: int, loads: bool = False):
    """The caches as the GPU model runner makes them (random bytes from ``seed``): vLLM's
    own init_attn_backend groups each cache group's layers by backend and picks every
    group's kernel block size from the backends' get_supported_kernel_block_sizes, then
    init_kv_cache allocates the packed caches and binds each layer to its view, in kernel
    blocks where its backend needs smaller blocks than the manager's (GLM-5.3's indexer
    keys at 4,608-token blocks: 512-token kernel blocks). The real worker-role
    OffloadingConnector registers the manager-block views, as the runner hands them over
    (the store-local hooks attach the writer, the restore hooks the restore), the DMA
    played (realsched.FakeTransfers). Returns (connector worker, transfers, runner): the
    runner is what engine/probe.py reads a worker's caches through, with the runner's
    attn_groups and kernel_block_sizes."""
    from types import SimpleNamespace

    import torch
    from vllm.config import set_current_vllm_config
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import (
        OffloadingConnector,
    )
    from vllm.v1.worker.gpu.attn_utils import init_attn_backend, init_kv_cache

    vc, config = booted.vllm_config, booted.worker_kv_cache_config
    ctx = vc.compilation_config.static_forward_context
    cpu = torch.device("cpu")
    with set_current_vllm_config(vc):
        # The GPU runner's initialize_kv_cache: its metadata builders are built too (on
        # CPU here; none runs), since AttentionGroup.create_metadata_builders is where a
        # group whose backend needs smaller blocks gets its kernel_block_size.
        attn_groups, _, kernel_block_sizes = init_attn_backend(config, vc, cpu)
        caches = init_kv_cache(
            ctx,
            config,
            cpu,
            kernel_block_sizes,
            vc,
            attn_groups=(g for groups in attn_groups for g in groups),
        )
    generator = torch.Generator().manual_seed(seed)
    for t in {id(t.untyped_storage()): t for t in caches.values()}.values():
        raw = torch.empty(0, dtype=torch.uint8).set_(
            t.untyped_storage(), 0, (t.untyped_storage().nbytes(),), (1,)
        )
        raw.copy_(
            torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=generator)
        )
    made = []
    with set_current_vllm_config(vc):  # as the GPU worker runs: the state views
        connector = OffloadingConnector(vc, KVConnectorRole.WORKER, config)
        worker = connector.connector_worker

        def transfers(canonical):
            # As many CPU rows as the tier has chunks (one block a chunk).
            extra = vc.kv_transfer_config.kv_connector_extra_config
            page = sum(t.page_size_bytes for t in canonical.tensors)
            rows = extra["cpu_bytes_to_use"] // page
            made.append(realsched.FakeTransfers(canonical, rows=rows, loads=loads))
            return made[-1]

        worker.spec.get_worker = transfers
        connector.register_kv_caches(caches)
    runner = SimpleNamespace(
        vllm_config=vc,
        model_runner=SimpleNamespace(
            compilation_config=vc.compilation_config,
            kv_cache_config=config,
            attn_groups=attn_groups,
            kernel_block_sizes=kernel_block_sizes,
        ),
    )
    return worker, made[0], runner


def kernel_binding(runner) -> dict:
    """How worker_side bound the caches: each cache group's manager and kernel block size
    and its layers' backends, and every attention group bound in kernel blocks smaller
    than the manager's (its kernel block size and stride, and how many kernel pages its
    first layer's bound view spans against the manager's blocks)."""
    mr = runner.model_runner
    config = mr.kv_cache_config
    ctx = mr.compilation_config.static_forward_context
    out: dict = {
        "manager_block_sizes": [
            g.kv_cache_spec.block_size for g in config.kv_cache_groups
        ],
        "kernel_block_sizes": list(mr.kernel_block_sizes),
        "backends": [
            sorted({g.backend.get_name() for g in gs}) for gs in mr.attn_groups
        ],
        "split": [],
    }
    for groups in mr.attn_groups:
        for group in groups:
            if group.kernel_block_size is None:
                continue
            out["split"].append(
                {
                    "group": group.kv_cache_group_id,
                    "backend": group.backend.get_name(),
                    "layers": list(group.layer_names),
                    "kernel_block_size": group.kernel_block_size,
                    "kernel_block_stride": group.kernel_block_stride,
                    "bound_pages": ctx[group.layer_names[0]].kv_cache.shape[0],
                    "num_blocks": config.num_blocks,
                }
            )
    return out


def probe_mapping(probe):
    """(patch, names): while the patch is on, ``names`` collects every layer whose bound
    view engine/probe.py mapped back to manager blocks (the kernel-block path of
    _layer_page and _logical_block), so a test can tell that path ran."""
    from unittest import mock

    names: set[str] = set()
    real = probe._manager_blocks

    def manager_blocks(worker, name, kv, num_blocks):
        out = real(worker, name, kv, num_blocks)
        if out is not kv:
            names.add(name)
        return out

    return mock.patch.object(probe, "_manager_blocks", manager_blocks), names


def serve(
    booted, worker, req_id: str, prompt: list[int], transfers=None
) -> tuple[list, int, list | None]:
    """One request of one output token after the prompt through the real scheduler and
    the worker side until nothing is left to do. Returns its block ids per group (each
    position's last block, null only if it never had one), the prompt tokens the engine
    computed (what no load provided) and, with ``transfers``, its block ids at the step
    its first load was submitted."""
    s = booted.scheduler
    realsched.Engine(booted).add(req_id, prompt, 2)
    finished: set[str] = set()
    block_ids, scheduled, at_load = None, 0, None
    for _ in range(2000):
        if not s.has_requests():
            break
        out = realsched.step_worker(booted, worker, finished)
        scheduled += out.num_scheduled_tokens.get(req_id, 0)
        if req_id in s.requests:
            now = s.kv_cache_manager.get_block_ids(req_id)
            if block_ids is None:
                block_ids = [[] for _ in now]
            for kept, ids in zip(block_ids, now):
                # A state group's table drops a boundary's block (null, 0) once
                # the running state moved on: keep the block that held it.
                kept.extend([0] * (len(ids) - len(kept)))
                for i, block in enumerate(ids):
                    if block:
                        kept[i] = block
            if at_load is None and transfers is not None and transfers.loaded:
                at_load = [list(ids) for ids in now]
        if not out.num_scheduled_tokens:
            time.sleep(0.001)  # a promotion reads on its own thread
    assert req_id in finished, f"{req_id} did not finish"
    # The last step decoded the one output token.
    return block_ids, scheduled - 1, at_load


def store_and_compare(booted, prompt: int) -> dict:
    """The worker side at knob 1 (worker_side), one prompt served; then the GPU suite's
    own check (engine/probe.py) of every stored chunk against its block."""
    from unittest import mock

    import probe

    worker, _, runner = worker_side(booted, seed=31)
    store = worker._kv_store
    mapping, mapped = probe_mapping(probe)
    with mock.patch.object(probe, "_store", lambda _: (worker, store)), mapping:
        out = {"writer": probe.install_recorder(runner)}
        serve(booted, worker, "w", [(i * 11) % 900 + 3 for i in range(prompt)])
        out["compare"] = probe.inspect_worker(runner)
    out["binding"] = kernel_binding(runner)
    out["mapped"] = sorted(mapped)
    worker.shutdown()
    return out


def restore_and_compare(boot, prompt: int, corrupt: bool) -> dict:
    """Restore after a restart on the real layout: engine 1 serves the prompt and stores
    it, engine 2 (new caches, other random bytes) serves it again and restores what the
    store holds. The GPU suite's verdict (engine/probe.py block_digests): every block
    engine 2 loaded holds the KV bytes engine 1 had at that position, per group.
    ``corrupt``: one byte of the deepest boundary's first state chunk is flipped between
    the two; the promotion must refuse it and the request recompute everything."""
    import probe
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading import (
        kv_store_format as fmt,
    )

    tokens = [(i * 11) % 900 + 3 for i in range(prompt)]
    mapping, mapped = probe_mapping(probe)
    first = boot()
    worker, _, runner = worker_side(first, seed=31)
    ids_a, computed_a, _ = serve(first, worker, "a", tokens)
    with mapping:
        cold = probe.block_digests(runner, ids_a, prompt)
    layout = worker._kv_store.writer.layout
    worker.shutdown()
    realsched.shut_down_booted()

    manifests = []
    for name in os.listdir(layout.manifest_dir):
        try:
            fmt.parse_manifest_file_name(name)
        except fmt.FormatError:
            continue
        path = os.path.join(layout.manifest_dir, name)
        data = fmt.read_regular(path, fmt.MAX_MANIFEST_BYTES)
        manifests.append(fmt.decode_manifest(data))
    out: dict = {
        "computed_a": computed_a,
        # What engine 1 published: each boundary, its state groups.
        "manifests": sorted(
            (m.boundary, [g.group for g in m.groups if g.kind == fmt.GROUP_KIND_STATE])
            for m in manifests
        ),
    }
    if corrupt:
        deepest = max(manifests, key=lambda m: m.boundary)
        state = next(g for g in deepest.groups if g.kind == fmt.GROUP_KIND_STATE)
        group = state.group
        path = layout.chunk(state.entries[0].key, group)
        with open(path, "r+b") as f:
            f.seek(-1, os.SEEK_END)
            last = f.read(1)
            f.seek(-1, os.SEEK_END)
            f.write(bytes([last[0] ^ 0xFF]))
        out["corrupted"] = {"group": group, "path": path}

    second = boot()
    worker, transfers, runner = worker_side(second, seed=32, loads=True)
    _, computed_b, ids_b = serve(second, worker, "b", tokens, transfers)
    with mapping:
        restored = probe.block_digests(runner, ids_b, prompt) if ids_b else []
    offload = second.offload.config
    slot_group = [g.group_idx for g in offload.kv_group_configs]
    loaded: dict[int, list[int]] = {}  # group -> positions of the request it loaded
    for slot, block in transfers.loaded:
        group = slot_group[slot]
        loaded.setdefault(group, []).append(ids_b[group].index(block))
    equal, differ = 0, []
    for group, positions in loaded.items():
        for i in positions:
            if restored[group][i] == cold[group][i]:
                equal += 1
            else:
                differ.append((group, i))
    stats = worker._kv_restore.stats
    worker.shutdown()
    out.update(
        {
            "computed_b": computed_b,
            "loaded": {str(g): sorted(p) for g, p in sorted(loaded.items())},
            "equal": equal,
            "differ": differ,
            "keys_restored": stats.keys_restored,
            "failures": {k: v for k, v in stats.failures.items() if v},
            "root": layout.root,
            "binding": kernel_binding(runner),
            "mapped": sorted(mapped),
        }
    )
    return out


def describe(spec) -> dict:
    out = {"type": type(spec).__name__, "block_size": spec.block_size}
    inner = getattr(spec, "kv_cache_specs", None)  # UniformTypeKVCacheSpecs
    if inner:
        kinds = {}
        for s in inner.values():
            d = describe(s)
            kinds[json.dumps(d, sort_keys=True)] = d
        out["layers"] = list(kinds.values())
    else:
        out["page_size_bytes"] = spec.page_size_bytes
        for field in ("tokens_per_state", "cache_role", "shapes", "head_size"):
            value = getattr(spec, field, None)
            if value is not None:
                out[field] = getattr(value, "value", value)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--block-size", type=int, help="default: as the backends choose")
    ap.add_argument("--prompt", type=int, default=700)
    ap.add_argument("--cpu-bytes", type=int, default=256 << 20)
    ap.add_argument(
        "--store",
        type=int,
        metavar="TOKENS",
        help="with the tier on: store a prompt of TOKENS and compare chunks with blocks",
    )
    ap.add_argument(
        "--restore",
        type=int,
        metavar="TOKENS",
        help="with the tier and restore on: store a prompt of TOKENS, restart, restore it",
    )
    ap.add_argument(
        "--corrupt",
        action="store_true",
        help="with --restore: flip a byte of a state chunk before the restart",
    )
    ap.add_argument(
        "--mtp", action="store_true", help="glm5next with its MTP drafter (one token)"
    )
    ap.add_argument("--num-blocks", type=int, default=400)
    ap.add_argument(
        "--max-model-len",
        type=int,
        default=4096,
        help="longer for glm5wide's 4,608-token blocks to hold a full block",
    )
    args = ap.parse_args()
    cpu_platform_for_layouts()
    vc = engine_config(
        args.model,
        args.block_size,
        args.cpu_bytes,
        bool(args.restore),
        args.mtp,
        args.max_model_len,
    )
    from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs

    specs, layouts = layer_specs(vc)
    out: dict = {
        "block_size": vc.cache_config.block_size,
        "layouts": layouts,
        "layers": {n: type(s).__name__ for n, s in specs.items()},
    }
    try:
        register_all_kvcache_specs(vc)  # as EngineCore does first
        booted = realsched.boot_specs(vc, specs, args.num_blocks, layouts=layouts)
        out["layout"] = vc.cache_config.kv_cache_layout
        # Tokens after each block its hash covers (0.34.0 with an EAGLE/MTP drafter and a
        # connector that supports it): the drafter's block is then stored whole.
        out["lookahead"] = vc.num_hash_lookahead_tokens
    except Exception as e:  # the answer for this layout: say what stopped the boot
        out["error"] = f"{type(e).__name__}: {e}"
        print(json.dumps(out))
        return 0
    try:
        groups = booted.kv_cache_config.kv_cache_groups
        out["groups"] = [
            {"layers": list(g.layer_names), **describe(g.kv_cache_spec)} for g in groups
        ]
        offload = booted.offload.config
        out["offloaded_groups"] = [g.group_idx for g in offload.kv_group_configs]
        if not args.restore:  # the played workers report no restore: it would wait
            engine = realsched.Engine(booted)
            engine.add("r", [(i * 7) % 900 + 3 for i in range(args.prompt)], 2)
            engine.run()
            keys: dict[int, int] = {}
            for job in engine.all_jobs.values():
                for slot, n in enumerate(job.src_spec.group_sizes):
                    group = offload.kv_group_configs[slot].group_idx
                    keys[group] = keys.get(group, 0) + n
            out["store_keys_by_group"] = {str(g): n for g, n in sorted(keys.items())}
            out["finished"] = sorted(engine.finished)
        if args.store:
            out["store"] = store_and_compare(booted, args.store)
    finally:
        realsched.shut_down_booted()
    if args.restore:
        try:
            out["restore"] = restore_and_compare(
                lambda: realsched.boot_specs(vc, specs, args.num_blocks, layouts),
                args.restore,
                args.corrupt,
            )
        finally:
            realsched.shut_down_booted()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
