# SPDX-License-Identifier: Apache-2.0
"""Worker-side adapter: the only module that reads vLLM or torch objects.

The hooks in ``OffloadingConnectorWorker`` build a ``VllmWorkerStore`` (in
``__init__``) and attach it to the CPU offloading worker (in
``_init_worker``); what it hands on to ``WorkerStore`` is plain values.
"""

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from .deps import knobs
from .errors import WriterDisabled
from .layout import (
    DTYPES,
    GroupLayout,
    LayerLayout,
    StagingTensor,
    StatePart,
    StateView,
    model_layer_index,
    state_strides,
)
from .worker_store import WorkerSettings, WorkerStore


class VllmWorkerStore(WorkerStore):
    """A WorkerStore built from, and attached to, vLLM's worker objects."""

    @classmethod
    def from_vllm(
        cls, spec: Any, vllm_config: Any, kv_cache_config: Any
    ) -> "VllmWorkerStore":
        """Validate the knobs (a bad one fails the boot) and build."""
        return cls(
            knobs.read_knobs(),
            settings_from_vllm(spec, vllm_config, kv_cache_config),
            tp=initialized_tp,
        )

    def note_kv_caches(self, kv_caches: Mapping[str, Any]) -> None:
        """vLLM's per-layer caches (register_kv_caches): read the state
        layers' strides; a layout a header cannot describe disables the
        writer when it starts."""
        try:
            groups = []
            for g in self.settings.groups:
                if g.kind != "state":
                    groups.append(g)
                    continue
                names = self.settings.layer_names[g.group]
                layers = tuple(
                    replace(
                        layer,
                        state=state_strides(
                            layer.state, views_of(state_cache(kv_caches, n))
                        ),
                    )
                    for n, layer in zip(names, g.layers, strict=True)
                )
                groups.append(replace(g, layers=layers))
            self.settings.groups = groups
        except WriterDisabled as e:
            self.settings.unsupported = str(e)
        except (KeyError, TypeError, AttributeError) as e:
            self.settings.unsupported = f"cannot read the state layers' views: {e!r}"

    def attach_worker(self, worker: Any, kv_caches: Any, is_writer: bool) -> None:
        """Called once the CPU offloading worker exists; starts the writer."""
        try:
            if not is_writer:
                raise WriterDisabled(
                    "this rank does not store (replicated layout: rank 0 writes "
                    "the single copy)"
                )
            staging = staging_from_worker(worker, kv_caches)
        except WriterDisabled as e:
            self.disable(str(e))
            return
        refs = [
            [(ref.tensor_idx, ref.page_size_bytes) for ref in group_refs]
            for group_refs in kv_caches.group_data_refs
        ]
        self.attach(staging, refs)


def state_cache(kv_caches: Mapping[str, Any], name: str) -> Any:
    """One state layer's tensors as its kernels see them. vLLM 0.33.0 registers
    one raw ``[B, 1, 1, C]`` int8 page view per layer with the connector (seen
    on the H200: the writer refused LFM2's conv state); the layer's own
    ``bind_kv_cache`` unpacked it into the state views the forward context
    holds, whose strides the chunk headers must describe."""
    cache = kv_caches[name]
    if isinstance(cache, (list, tuple)):
        return cache
    from vllm.config import get_current_vllm_config_or_none

    config = get_current_vllm_config_or_none()
    if config is None:
        raise WriterDisabled(
            f"{name}: a raw page view and no vLLM config to find its state views"
        )
    return config.compilation_config.static_forward_context[name].kv_cache


def views_of(cache: Any) -> list[StateView]:
    """(shape, element strides, byte offset in the page) of each state
    tensor of one mamba layer, without the block dimension."""
    tensors = list(cache) if isinstance(cache, (list, tuple)) else [cache]
    base = tensors[0].data_ptr()
    return [
        (tuple(t.shape[1:]), tuple(t.stride()[1:]), t.data_ptr() - base)
        for t in tensors
    ]


def initialized_tp() -> tuple[int, int]:
    from vllm.distributed.parallel_state import get_tp_group

    group = get_tp_group()
    return group.rank_in_group, group.world_size


def vllm_version() -> str:
    try:
        from vllm import __version__

        return str(__version__)
    except ImportError:
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("vllm")
        except PackageNotFoundError:
            return "unknown"


def dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def weights_fingerprint(path: str) -> str:
    """sha256 over the names and sizes of the weight files in a local model
    folder ("" for a hub name). Sizes, not mtimes: a fresh download of the
    same weights must keep the namespace; weights replaced in place with the
    same sizes need GLM53_KV_OFFLOAD_BUILD_ID (docs/DEPLOY.md)."""
    try:
        names = sorted(os.listdir(path))
    except OSError:
        return ""
    h = hashlib.sha256()
    for name in names:
        if name.endswith(WEIGHT_SUFFIXES):
            try:
                size = os.stat(os.path.join(path, name)).st_size
            except OSError:
                continue
            h.update(f"{name}\0{size}\n".encode())
    return h.hexdigest()


def _stable_str(value: Any) -> str:
    """A config value JSON cannot hold, as text that is the same in every
    process (a default repr carries a memory address: never fenced)."""
    text = str(value)
    return type(value).__qualname__ if " at 0x" in text else text


