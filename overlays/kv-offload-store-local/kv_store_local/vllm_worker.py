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
from typing import TYPE_CHECKING, Any

from .capture_device import BlockTensor, Moves, TransferFailed
from .deps import init_logger, knobs, native
from .errors import StoreRefused, WriterDisabled
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

if TYPE_CHECKING:
    import torch
    from vllm.config import VllmConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.worker import (
        OffloadingConnectorWorker,
    )
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheSpec
    from vllm.v1.kv_offload.base import (
        CanonicalKVCaches,
        CanonicalKVCacheTensor,
        OffloadingSpec,
    )
    from vllm.v1.kv_offload.config import OffloadingGroupConfig
    from vllm.v1.kv_offload.cpu.gpu_worker import (
        CPUOffloadingWorker,
        SingleDirectionOffloadingHandler,
    )

logger = init_logger(__name__)


class VllmWorkerStore(WorkerStore):
    """A WorkerStore built from, and attached to, vLLM's worker objects."""

    @classmethod
    def from_vllm(
        cls,
        spec: "OffloadingSpec",
        vllm_config: "VllmConfig",
        kv_cache_config: "KVCacheConfig",
    ) -> "VllmWorkerStore":
        """Validate the knobs (a bad one fails the boot), load the native
        store library (missing, or another ABI or version: the boot fails
        naming the file; never a fallback to the Python writer) and build."""
        settings_knobs = knobs.read_knobs()
        try:
            settings = settings_from_vllm(spec, vllm_config, kv_cache_config)
        except (AttributeError, TypeError) as e:
            # A spec or config that lacks what the writer reads (another
            # offloading spec, a vLLM whose internals moved): the knob asked for
            # the tier, so the boot fails naming what is missing.
            raise StoreRefused(
                f"cannot read vLLM's offloading configuration ({type(spec).__name__}): {e}"
            ) from None
        return cls(
            settings_knobs,
            settings,
            tp=initialized_tp,
            store_lib=native.load(),
        )

    def note_kv_caches(self, kv_caches: Mapping[str, Any]) -> None:
        """vLLM's per-layer caches (register_kv_caches): read the state
        layers' strides; a layout a header cannot describe refuses the boot
        when the writer starts."""
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

    def attach_worker(
        self,
        worker: "CPUOffloadingWorker",
        kv_caches: "CanonicalKVCaches",
        is_writer: bool,
    ) -> None:
        """Called once the CPU offloading worker exists; starts the writer, or
        refuses the boot (StoreRefused) when it cannot bind to the worker."""
        if not is_writer:
            self.stand_by(
                "this rank does not store (replicated layout: rank 0 writes the "
                "single copy)"
            )
            return
        try:
            staging = staging_from_worker(worker, kv_caches)
        except WriterDisabled as e:
            raise StoreRefused(str(e)) from None
        except (AttributeError, TypeError) as e:  # vLLM's worker changed shape
            raise StoreRefused(
                f"cannot read the staging tensors of vLLM's CPU offloading worker "
                f"({type(worker).__name__}): {e}"
            ) from None
        refs = [
            [(ref.tensor_idx, ref.page_size_bytes) for ref in group_refs]
            for group_refs in kv_caches.group_data_refs
        ]
        device, blocks, allocate = None, [], None
        try:
            device, blocks = store_stream_device(worker, kv_caches)
            allocate = pinned_memory
        except (WriterDisabled, AttributeError, TypeError) as e:
            # The tier is on either way: the first capture then copies out of
            # staging on the engine thread, before the ack (slower). The
            # text only: a kept record must not hold this frame's views.
            logger.warning("KV store: first capture from staging: %s", str(e))
        self.attach(staging, refs, blocks=blocks, device=device, allocate=allocate)

    def drain(self, connector: "OffloadingConnectorWorker") -> int:
        """Clean shutdown: capture the store jobs vLLM never reported.

        vLLM submits each step's store jobs at the start of the next step and
        reports them one or more steps later; an engine that stops stepping
        (the offline LLM does once no request is unfinished) leaves the last
        ones deferred or in flight. Submit the deferred ones with vLLM's own
        start of a step (no transfer of its own), wait for every remembered
        job and every job whose capture is queued on the device (submitted,
        never reported), and capture it. Returns the jobs captured here."""
        worker = connector.worker
        if not self.active or worker is None:
            return 0
        captured = 0
        try:
            if connector._unsubmitted_store_jobs:
                from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (  # noqa: E501
                    OffloadingConnectorMetadata,
                )

                connector.start_kv_transfers(
                    OffloadingConnectorMetadata(load_jobs={}, store_jobs={})
                )
            # A job submitted before the engine stopped stepping has its first
            # capture queued on the device (it left _remembered for _queued).
            waiting = set(self._remembered) | set(self._queued)
            if waiting:
                worker.wait(waiting)
                for result in worker.get_finished():
                    if result.job_id not in waiting:
                        continue
                    if not result.success:  # vLLM 0.34.0 reports failed copies
                        self.transfer_failed(result.job_id)
                        continue
                    self.capture(result.job_id)
                    captured += 1
        except Exception:
            logger.exception("KV store: draining the last store jobs failed")
        self.stats.jobs_drained += captured
        return captured


