"""The real vLLM 0.33.0 scheduler side, booted on a machine without a GPU.

What a real engine core builds, built the same way: the VllmConfig from EngineArgs (a tiny
NemotronH-style hybrid config plus an EAGLE drafter, from engine/models), the KV-cache groups
and config from per-layer specs through vLLM's own planner, then the real Scheduler, which
makes the real HybridKVCacheCoordinator and the real OffloadingConnector (scheduler role) with
the TieringOffloadingSpec's CPU manager. Only the model runner is played by this module: each
step it "samples" one token per request and acknowledges the store jobs of the step before,
as every worker would once its GPU->CPU copy finished.

The platform is forced to vLLM's CPU platform only so that EngineArgs can make a DeviceConfig;
nothing here loads vllm._C or touches a device.

The layout (7 groups, as vLLM groups these layers):
    4 x mamba2 state ("align" mode), 2 x full attention, 1 x EAGLE drafter (sliding window)
"""

from __future__ import annotations

import contextlib
import copy
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "engine" / "models"
BLOCK = 16


def use_cpu_platform() -> None:
    import vllm.platforms as platforms
    from vllm.platforms.cpu import CpuPlatform

    class SchedulerOnlyCpu(CpuPlatform):
        """vLLM's CPU platform, for the scheduler side only. vLLM 0.34.0 refuses an
        x86 CPU without triton-cpu (its CPU model runner compiles kernels); this
        tier runs no kernel, so the check is answered as if it were there (0.33.0
        warned and went on)."""

        @classmethod
        def check_and_update_config(cls, vllm_config) -> None:
            import vllm.triton_utils as triton_utils

            had = triton_utils.HAS_TRITON
            triton_utils.HAS_TRITON = True
            try:
                super().check_and_update_config(vllm_config)
            finally:
                triton_utils.HAS_TRITON = had

    if not isinstance(platforms._current_platform, CpuPlatform):
        platforms._current_platform = SchedulerOnlyCpu()


def connector_config(cpu_bytes: int) -> dict[str, Any]:
    """The connector JSON docker/launch.sh gives every rank, with a chosen CPU size."""
    return {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "spec_name": "TieringOffloadingSpec",
            "cpu_bytes_to_use": cpu_bytes,
            "blocks_per_chunk": 1,
            "offload_prompt_only": False,
            "secondary_tiers": [],
        },
    }


LOCAL_STORE_TIER = {
    "type": "LocalStoreTier",
    "module_path": "vllm.distributed.kv_transfer.kv_connector.v1.offloading.kv_restore_tier",
}


def use_local_store_tier(monkeypatch) -> None:
    """Boots from here on name the LocalStoreTier in secondary_tiers (restore)."""
    plain = connector_config

    def with_tier(cpu_bytes):
        config = plain(cpu_bytes)
        config["kv_connector_extra_config"]["secondary_tiers"] = [
            dict(LOCAL_STORE_TIER)
        ]
        return config

    monkeypatch.setattr(sys.modules[__name__], "connector_config", with_tier)
    monkeypatch.setattr(sys.modules[__name__], "_BASE_CONFIGS", {})


_BASE_CONFIGS: dict[tuple[bool, int], Any] = {}


def engine_config(cpu_bytes: int, eagle: bool = True) -> Any:
    """A fresh VllmConfig (the expensive model inspection is done once per process)."""
    key = (eagle, cpu_bytes)
    if key not in _BASE_CONFIGS:
        use_cpu_platform()
        from vllm.engine.arg_utils import EngineArgs

        kwargs: dict[str, Any] = dict(
            model=str(MODELS / "nemotronh"),
            skip_tokenizer_init=True,
            load_format="dummy",
            enforce_eager=True,
            max_model_len=1024,
            enable_prefix_caching=True,
            block_size=BLOCK,
            max_num_seqs=8,
            max_num_batched_tokens=256,
            kv_transfer_config=connector_config(cpu_bytes),
        )
        if eagle:
            kwargs["speculative_config"] = {
                "method": "eagle",
                "model": str(MODELS / "eagle-llama"),
                "num_speculative_tokens": 1,
            }
        _BASE_CONFIGS[key] = EngineArgs(**kwargs).create_engine_config()
    return copy.deepcopy(_BASE_CONFIGS[key])


