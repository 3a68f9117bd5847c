"""Functions the GPU suite sends to every vLLM worker through LLM.collective_rpc.

Each takes the worker (vLLM's Worker) as its first argument and returns builtins only. They
read our writer through the worker's real OffloadingConnector; nothing here changes what the
engine or the writer does, except that install_recorder wraps WorkerStore.remember to keep a
copy of what each store job was (GPU block ids, side channel) for the byte comparison.

The GPU bytes are read independently of our writer: from the engine's own KV-cache tensors
(the attention/mamba layers' bound caches), at the manager block the scheduler stored from,
for the unpadded page size vLLM's spec reports. Our writer's layout code is not used.
"""

from __future__ import annotations

import collections
import dataclasses
import importlib
import os
import sys
import threading
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import read_diag  # noqa: E402  (the promotion reads' diagnoses)

OFFLOADING = "vllm.distributed.kv_transfer.kv_connector.v1.offloading"


def _store(worker: Any) -> tuple[Any, Any]:
    from vllm.distributed.kv_transfer import (
        get_kv_transfer_group,
        has_kv_transfer_group,
    )

    if not has_kv_transfer_group():
        return None, None
    connector_worker = get_kv_transfer_group().connector_worker
    return connector_worker, getattr(connector_worker, "_kv_store", None)


def _rank_info(store: Any) -> dict[str, Any]:
    """The writer's rank and folder, and the TP group vLLM itself initialized."""
    info: dict[str, Any] = {"pid": os.getpid()}
    try:
        from vllm.distributed.parallel_state import get_tp_group

        group = get_tp_group()
        info["tp_group"] = [group.rank_in_group, group.world_size]
    except Exception as e:  # noqa: BLE001 - a report, not a decision
        info["tp_group"] = f"unavailable: {e}"
    writer = getattr(store, "writer", None)
    if writer is not None:
        info["rank"] = writer.rank
        info["base"] = writer.layout.base
    return info


def install_recorder(worker: Any) -> dict[str, Any]:
    connector_worker, store = _store(worker)
    if connector_worker is None:
        return {"connector": False}
    out: dict[str, Any] = {
        "connector": True,
        "offloaded_groups": [g.group_id for g in connector_worker.spec.config.groups],
        "num_groups": len(connector_worker.kv_cache_config.kv_cache_groups),
        "store": store is not None,
    }
    if store is None:
        return out
    out.update(
        active=store.active,
        disabled=store.disabled_reason,
        writer_groups=[g.group for g in store.settings.groups],
        **_rank_info(store),
    )
    records: list[dict[str, Any]] = []
    original = store.remember

    def remember(job_id: int, entry: Any) -> None:
        meta = getattr(entry, "kv_store_meta", None)
        if store.active and isinstance(meta, dict) and meta.get("keys"):
            records.append(
                {
                    "job": job_id,
                    "gpu_blocks": [int(b) for b in entry.src_spec.block_ids],
                    "group_sizes": [int(n) for n in entry.src_spec.group_sizes],
                    "keys": [bytes(k) for k in meta["keys"]],
                    "groups": list(meta["groups"]),
                    "tokens": list(meta["tokens"]),
                }
            )
        original(job_id, entry)

    store.remember = remember
    store._probe_records = records
    return out


def thread_cpu(worker: Any) -> dict[str, float]:
    """CPU seconds (user + system) of this process's threads, summed by name
    without trailing digits (kv-store-writer-r0 and -r1 count as kv-store-writer-r); the
    thread that runs this call (the engine's, in-process) is also "(caller)", and the
    whole process, threads that ended included, "(process)"."""
    tick = os.sysconf("SC_CLK_TCK")
    me = threading.get_native_id()
    out: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the thread ended meanwhile
        seconds = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
        key = name.rstrip("0123456789")
        out[key] = out.get(key, 0.0) + seconds
        if int(tid) == me:
            out["(caller)"] = seconds
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    out["(process)"] = (int(fields[11]) + int(fields[12])) / tick
    return out


def ablate_writer(worker: Any, mode: str) -> dict[str, Any]:
    """Diagnosis of the throughput stages only. "capture": the writer releases
    each captured job unwritten, so a run pays the serving-path capture and the
    hooks but no checksum, file or manifest work."""
    _, store = _store(worker)
    if store is None or store.writer is None:
        return {"ablated": None}
    ablate(store, mode)
    return {"ablated": mode}