class EventFence:
    """vLLM's completion event of the job, recorded again after our moves."""

    def __init__(self, event: "torch.Event", keep: tuple[Any, ...]):
        self.event = event
        self._keep = keep  # the descriptors stay alive until the copy ran

    def done(self) -> bool:
        return bool(self.event.query())

    def wait(self) -> None:
        self.event.synchronize()


class StoreStreamDevice:
    """The CUDA capture device: a submitted store job's moves (GPU KV block
    -> pinned capture pool) go on vLLM's own transfer stream of that job,
    right after its GPU -> staging copy, with vLLM's batched copy op; then
    the job's end event is recorded again. So every fence vLLM keeps covers
    our copy too: get_finished reports (and the connector acks) the job only
    after it, the flush path's wait() waits for it, and the next store job's
    stream starts after it. The engine thread only queues."""

    def __init__(self, handler: "SingleDirectionOffloadingHandler"):
        self.handler = handler

    def queue(self, job_id: int, moves: Moves) -> EventFence:
        import torch

        transfers = self.handler._transfers
        if not transfers or transfers[-1].job_id != job_id:
            raise RuntimeError(f"store job {job_id} is not vLLM's last transfer")
        transfer = transfers[-1]
        if getattr(transfer, "failed", False):  # vLLM 0.34.0 marks a failed copy
            raise TransferFailed(f"store job {job_id}: vLLM's copy failed")
        tensors: tuple[Any, ...] = ()
        with torch.cuda.stream(transfer.stream):
            if len(moves):
                # int64 views of the arrays, no copy; STREAM source order:
                # the copy reads the live KV cache.
                tensors = tuple(
                    torch.frombuffer(a, dtype=torch.int64)
                    for a in (moves.src, moves.dst, moves.size)
                )
                self.handler._swap_blocks_batch(*tensors, is_src_access_order_any=False)
            transfer.end_event.record(transfer.stream)
        return EventFence(transfer.end_event, (moves, tensors))

    def close(self) -> None:
        return


def store_stream_device(
    worker: "CPUOffloadingWorker", kv_caches: "CanonicalKVCaches"
) -> tuple[StoreStreamDevice, list[BlockTensor]]:
    """The device and the GPU KV tensors vLLM's store copy reads (indexed
    like the staging tensors: the canonical caches, viewed as vLLM's CPU
    worker views them); WriterDisabled when this is not CUDA or the worker
    has no GPU -> CPU transfer handler with a stream per job."""
    handler: SingleDirectionOffloadingHandler | None = getattr(
        worker, "_store_handler", None
    )
    if (
        handler is None
        or not getattr(handler, "gpu_to_cpu", False)
        or not hasattr(handler, "_transfers")
        or not callable(getattr(handler, "_swap_blocks_batch", None))
    ):
        raise WriterDisabled("the CPU worker has no GPU -> CPU transfer handler")
    return StoreStreamDevice(handler), [block_tensor(t) for t in kv_caches.tensors]