def layer_specs(drafter: str = "swa", target: str = "hybrid") -> dict[str, Any]:
    """Per-layer KV specs as the NemotronH-style workers would report them.

    drafter: "swa" gives the drafter its own group (a sliding-window spec), "same" gives it
    the target's attention spec, so vLLM puts it into the target's attention group.
    target: "hybrid" (mamba + attention) or "attention" (two attention layers only).
    """
    import torch
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        MambaSpec,
        SlidingWindowSpec,
    )

    bf16 = torch.bfloat16
    attn = FullAttentionSpec(block_size=BLOCK, num_kv_heads=2, head_size=64, dtype=bf16)

    def mamba() -> Any:
        return MambaSpec(
            block_size=BLOCK,
            shapes=((3, 64), (4, 8, 16)),
            dtypes=(bf16, torch.float32),
            page_size_padded=attn.page_size_bytes,
            mamba_cache_mode="align",
        )

    if drafter == "swa":
        draft = SlidingWindowSpec(
            block_size=BLOCK,
            num_kv_heads=2,
            head_size=64,
            dtype=bf16,
            sliding_window=2 * BLOCK,
            is_draft=True,
        )
    else:
        draft = FullAttentionSpec(
            block_size=BLOCK, num_kv_heads=2, head_size=64, dtype=bf16, is_draft=True
        )
    if target == "attention":  # a plain Llama with an EAGLE head
        return {
            "model.layers.0.self_attn.attn": copy.deepcopy(attn),
            "model.layers.1.self_attn.attn": copy.deepcopy(attn),
            "model.layers.2.self_attn.attn": draft,
        }
    return {
        "model.layers.0.mixer": mamba(),
        "model.layers.1.mixer": mamba(),
        "model.layers.2.mixer": copy.deepcopy(attn),
        "model.layers.3.mixer": mamba(),
        "model.layers.4.mixer": copy.deepcopy(attn),
        "model.layers.5.mixer": mamba(),
        "model.layers.6.self_attn.attn": draft,
    }


@dataclass
class Booted:
    vllm_config: Any
    kv_cache_config: Any  # the scheduler's
    worker_kv_cache_config: Any
    scheduler: Any

    @property
    def connector(self) -> Any:
        return self.scheduler.connector

    @property
    def offload(self) -> Any:
        """The OffloadingConnectorScheduler."""
        return self.scheduler.connector.connector_scheduler


# Schedulers boot() made: shut_down_booted() shuts them down, and with them the CPU tier's
# shared region in /dev/shm (a file that outlives the process unless unlinked).
_booted: list[Any] = []


def shut_down_booted() -> None:
    while _booted:
        _booted.pop().shutdown()


def offload_regions() -> set[str]:
    """vLLM's CPU-tier region files now in /dev/shm."""
    return {p.name for p in Path("/dev/shm").glob("vllm_offload_*.mmap")}


def held_by_others(names: set[str]) -> set[str]:
    """Those of ``names`` (files in /dev/shm) that another live process has open or
    mapped: a boot still running for another test, not a file left behind."""
    paths = {f"/dev/shm/{n}": n for n in names}
    held: set[str] = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    held.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
            with open(f"/proc/{pid}/maps") as f:
                held.update(line.split(None, 5)[-1].strip() for line in f)
        except OSError:
            continue  # gone meanwhile, or not ours to read
    return {n for p, n in paths.items() if p in held}


def left_behind(names: set[str], settle_s: float = 5.0) -> set[str]:
    """Those of ``names`` still in /dev/shm that no other live process holds, once
    ``settle_s`` passed with them so: a boot of another process may be between closing
    its region and removing it, which a single look takes for a file left behind."""
    deadline = time.monotonic() + settle_s
    while True:
        left = {n for n in names if os.path.exists(f"/dev/shm/{n}")}
        left -= held_by_others(left)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def boot(
    cpu_bytes: int = 64 << 20,
    num_blocks: int = 400,
    drafter: str = "swa",
    eagle: bool = True,
    target: str = "hybrid",
) -> Booted:
    """Group the layers, size the KV cache and build the Scheduler, as EngineCore does."""
    return boot_specs(
        engine_config(cpu_bytes, eagle), layer_specs(drafter, target), num_blocks
    )