def ablate(store: Any, mode: str) -> None:
    """``ablate_writer`` on a WorkerStore (also bench/engine_thread_bench.py --ablate)."""
    if mode == "capture":
        writer = store.writer

        # What the queue thread calls for each job. It skips the rest of
        # process() too: the recapture after each job (the idle one still
        # runs) and the disk budget's settle.
        def release(job: Any) -> None:
            for item in job.keys:
                writer._free(item)

        writer.process = release
    elif mode == "hooks":
        # No capture at all: what the hooks cost on their own (the scheduler's
        # side channel, remember, the job bookkeeping).
        # (Neither the capture queued behind vLLM's store copy nor the ack's.)
        store.submitted = lambda job_id: None
        store.capture = lambda job_id: store._remembered.pop(job_id, None)
    else:
        raise ValueError(f"unknown ablation {mode!r}")


def slow_reads(worker: Any, bytes_per_second: int) -> dict[str, Any]:
    """A slow store (the cost guard's stage): the store library paces this
    process's chunk reads, every thread together, to ``bytes_per_second``."""
    native = importlib.import_module(OFFLOADING + ".kv_store_format.native")
    lib = native.load()
    lib.test_pace_reads(bytes_per_second)
    return {"paced_bytes_per_s": bytes_per_second, "library": lib.path}


_sampler: dict[str, Any] = {}


def start_sampler(worker: Any, interval_s: float = 0.001) -> bool:
    """Samples the calling thread's Python stack every interval_s until
    stop_sampler: which function it is in, attributed to the innermost frame
    of our overlays' code when there is one (else the innermost frame)."""
    import sys
    from collections import Counter

    target = threading.get_ident()
    counts: Counter = Counter()
    stop = threading.Event()
    # Our overlay modules (vLLM has a kv_offload package of its own).
    ours = ("kv_store_local", "kv_offload_", "kv_restore_", "kv_store_format")

    def label(frame: Any) -> str:
        inner = frame
        while frame is not None:
            name = frame.f_code.co_filename
            if any(o in name for o in ours):
                return f"ours {os.path.basename(name)}:{frame.f_code.co_name}"
            frame = frame.f_back
        name = inner.f_code.co_filename
        return f"{os.path.basename(name)}:{inner.f_code.co_name}"

    def run() -> None:
        while not stop.wait(interval_s):
            frame = sys._current_frames().get(target)
            if frame is not None:
                counts[label(frame)] += 1

    t = threading.Thread(target=run, name="probe-sampler", daemon=True)
    _sampler.update(counts=counts, stop=stop, thread=t)
    t.start()
    return True


def stop_sampler(worker: Any, top: int = 40) -> dict[str, Any]:
    _sampler["stop"].set()
    _sampler["thread"].join()
    counts = _sampler["counts"]
    return {"samples": sum(counts.values()), "top": counts.most_common(top)}


def _layer_page(worker: Any, name: str, num_blocks: int) -> tuple[Any, int, int]:
    """(uint8 view of the layer's storage, byte offset of block 0, manager-block stride)."""
    import torch

    ctx = worker.model_runner.compilation_config.static_forward_context
    kv = ctx[name].kv_cache
    if isinstance(kv, torch.Tensor):
        kv = _manager_blocks(worker, name, kv, num_blocks)
    first = kv if isinstance(kv, torch.Tensor) else kv[0]
    elem = first.element_size()
    ratio = first.shape[0] // num_blocks  # kernel blocks per manager block
    storage = first.untyped_storage()
    raw = torch.empty(0, dtype=torch.uint8, device=first.device).set_(
        storage, 0, (storage.nbytes(),), (1,)
    )
    return raw, first.storage_offset() * elem, first.stride(0) * elem * ratio


def _logical_block(
    worker: Any, name: str, spec: Any, num_blocks: int, block: int
) -> bytes:
    """A manager block's KV bytes of one layer in the cache's logical order.

    An attention layer's cache is a view of logical shape [B, H, N, C] whose strides follow
    the KV cache layout vLLM resolved, and that layout differs between engines: the pristine
    8B engine ran LBNHC, the same engine with the OffloadingConnector LBHNC (run 14). Raw
    page bytes of equal KV then differ, so a digest that compares engines reads the logical
    view. State layers (a list of tensors sharing one page) keep their raw page bytes.
    """
    import torch

    kv = worker.model_runner.compilation_config.static_forward_context[name].kv_cache
    if isinstance(kv, torch.Tensor):
        kv = _manager_blocks(worker, name, kv, num_blocks)
        ratio = kv.shape[0] // num_blocks  # kernel blocks per manager block
        view = kv[block * ratio : (block + 1) * ratio].contiguous()
        return view.view(torch.uint8).cpu().numpy().tobytes()
    raw, base, stride = _layer_page(worker, name, num_blocks)
    start = base + block * stride
    return raw[start : start + _unpadded_page(spec)].cpu().numpy().tobytes()


