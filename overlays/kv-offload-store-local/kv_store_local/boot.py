# SPDX-License-Identifier: Apache-2.0
"""A rank's boot: from vLLM's facts (WorkerSettings) to an opened store.

What ``WorkerStore.start`` does before its first job, in this order: refuse a
layout a chunk header cannot describe, load the native store library (the
only writer of chunk files), check the store folder is private (before
anything is created in it), load the key, resolve the TP rank and the fenced
namespace, open the rank's folder and build the writer (not started);
then check the layout against the staging rows and KV blocks its captures
read. Every problem raises WriterDisabled, which ``WorkerStore.attach`` turns
into the boot's StoreRefused: the knob asked for the tier.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import store_perms
from .capture_device import BlockTensor
from .capture_pool import CapturePool
from .deps import fmt, knobs, native
from .errors import WriterDisabled
from .layout import GroupLayout, StagingTensor
from .namespace import (
    folder_model_name,
    key_scheme,
    open_namespace,
    resolve_rank,
    state_abi,
)
from .stats import StoreStats
from .writer import StoreWriter


@dataclass
class WorkerSettings:
    """The facts the writer needs from vLLM, as plain values."""

    model: str
    vllm_version: str
    kv_dtype: str
    hash_algorithm: str
    num_speculative_tokens: int
    tp_size: int
    config_rank: int
    blocks_per_chunk: int
    groups: list[GroupLayout] = field(default_factory=list)
    mamba_types: dict[int, str] = field(default_factory=dict)
    # What decides the KV values beside the layout (vllm_worker.model_identity).
    model_identity: dict[str, str] = field(default_factory=dict)
    served_name: str = ""  # --served-model-name, when set: names the folder
    layer_names: dict[int, list[str]] = field(default_factory=dict)  # per group
    unsupported: str | None = None  # why this layout cannot be written


@dataclass(frozen=True)
class OpenedStore:
    """The rank's writer, built on its folder and not started yet."""

    writer: StoreWriter
    rank_source: str  # where the rank came from (namespace.resolve_rank)


def open_store(
    store_knobs: knobs.Knobs,
    settings: WorkerSettings,
    capture_bytes: int,
    stats: StoreStats,
    *,
    tp: Callable[[], tuple[int, int]] | None,
    store_lib: Any,
    allocate: Any,
    on_lost: Callable[[Any, str], None],
    recapture: Callable[[], None],
) -> OpenedStore:
    """Check the folder and the key, resolve rank and namespace, open the
    rank's folder and build its writer over a capture pool of
    ``capture_bytes`` (``allocate``: its memory, CapturePool).

    ``store_lib``: the native store library (kv_store_format.native), None
    for the one ``native.load()`` finds; ``on_lost`` and ``recapture`` are
    the writer's hooks (StoreWriter's on_lost, and its on_idle and
    on_job_done).
    """
    s = settings
    if s.unsupported:
        raise WriterDisabled(s.unsupported)
    if store_lib is None:
        try:
            store_lib = native.load()
        except native.NativeLibraryError as e:
            # No Python writer to fall back on: the tier the knob asked for
            # is refused, naming the file.
            raise WriterDisabled(f"the store library cannot be used: {e}") from e
    try:
        # Before anything is created: the store must be private to us.
        store_perms.use(store_perms.modes_for_group(store_knobs.group))
        store_perms.check_store(store_knobs.root)
    except store_perms.UnsafeStore as e:
        raise WriterDisabled(str(e)) from e
    key = None
    if store_knobs.key_file:
        try:
            key = fmt.load_key(store_knobs.key_file, store_knobs.root)
        except fmt.KeyFileError as e:
            raise WriterDisabled(str(e)) from e
        if not store_lib.supports_mac():
            # Never write a store the operator believes authenticated.
            raise WriterDisabled(
                f"{knobs.KEY_FILE} is refused: {store_lib.path} was "
                "built without OpenSSL and cannot seal chunks"
            )
    rank, provenance = resolve_rank(s.config_rank, s.tp_size, tp)
    fenced = fmt.make_fenced(
        model=s.model,
        vllm_version=s.vllm_version,
        build_id=store_knobs.build_id,
        tp_size=s.tp_size,
        kv_dtype=s.kv_dtype,
        hash_algorithm=s.hash_algorithm,
        num_speculative_tokens=s.num_speculative_tokens,
        # Window (drafter) groups are never written: not part of the layout
        # a reader needs, so the drafter knob does not fork the namespace.
        page_sizes={g.group: g.block_bytes for g in s.groups if g.kind != "window"},
        state_abi=state_abi(s),
        # Restore reads a store only under the key scheme it was written with.
        key_scheme=key_scheme(s.hash_algorithm),
        # Headers name layers by the model's layer index (earlier writers put
        # the position within the group there): never mix the two in one store.
        layer_index="model",
        # KV computed by other weights, quantization or config overrides
        # must never be restored: they fork the namespace too.
        model_identity=s.model_identity or None,
    )
    # A keyed store fences the key's id (never the key): another key is
    # another namespace hash, other folders, never a load (FORMAT.md 3.6).
    fenced = fmt.fence_key(fenced, key)
    info = {
        "keep_boundaries": store_knobs.keep_boundaries,
        "rank_source": provenance,
        "cpu_gb": store_knobs.cpu_gb,
        "drafter": store_knobs.drafter,
        "blocks_per_chunk": s.blocks_per_chunk,
        "capture_bytes": capture_bytes,
    }
    try:
        folder = folder_model_name(s.model, s.served_name)
        layout = open_namespace(store_knobs.root, folder, rank, fenced, info)
        pool = CapturePool(capture_bytes, allocate)
        writer = StoreWriter(
            layout,
            fmt.namespace_hash(fenced),
            rank,
            pool,
            store_knobs.keep_boundaries,
            stats=stats,
            on_lost=on_lost,
            on_idle=recapture,
            on_job_done=recapture,
            store_lib=store_lib,
            disk_bytes=store_knobs.disk_bytes,
            key=key,
        )
    except store_perms.UnsafeStore as e:
        raise WriterDisabled(str(e)) from e
    except OSError as e:
        raise WriterDisabled(
            f"cannot open the store under {store_knobs.root}: {e}"
        ) from e
    return OpenedStore(writer, provenance)


def check_fits(
    groups: Sequence[GroupLayout],
    blocks_per_chunk: int,
    staging: Sequence[StagingTensor],
    blocks: Sequence[BlockTensor] = (),
) -> None:
    """Every layer's bytes lie inside its staging row's page and, given the KV
    ``blocks`` a first capture reads, inside its block: the copies trust
    these offsets and never check a bound, so a layout that does not fit
    refuses the boot (WriterDisabled)."""
    for g in groups:
        for layer in g.layers:
            if not 0 <= layer.tensor < len(staging) or (
                layer.offset + layer.real_bytes
                > staging[layer.tensor].width // blocks_per_chunk
            ):
                raise WriterDisabled(f"group {g.group} does not fit its staging rows")
    if blocks:
        for g in groups:
            for layer in g.layers:
                if layer.tensor >= len(blocks) or (
                    layer.offset + layer.real_bytes > blocks[layer.tensor].block_stride
                ):
                    raise WriterDisabled(f"group {g.group} does not fit its KV blocks")