def block_tensor(t: "CanonicalKVCacheTensor") -> BlockTensor:
    """One KV tensor as rows of its page size: what vLLM's store copy reads
    (0.33.0 views it so; 0.34.0 resolves the same rows' addresses per job)."""
    x = t.tensor
    if not getattr(x, "is_cuda", False):
        raise WriterDisabled("the store copy's source is not a CUDA tensor")
    nbytes = x.numel() * x.element_size()
    if not x.is_contiguous() or nbytes % t.page_size_bytes:
        raise WriterDisabled("a KV tensor is not contiguous rows of its page size")
    return BlockTensor(x.data_ptr(), t.page_size_bytes, nbytes // t.page_size_bytes)


def pinned_memory(capacity: int) -> tuple[int, Any]:
    """Page-locked host memory for the capture pool: a GPU copies into it
    asynchronously (pageable memory would make each copy synchronous)."""
    import torch

    t = torch.empty(capacity, dtype=torch.uint8, pin_memory=True)
    return t.data_ptr(), t


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
    layer: AttentionLayerBase = config.compilation_config.static_forward_context[name]
    return layer.kv_cache


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


def model_identity(vllm_config: "VllmConfig") -> dict[str, str]:
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


def served_name(vllm_config: "VllmConfig") -> str:
    """``--served-model-name`` (its first name), "" when unset: vLLM then serves
    under the model's own name."""
    mc = getattr(vllm_config, "model_config", None)
    name = getattr(mc, "served_model_name", None)
    if isinstance(name, (list, tuple)):
        name = name[0] if name else None
    return name if isinstance(name, str) else ""


def group_window_kind(
    group_config: "OffloadingGroupConfig", group_spec: "KVCacheSpec"
) -> str:
    """ "window" for a sliding-window or chunked-local group, else "full".

    vLLM 0.33.0's OffloadingGroupConfig carries sliding_window_size_in_chunks
    (None for full attention); 0.32.0's does not, so there the group's own
    spec decides, by the same two types 0.33.0 gives a window to.
    """
    if hasattr(group_config, "sliding_window_size_in_chunks"):
        windowed = group_config.sliding_window_size_in_chunks is not None
        return "window" if windowed else "full"
    from vllm.v1.kv_cache_interface import (
        ChunkedLocalAttentionSpec,
        SlidingWindowSpec,
        UniformTypeKVCacheSpecs,
    )

    if isinstance(group_spec, UniformTypeKVCacheSpecs):
        group_spec = next(iter(group_spec.kv_cache_specs.values()))
    windowed = isinstance(group_spec, (SlidingWindowSpec, ChunkedLocalAttentionSpec))
    return "window" if windowed else "full"


def settings_from_vllm(
    spec: "OffloadingSpec", vllm_config: "VllmConfig", kv_cache_config: "KVCacheConfig"
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
    placement = packed_placement(kv_cache_config)
    for slot, group_config in enumerate(config.groups):
        group = kv_cache_config.kv_cache_groups[group_config.group_id]
        group_spec = group.kv_cache_spec
        per_layer = (
            group_spec.kv_cache_specs
            if isinstance(group_spec, UniformTypeKVCacheSpecs)
            else {}
        )
        layers = []
        kind = group_window_kind(group_config, group_spec)
        for name in group_config.layer_names:
            layer_spec = per_layer.get(name, group_spec)
            index = model_layer_index(name)
            previous = layers[-1] if layers else None
            # The header names each layer by the model's index, ascending within
            # a group; two caches of one attention layer (GLM-5.3's indexer keys
            # and MLA) are parts 0 and 1 of that index.
            part = 0
            if previous is not None and index == previous.index:
                part = previous.part + 1
            if index is None or (
                previous is not None
                and (index < previous.index or (part and previous.state))
            ):
                settings.unsupported = f"layer {name}: no model layer index in order"
            offset, stride = placement.get(name, (0, 0))
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
                if part:
                    settings.unsupported = f"layer {name}: two state caches of a layer"
                layers.append(
                    LayerLayout(
                        -1, sum(p.nbytes for p in parts), parts, index, offset=offset
                    )
                )
            elif isinstance(layer_spec, AttentionSpec):
                page = layer_spec.unpadded_page_size_bytes
                if (
                    stride
                    and name not in per_layer
                    and stride != group_spec.page_size_bytes
                ):
                    # A packed group whose spec is another layer's (GLM-5.3: the
                    # indexer leads the group its MLA shares): this layer's page
                    # is what vLLM placed for it.
                    page = stride
                layers.append(LayerLayout(-1, page, (), index, part, offset))
            else:
                settings.unsupported = f"layer {name} has an unsupported KV spec"
                layers.append(LayerLayout(-1, 0, (), index))
        settings.groups.append(
            GroupLayout(group_config.group_id, slot, kind, tuple(layers))
        )
        settings.layer_names[group_config.group_id] = list(group_config.layer_names)
    return settings


def packed_placement(kv_cache_config: "KVCacheConfig") -> dict[str, tuple[int, int]]:
    """Layer name -> (byte offset in the block, bytes vLLM placed for it) when the
    layout is block-outermost: every group's layers then share one row a block
    (vLLM's packed groups); empty otherwise (one tensor a layer)."""
    from vllm.v1.kv_cache_layout import KVCacheLayout

    name = getattr(kv_cache_config, "kv_cache_layout", None)
    if name is None or not KVCacheLayout[name].is_block_outermost:
        return {}
    return {
        layer: (t.offset + i * t.layer_stride, t.layer_stride)
        for t in kv_cache_config.kv_cache_tensors
        for i, layer in enumerate(t.layers)
    }


def staging_from_worker(
    worker: "CPUOffloadingWorker", kv_caches: "CanonicalKVCaches"
) -> list[StagingTensor]:
    """The CPU offloading worker's staging tensors, as flat byte views.

    Reads the worker's store handler; anything unexpected refuses the boot
    (WriterDisabled, turned into StoreRefused) rather than risk writing the
    wrong bytes.
    """
    import torch

    handler: SingleDirectionOffloadingHandler | None = getattr(
        worker, "_store_handler", None
    )
    if handler is None:
        raise WriterDisabled(
            f"{type(worker).__name__} has no store handler (not vLLM's CPU "
            "offloading worker)"
        )
    # vLLM 0.34.0 keeps one list of CPU tensors a handler; 0.33.0
    # names them by direction (the store handler's destination).
    if hasattr(handler, "cpu_tensors"):
        cpu_tensors = handler.cpu_tensors
    else:
        cpu_tensors = handler.dst_tensors
    if len(cpu_tensors) != len(kv_caches.tensors):
        raise WriterDisabled(
            f"{len(cpu_tensors)} staging tensors for {len(kv_caches.tensors)} KV "
            "tensors"
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