def _manager_blocks(worker: Any, name: str, kv: Any, num_blocks: int) -> Any:
    """The layer's cache addressed by manager block. vLLM binds a packed cache whose
    backend needs smaller blocks as a view of kernel blocks with other layers' pages
    between them (``AttentionGroup.kernel_block_stride``: GLM-5.3's indexer keys in
    512-token kernel blocks of a 4,608-token block). Slicing that view by
    ``shape[0] // num_blocks`` read the neighbouring rows (run 42); vLLM's own block
    zeroer maps it back the same way. A view that still does not split into
    ``num_blocks`` is refused rather than hashed."""
    for groups in getattr(worker.model_runner, "attn_groups", None) or []:
        for group in groups:
            if name in group.layer_names and getattr(group, "kernel_block_stride", 0):
                kv = group.map_kv_cache_to_manager_blocks(kv, num_blocks)
    if kv.shape[0] % num_blocks:
        raise ValueError(
            f"{name}: {kv.shape[0]} cache blocks is not a multiple of {num_blocks} blocks"
        )
    return kv


def _own_spec(worker: Any, name: str) -> Any:
    """The layer's own KV spec: a group's spec can be another layer's (GLM-5.3's MLA
    shares the kpool indexer's group, whose spec is the indexer's)."""
    config = getattr(worker, "vllm_config", None)
    if config is None:
        return None
    layer = worker.model_runner.compilation_config.static_forward_context[name]
    return layer.get_kv_cache_spec(config)


def _unpadded_page(spec: Any) -> int:
    from vllm.v1.kv_cache_interface import AttentionSpec, MambaSpec

    if isinstance(spec, AttentionSpec):
        return spec.unpadded_page_size_bytes
    if isinstance(spec, MambaSpec):
        return dataclasses.replace(spec, page_size_padded=None).page_size_bytes
    raise TypeError(type(spec).__name__)


def wait_writer_idle(worker: Any, timeout: float = 120.0) -> bool:
    """Whether this rank's writer has nothing queued (True without a writer)."""
    _, store = _store(worker)
    if store is None or not store.active:
        return True
    return store.writer.wait_idle(timeout=timeout)