def model_identity(vllm_config: Any) -> dict[str, str]:
    """What decides the KV values a model computes, beside the fenced layout:
    the weights (revision, quantization, the local weight files) and the
    model config as vLLM resolved it (dtype, overrides such as rope scaling).
    Fenced, so KV computed by other weights is never restored."""
    mc = getattr(vllm_config, "model_config", None)
    if mc is None:
        return {}
    hf = getattr(mc, "hf_config", None)
    config = hf.to_dict() if hasattr(hf, "to_dict") else {}
    text = json.dumps(config, sort_keys=True, default=_stable_str)
    return {
        "revision": str(getattr(mc, "revision", None) or ""),
        "quantization": str(getattr(mc, "quantization", None) or ""),
        "dtype": dtype_name(getattr(mc, "dtype", "")),
        "hf_config": hashlib.sha256(text.encode()).hexdigest(),
        "weights": weights_fingerprint(str(getattr(mc, "model", ""))),
    }


def served_name(vllm_config: Any) -> str:
    """``--served-model-name`` (its first name), "" when unset: vLLM then serves
    under the model's own name."""
    mc = getattr(vllm_config, "model_config", None)
    name = getattr(mc, "served_model_name", None)
    if isinstance(name, (list, tuple)):
        name = name[0] if name else None
    return name if isinstance(name, str) else ""


def settings_from_vllm(
    spec: Any, vllm_config: Any, kv_cache_config: Any
) -> WorkerSettings:
    from vllm.v1.kv_cache_interface import (
        AttentionSpec,
        MambaSpec,
        UniformTypeKVCacheSpecs,
    )

    config = spec.config
    parallel = config.parallel
    speculative = vllm_config.speculative_config
    settings = WorkerSettings(
        model=config.model.name,
        vllm_version=vllm_version(),
        kv_dtype=config.model.dtype,
        hash_algorithm=str(vllm_config.cache_config.prefix_caching_hash_algo),
        num_speculative_tokens=(
            speculative.num_speculative_tokens or 0 if speculative is not None else 0
        ),
        tp_size=parallel.tp_size,
        config_rank=parallel.rank,
        blocks_per_chunk=spec.blocks_per_chunk,
        model_identity=model_identity(vllm_config),
        served_name=served_name(vllm_config),
    )
    if parallel.pp_size > 1 or parallel.pcp_size > 1 or parallel.dcp_size > 1:
        settings.unsupported = "only tensor parallelism is supported"
    if config.canonical_layout:
        settings.unsupported = "the canonical host layout is not supported"
    for slot, group_config in enumerate(config.groups):
        group = kv_cache_config.kv_cache_groups[group_config.group_id]
        group_spec = group.kv_cache_spec
        per_layer = (
            group_spec.kv_cache_specs
            if isinstance(group_spec, UniformTypeKVCacheSpecs)
            else {}
        )
        layers = []
        kind = (
            "full" if group_config.sliding_window_size_in_chunks is None else "window"
        )
        for name in group_config.layer_names:
            layer_spec = per_layer.get(name, group_spec)
            index = model_layer_index(name)
            previous = layers[-1].index if layers else None
            if index is None or (previous is not None and index <= previous):
                # The header names each layer by the model's index, in
                # strictly ascending order within a group.
                settings.unsupported = f"layer {name}: no model layer index in order"
            if isinstance(layer_spec, MambaSpec):
                kind = "state"
                parts = tuple(
                    StatePart(dtype_name(d), tuple(int(x) for x in shape))
                    for shape, d in zip(
                        layer_spec.shapes, layer_spec.dtypes, strict=True
                    )
                )
                if any(p.dtype not in DTYPES for p in parts):
                    settings.unsupported = f"state dtype of layer {name}"
                    parts = ()
                settings.mamba_types[group_config.group_id] = str(
                    getattr(layer_spec.mamba_type, "value", layer_spec.mamba_type)
                )
                layers.append(
                    LayerLayout(-1, sum(p.nbytes for p in parts), parts, index)
                )
            elif isinstance(layer_spec, AttentionSpec):
                layers.append(
                    LayerLayout(-1, layer_spec.unpadded_page_size_bytes, (), index)
                )
            else:
                settings.unsupported = f"layer {name} has an unsupported KV spec"
                layers.append(LayerLayout(-1, 0, (), index))
        settings.groups.append(
            GroupLayout(group_config.group_id, slot, kind, tuple(layers))
        )
        settings.layer_names[group_config.group_id] = list(group_config.layer_names)
    return settings


def staging_from_worker(worker: Any, kv_caches: Any) -> list[StagingTensor]:
    """The CPU offloading worker's staging tensors, as flat byte views.

    Reads the worker's store handler; anything unexpected disables the
    writer rather than risk writing the wrong bytes.
    """
    import torch

    handler = getattr(worker, "_store_handler", None)
    cpu_tensors = getattr(handler, "dst_tensors", None)
    if cpu_tensors is None or len(cpu_tensors) != len(kv_caches.tensors):
        raise WriterDisabled(
            "not a CPU offloading worker with one staging tensor per KV tensor"
        )
    flats: dict[int, Any] = {}
    staging = []
    for t in cpu_tensors:
        storage = t.untyped_storage()
        flat = flats.get(storage.data_ptr())
        if flat is None:
            flat = torch.empty(0, dtype=torch.uint8).set_(
                storage, 0, (storage.nbytes(),), (1,)
            )
            flats[storage.data_ptr()] = flat
        size = t.element_size()
        staging.append(
            StagingTensor(
                flat, t.storage_offset() * size, t.stride(0) * size, t.shape[1] * size
            )
        )
    return staging