def boot_specs(
    vc: Any,
    specs: dict[str, Any],
    num_blocks: int = 400,
    layouts: list[str] | None = None,
) -> Booted:
    """boot() for any engine config and per-layer specs (model_layout.py: a real model's),
    with the layouts the workers' backends support (default: LBNHC only)."""
    from vllm.v1.attention.backends.utils import resolve_kv_cache_layout
    from vllm.v1.core.kv_cache_planning import (
        get_global_kv_cache_groups,
        get_kv_cache_configs,
    )
    from vllm.v1.core.kv_cache_utils import (
        generate_scheduler_kv_cache_config,
        resolve_kv_cache_block_sizes,
    )
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.structured_output import StructuredOutputManager

    resolve_kv_cache_layout(vc, [layouts or ["LBNHC"]], list(specs.values()))
    groups = get_global_kv_cache_groups(vc, [specs])
    # Memory for num_blocks blocks of every layer (its page each).
    memory = num_blocks * sum(spec.page_size_bytes for spec in specs.values())
    worker_configs = get_kv_cache_configs(vc, [specs], [memory], groups)
    sched_config = generate_scheduler_kv_cache_config(worker_configs)
    block_size, hash_block_size = resolve_kv_cache_block_sizes(sched_config, vc)
    for cfg in (*worker_configs, sched_config):
        cfg.hash_block_size = hash_block_size
        cfg.kv_cache_layout = vc.cache_config.kv_cache_layout  # as EngineCore sets it
    vc.cache_config.num_gpu_blocks = sched_config.num_blocks
    scheduler = Scheduler(
        vllm_config=vc,
        kv_cache_config=sched_config,
        structured_output_manager=StructuredOutputManager(vc),
        block_size=block_size,
        hash_block_size=hash_block_size,
        log_stats=True,
    )
    _booted.append(scheduler)
    return Booted(vc, sched_config, worker_configs[0], scheduler)


@dataclass
class StepRecord:
    scheduled: dict[str, int]
    store_jobs: dict[int, Any]
    job_keys: dict[int, set[bytes]] = field(default_factory=dict)