def inspect_worker(worker: Any, compare: bool = True) -> dict[str, Any]:
    connector_worker, store = _store(worker)
    if store is None:
        return {"store": False}
    from vllm.v1.kv_cache_interface import UniformTypeKVCacheSpecs

    # The tree's kv_store_format with the chunk calls the overlays never make
    # (sim/chunk_calls.py: opening a keyed chunk, parsing a header in memory).
    sim = os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "sim"
    )
    if sim not in sys.path:
        sys.path.insert(0, sim)
    from chunk_calls import ChunkCalls

    fmt = ChunkCalls(importlib.import_module(OFFLOADING + ".kv_store_format"))
    out: dict[str, Any] = {
        "store": True,
        "active": store.active,
        "disabled": store.disabled_reason,
        **_rank_info(store),
    }
    if not store.active:
        return out
    t = time.time()
    out["drained"] = store.writer.wait_idle(timeout=120.0)
    out["drain_s"] = round(time.time() - t, 3)
    out["stats"] = dataclasses.asdict(store.stats)
    records = getattr(store, "_probe_records", [])
    out["jobs_seen"] = len(records)
    if not compare:
        return out
    kv_config = connector_worker.kv_cache_config
    num_blocks = kv_config.num_blocks
    pages: dict[str, tuple[Any, int, int, int]] = {}
    counts = {"keys": 0, "equal": 0, "different": 0, "no_file": 0, "shape": 0}
    checked: set[tuple[bytes, int]] = set()
    examples: list[dict[str, Any]] = []
    per_group: dict[int, int] = {}
    for rec in records:
        if len(rec["keys"]) != len(rec["gpu_blocks"]):
            counts["shape"] += 1
            continue
        for key, group, block in zip(rec["keys"], rec["groups"], rec["gpu_blocks"]):
            hash_ = bytes(key[:-4])
            if (hash_, group) in checked:
                continue
            checked.add((hash_, group))
            counts["keys"] += 1
            path = store.writer.layout.chunk(hash_.hex(), group)
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except FileNotFoundError:
                counts["no_file"] += 1
                continue
            key = getattr(store.writer, "key", None)
            if key is not None:  # a keyed store: the plain chunk it seals, MAC checked
                data = fmt.open_chunk(key, data, rank=store.writer.rank)
            header = fmt.decode_header(data)
            payload = data[header.header_length :]
            group_spec = kv_config.kv_cache_groups[group].kv_cache_spec
            per_layer = (
                group_spec.kv_cache_specs
                if isinstance(group_spec, UniformTypeKVCacheSpecs)
                else {}
            )
            parts = []
            for name in kv_config.kv_cache_groups[group].layer_names:
                if name not in pages:
                    raw, base, stride = _layer_page(worker, name, num_blocks)
                    spec = per_layer.get(name) or _own_spec(worker, name) or group_spec
                    size = _unpadded_page(spec)
                    pages[name] = (raw, base, stride, size)
                raw, base, stride, size = pages[name]
                start = base + block * stride
                parts.append(raw[start : start + size].cpu().numpy().tobytes())
            gpu = b"".join(parts)
            if gpu == payload:
                counts["equal"] += 1
                per_group[group] = per_group.get(group, 0) + 1
            else:
                counts["different"] += 1
                if len(examples) < 5:
                    first = next(
                        (i for i, (a, b) in enumerate(zip(gpu, payload)) if a != b),
                        min(len(gpu), len(payload)),
                    )
                    examples.append(
                        {
                            "group": group,
                            "block": block,
                            "gpu_len": len(gpu),
                            "payload_len": len(payload),
                            "first_difference": first,
                        }
                    )
    out["compare"] = counts
    out["equal_per_group"] = {str(k): v for k, v in sorted(per_group.items())}
    out["mismatch_examples"] = examples
    return out


# -- restore stages -------------------------------------------------------------


def block_digests(
    worker: Any, block_ids: list[list[int]], prompt_len: int
) -> list[list[str | None]]:
    """sha256 of the KV bytes of a request's full prompt blocks, per group and position.

    Read from the engine's own KV-cache tensors (every layer of the group, in the cache's
    logical order: _logical_block). Only positions below (prompt_len - 1) // block_size: the blocks a
    prefix hit can cover (vLLM always computes the last prompt token). The null block (0,
    a state group's unused position) reads as None.
    """
    import hashlib

    from vllm.v1.kv_cache_interface import UniformTypeKVCacheSpecs

    kv_config = worker.model_runner.kv_cache_config
    out: list[list[str | None]] = []
    for group, ids in enumerate(block_ids):
        kv_group = kv_config.kv_cache_groups[group]
        spec = kv_group.kv_cache_spec
        per_layer = (
            spec.kv_cache_specs if isinstance(spec, UniformTypeKVCacheSpecs) else {}
        )
        full = (prompt_len - 1) // spec.block_size
        digests: list[str | None] = []
        for block in ids[:full]:
            if block == 0:
                digests.append(None)
                continue
            h = hashlib.sha256()
            for name in kv_group.layer_names:
                layer_spec = per_layer.get(name, spec)
                h.update(
                    _logical_block(
                        worker, name, layer_spec, kv_config.num_blocks, block
                    )
                )
            digests.append(h.hexdigest())
        out.append(digests)
    return out


# The WorkerRestore methods the recorder wraps: a finished job's verdict (the
# job, returns whether its keys were restored) and a failure applied (the
# PromotionFailed). tests/realsched/test_probe_digests.py holds them to the
# real module, so a rename fails on CPU and not on the GPU.
RESTORE_WRAPPED = ("_finish", "_apply_failure")