class Engine:
    """Plays the model runner and the workers around the real Scheduler."""

    def __init__(self, booted: Booted, fail_jobs: set[int] | None = None):
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_utils import (
            get_request_block_hasher,
            init_none_hash,
        )

        self.b = booted
        self.s = booted.scheduler
        cache = booted.vllm_config.cache_config
        hash_fn = get_hash_fn_by_name(cache.prefix_caching_hash_algo)
        init_none_hash(hash_fn)
        self.hasher = get_request_block_hasher(
            booted.kv_cache_config.hash_block_size,
            hash_fn,
            booted.vllm_config.num_hash_lookahead_tokens,
        )
        self.pending_acks: list[int] = []
        self.pending_loads: dict[int, str] = {}
        self.steps: list[StepRecord] = []
        self.all_jobs: dict[int, Any] = {}
        self.finished: set[str] = set()
        self.load_jobs: list[dict[str, Any]] = []
        # The played model's seconds per scheduled token (0: as fast as Python).
        self.token_seconds = 0.0

    def add(self, req_id: str, prompt: list[int], max_tokens: int = 4) -> None:
        from vllm import SamplingParams
        from vllm.v1.request import Request

        sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0)
        self.s.add_request(
            Request(
                request_id=req_id,
                prompt_token_ids=list(prompt),
                sampling_params=sp,
                pooling_params=None,
                block_hasher=self.hasher,
            )
        )

    def step(self) -> StepRecord:
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
            OffloadingWorkerMetadata,
        )
        from vllm.v1.outputs import KVConnectorOutput

        out = self.s.schedule()
        meta = out.kv_connector_metadata
        store_jobs = dict(getattr(meta, "store_jobs", {}) or {})
        self.all_jobs.update(store_jobs)
        job_keys = {j: set(self.b.offload._jobs[j].keys) for j in store_jobs}
        for job_id, job in (getattr(meta, "load_jobs", {}) or {}).items():
            self.load_jobs.append(job_record(self.b, job_id, job))
        req_ids = list(out.num_scheduled_tokens)
        if self.token_seconds:
            time.sleep(self.token_seconds * out.total_num_scheduled_tokens)
        sampled = []
        for rid in req_ids:
            req = self.s.requests[rid]
            # A token only when the step reaches the end of the known tokens: schedule()
            # has already counted this step's tokens in num_computed_tokens.
            sampled.append([7] if req.num_computed_tokens >= req.num_tokens else [])
        worker_meta = OffloadingWorkerMetadata()
        for job_id in self.pending_acks:
            worker_meta.mark_completed(job_id)
        # A request whose async load finished is reported as received (get_finished).
        received = set(self.pending_loads.values())
        # Every job the workers were given completes by the next step (loads too).
        load_jobs = getattr(meta, "load_jobs", {}) or {}
        self.pending_loads = {
            j: job.req_id for j, job in load_jobs.items() if not job.sync
        }
        self.pending_acks = [
            *store_jobs,
            *load_jobs,
            *(getattr(meta, "jobs_to_flush", ()) or ()),
        ]
        mro = model_runner_output(
            req_ids=req_ids,
            sampled_token_ids=sampled,
            kv_connector_output=KVConnectorOutput(
                finished_recving=received or None,
                kv_connector_worker_meta=worker_meta,
            ),
        )
        engine_outputs = self.s.update_from_output(out, mro)
        for eo in engine_outputs.values():
            for o in eo.outputs:
                if o.finish_reason is not None:
                    self.finished.add(o.request_id)
        rec = StepRecord(dict(out.num_scheduled_tokens), store_jobs, job_keys)
        self.steps.append(rec)
        return rec

    def run(self, max_steps: int = 200) -> None:
        """Step until every request finished and every store job was acknowledged."""
        for _ in range(max_steps):
            if (
                not self.s.has_requests()
                and not self.pending_acks
                and not self.pending_loads
            ):
                return
            self.step()
        raise AssertionError(f"not done after {max_steps} steps")


def knob_env(**values: str | None) -> dict[str, str | None]:
    """GLM53_KV_OFFLOAD* values to set (None: unset), for monkeypatch or os.environ."""
    return {f"GLM53_KV_OFFLOAD{'_' + k if k else ''}": v for k, v in values.items()}


def set_knobs(env: dict[str, str | None]) -> None:
    for key in [k for k in os.environ if k.startswith("GLM53_KV_OFFLOAD")]:
        del os.environ[key]
    for key, value in env.items():
        if value is not None:
            os.environ[key] = value


def _ids(spec: Any) -> list[int]:
    return [int(b) for b in spec.block_ids]


def job_record(
    booted: Booted, job_id: int, job: Any, keys: set[bytes] | None = None
) -> dict[str, Any]:
    if keys is None:
        keys = set(booted.offload._jobs[job_id].keys)
    return {
        "req": job.req_id,
        "src": _ids(job.src_spec),
        "dst": _ids(job.dst_spec),
        "keys": sorted(k.hex() for k in keys),
    }