def install_restore_recorder(worker: Any) -> dict[str, Any]:
    """Record every promotion this rank ran (keys, chunk files, outcome) and every failure."""
    connector_worker, store = _store(worker)
    restore = getattr(connector_worker, "_kv_restore", None)
    if restore is None:
        return {"restore": False}
    fmt = importlib.import_module(OFFLOADING + ".kv_store_format")
    promotions: list[dict[str, Any]] = []
    failures: list[dict[str, Any]] = []
    finish, apply_failure = (getattr(restore, name) for name in RESTORE_WRAPPED)

    def describe(key: bytes) -> dict[str, Any]:
        item: dict[str, Any] = {
            "key": key[:-4].hex(),
            "group": int.from_bytes(key[-4:], "big"),
        }
        try:
            item["path"] = store.writer.layout.chunk(item["key"], item["group"])
            # A keyed store's header as the plain one it seals (FORMAT.md 3.6).
            head = fmt.read_chunk_header(
                item["path"], getattr(store.writer, "key", None)
            )
            item["header_length"] = head.header_length
            item["payload_length"] = head.payload_length
        except Exception as e:  # noqa: BLE001 - a report, not a decision
            item["error"] = f"{type(e).__name__}: {e}"
        return item

    replay = os.environ.get("KVTIER_SUITE_READ_REPLAY") == "1"

    def recorded_finish(job: Any) -> bool:
        ok = finish(job)
        kept = getattr(restore, "_probe_replay", None)
        if replay and ok and job.read is not None:
            if kept is None or len(job.keys) > kept[0]:
                restore._probe_replay = (len(job.keys), job.read)
        # Only the keys here: this runs on the step's thread as the job is
        # reported, so reading each file's header now would hold the step up
        # (seen on the H200: a 2,048-file promotion took about 30 s more). The
        # files are described when the report is taken.
        promotions.append({"ok": bool(ok), "keys": [bytes(k) for k in job.keys]})
        return ok

    def recorded_failure(e: Any) -> None:
        key = getattr(e, "key", None)
        failures.append(
            {
                "reason": e.reason,
                "key": key[:-4].hex() if key else None,
                "message": str(e),
            }
        )
        apply_failure(e)

    restore._finish = recorded_finish
    restore._apply_failure = recorded_failure
    restore._probe = (promotions, failures, describe)
    if os.environ.get("KVTIER_SUITE_SAMPLE_STACKS") == "1":
        restore._probe_samples = read_diag.sample_stacks()
        restore._probe_tasks = read_diag.sample_tasks(restore)
    if os.environ.get("KVTIER_SUITE_GIL_WATCH") == "1":
        restore._probe_gil = read_diag.watch_gil(restore)
    return {"restore": True}


def restore_stats(worker: Any) -> dict[str, Any] | None:
    """This rank's restore counters alone (no drain, no inventory): taken before
    the timed rounds, so the judge can tell their reads from the warm-up's."""
    connector_worker, _ = _store(worker)
    restore = getattr(connector_worker, "_kv_restore", None)
    if restore is None:
        return None
    stats = dataclasses.asdict(restore.stats)
    stats["failures"] = dict(restore.stats.failures)
    return stats


def page_cache(worker: Any) -> dict[str, Any]:
    """How much of this rank's store folder the page cache holds now (memstat.py)."""
    _, store = _store(worker)
    writer = getattr(store, "writer", None)
    if writer is None:
        return {"base": None}
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import memstat

    return {"base": writer.layout.base, **memstat.resident(writer.layout.base)}


def restore_report(worker: Any) -> dict[str, Any]:
    connector_worker, store = _store(worker)
    restore = getattr(connector_worker, "_kv_restore", None)
    if restore is None:
        return {"restore": False}
    stats = dataclasses.asdict(restore.stats)
    stats["failures"] = dict(restore.stats.failures)
    promotions, failures, describe = getattr(restore, "_probe", ([], [], None))
    promotions = [
        {"ok": p["ok"], "keys": [describe(k) for k in p["keys"]]} for p in promotions
    ]
    inventory = restore.inventory
    writer: dict[str, Any] = {}
    if store is not None and store.active:
        # What the recompute's stores did (a refused chunk is written anew).
        writer["drained"] = store.writer.wait_idle(timeout=120.0)
        writer.update(dataclasses.asdict(store.stats))
    return {
        "restore": True,
        "active": restore.active,
        "disabled": restore.disabled_reason,
        "stats": stats,
        "manifests": len(inventory.manifests) if inventory is not None else 0,
        "manifests_bad": sorted(inventory.bad) if inventory is not None else [],
        "promotions": promotions,
        "failures": failures,
        "writer_stats": writer,
        "stack_samples": [
            [thread, where, n]
            for (thread, where), n in getattr(
                restore, "_probe_samples", collections.Counter()
            ).most_common(40)
        ],
        "read_replay": read_diag.replay_reads(restore),
        "gil_watch": read_diag.gil_report(getattr(restore, "_probe_gil", None)),
        "task_samples": dict(
            getattr(restore, "_probe_tasks", collections.Counter()).most_common(40)
        ),
        **_rank_info(store),
    }