def run_scenario(name: str) -> tuple[Booted, Engine, dict[str, Any]]:
    """Runs a named scenario; returns the boot, the engine and a JSON-able trace.

    prefix: a 70-token prompt and a second one sharing its first 48 tokens, 3 tokens each.
    reload: prefix, then the GPU prefix cache is reset and the first prompt comes again,
            so only the CPU tier can serve it.
    evict:  six distinct 64-token prompts into a CPU tier of 12 chunks.
    """
    a = list(range(1, 71))
    b = list(range(1, 49)) + [900 + i for i in range(22)]
    if name == "evict":
        booted = boot(cpu_bytes=12 * _chunk_bytes())
        engine = Engine(booted)
        for r in range(6):
            engine.add(f"e{r}", [(r * 97 + i * 5) % 800 + 10 for i in range(64)], 2)
        engine.run()
    else:
        booted = boot()
        engine = Engine(booted)
        engine.add("a", a, 3)
        engine.add("b", b, 3)
        engine.run()
        if name == "reload":
            assert engine.s.reset_prefix_cache()
            engine.add("c", a, 3)
            engine.run()
        elif name != "prefix":
            raise ValueError(name)
    trace = {
        "offloaded_groups": [
            g.group_idx for g in booted.offload.config.kv_group_configs
        ],
        "partial_tail": booted.offload.config.supports_partial_tail,
        "steps": [
            {
                "scheduled": st.scheduled,
                "store": {
                    str(j): job_record(booted, j, job, st.job_keys[j])
                    for j, job in st.store_jobs.items()
                },
            }
            for st in engine.steps
        ],
        "load_jobs": engine.load_jobs,
        "finished": sorted(engine.finished),
    }
    return booted, engine, trace


def _chunk_bytes() -> int:
    """CPU bytes of one chunk: one (padded) page; the groups' layers share the tensors."""
    return next(iter(layer_specs().values())).page_size_bytes


def canonical(trace: dict[str, Any]) -> dict[str, Any]:
    """The trace without job ids and CPU chunk ids, each step's jobs sorted.

    Which request's job a step builds first follows the iteration order of a set of
    request ids, which differs between processes (string hashing); job ids and the CPU
    chunks the manager hands out follow that order. GPU blocks, keys and the steps do not.
    """

    def job(j: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in j.items() if k != "dst"} | {"chunks": len(j["dst"])}

    out = dict(trace)
    out["steps"] = [
        {
            "scheduled": dict(sorted(st["scheduled"].items())),
            "store": sorted(
                (job(j) for j in st["store"].values()),
                key=lambda j: (j["req"], j["src"]),
            ),
        }
        for st in trace["steps"]
    ]
    out["load_jobs"] = sorted(
        (job(j) for j in trace["load_jobs"]), key=lambda j: (j["req"], j["src"])
    )
    return out


# -- the worker-role connector, driven as the model runner drives it -----------------


def model_runner_output(req_ids: list[str], **fields: Any) -> Any:
    """vLLM's ModelRunnerOutput for one step: 0.33.0 also wants the index of
    each request id (req_id_to_index), 0.34.0 derives it."""
    import dataclasses

    from vllm.v1.outputs import ModelRunnerOutput

    names = {f.name for f in dataclasses.fields(ModelRunnerOutput)}
    if "req_id_to_index" in names:
        fields["req_id_to_index"] = {r: i for i, r in enumerate(req_ids)}
    return ModelRunnerOutput(req_ids=req_ids, **fields)


def staging_attr() -> str:
    """What the real store handler calls its CPU staging tensors: cpu_tensors
    (vLLM 0.34.0) or dst_tensors (0.33.0), read from the release's own
    SingleDirectionOffloadingHandler, so a fake never answers a name its
    release does not have."""
    import inspect

    from vllm.v1.kv_offload.cpu.gpu_worker import SingleDirectionOffloadingHandler

    source = inspect.getsource(SingleDirectionOffloadingHandler.__init__)
    for name in ("cpu_tensors", "dst_tensors"):
        if f"self.{name} " in source or f"self.{name}:" in source:
            return name
    raise AssertionError("the store handler names its staging tensors neither way")


def gpu_blocks(gpu, refs, tensors) -> list[tuple[int, list[int]]]:
    """(group slot, GPU block ids) of a transfer's device side: vLLM 0.34.0
    passes the blocks' addresses (DevicePointers, decoded the way
    pointer_utils made them), 0.33.0 the spec's block ids."""
    out: list[tuple[int, list[int]]] = []
    i = 0
    if hasattr(gpu, "block_ids"):
        for slot, count in enumerate(gpu.group_sizes):
            out.append((slot, [int(b) for b in gpu.block_ids[i : i + int(count)]]))
            i += int(count)
        return out
    for slot, (count, nrefs) in enumerate(
        zip(gpu.group_block_counts, gpu.group_data_ref_counts, strict=True)
    ):
        t = tensors[refs[slot][0].tensor_idx] if count else None
        ptrs = gpu.ptrs[i : i + count]  # the group's first ref's blocks
        out.append(
            (
                slot,
                [(int(p) - t.data_ptr()) // t.stride(0) for p in ptrs]
                if t is not None
                else [],
            )
        )
        i += count * nrefs
    return out


class FakeTransfers:
    """Plays the CPU offloading worker: staging rows, copies, completions."""

    def __init__(self, canonical, rows: int, loads: bool = False) -> None:
        import torch

        self.gpu = [t.tensor for t in canonical.tensors]
        self.refs = canonical.group_data_refs
        self.staging = [
            torch.zeros((rows, t.page_size_bytes), dtype=torch.int8)
            for t in canonical.tensors
        ]
        self._store_handler = SimpleNamespace(**{staging_attr(): self.staging})
        self.done: list[int] = []
        self.submitted: list[int] = []
        # With loads: each (group slot, GPU block) a load wrote, in order.
        self.loads = loads
        self.loaded: list[tuple[int, int]] = []

    def _copy(self, gpu_side, cpu_spec, to_gpu: bool) -> list[tuple[int, int]]:
        """Each block's page of every ref between its GPU block and its CPU row (one
        block a chunk); the (group slot, GPU block) pairs copied."""
        rows_of = [int(c) for c in cpu_spec.block_ids]
        done, i = [], 0
        for slot, blocks in gpu_blocks(gpu_side, self.refs, self.gpu):
            for block in blocks:
                for ref in self.refs[slot]:
                    page = ref.page_size_bytes
                    rows = self.staging[ref.tensor_idx]
                    gpu = self.gpu[ref.tensor_idx]
                    if to_gpu:
                        gpu[block, :page] = rows[rows_of[i], :page]
                    else:
                        rows[rows_of[i], :page] = gpu[block, :page]
                done.append((slot, block))
                i += 1
        assert i == len(rows_of)
        return done

    def submit_store(self, job_id, src_spec, dst_spec) -> bool:
        self._copy(src_spec, dst_spec, to_gpu=False)
        self.submitted.append(job_id)
        self.done.append(job_id)
        return True

    def submit_load(self, job_id, src_spec, dst_spec, expedited=False) -> bool:
        if not self.loads:
            raise AssertionError("restore is off: no load expected")
        self.loaded += self._copy(dst_spec, src_spec, to_gpu=True)
        self.done.append(job_id)
        return True

    def get_finished(self):
        from vllm.v1.kv_offload.base import TransferResult

        done, self.done = self.done, []
        return [TransferResult(job_id, True) for job_id in done]

    def wait(self, job_ids) -> None:
        pass  # every copy is complete at submit

    def shutdown(self) -> None:
        pass


def step_worker(booted: Booted, worker: Any, finished: set[str]) -> Any:
    """One engine step as the model runner drives the worker-side connector; returns
    the step's SchedulerOutput."""
    from vllm.v1.outputs import KVConnectorOutput

    s = booted.scheduler
    out = s.schedule()
    meta = out.kv_connector_metadata
    worker.handle_preemptions(meta)
    worker.start_kv_transfers(meta)
    worker.prepare_store_kv(meta)  # this step's store jobs wait for the next step
    _, received = worker.get_finished(out.finished_req_ids)
    req_ids = list(out.num_scheduled_tokens)
    sampled = []
    for rid in req_ids:
        # schedule() has already counted this step's tokens as computed.
        req = s.requests[rid]
        sampled.append([7] if req.num_computed_tokens >= req.num_tokens else [])
    mro = model_runner_output(
        req_ids=req_ids,
        sampled_token_ids=sampled,
        kv_connector_output=KVConnectorOutput(
            finished_recving=received or None,
            kv_connector_worker_meta=worker.build_connector_worker_meta(),
        ),
    )
    for eo in s.update_from_output(out, mro).values():
        for o in eo.outputs:
            if o.finish_reason is not None:
                finished.add(o.request_id)
    return out
