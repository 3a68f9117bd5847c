#!/usr/bin/env python3
"""The engine thread's cost of the tier's write path, per store job (not a test).

Boots the patched OffloadingConnector (scheduler and worker, the tree's real
files applied with `overlay`, run through the harness on CPU) on the
`llama-big` shape of the GPU suite's pressure stage: one full-attention group
of 16 layers, blocks of 16 tokens, one block a chunk, 64 KiB pages (1 MiB a
key), vLLM's real ``CPUOffloadingManager`` over ``--rows`` staging rows and a
capture pool of ``--pool-mib``. The first capture is queued on
``HostCopy(threaded=True)`` (a copy thread standing in for the GPU's copy
engine), the writer is the native library on its own thread, writing under
``--dir``.

Each step schedules ``--jobs-per-step`` new requests of ``--keys`` blocks
(one store job each, as vLLM's scheduler makes one a request a step), then
calls what the engine thread calls: the scheduler's ``build_connector_meta``
(our side channel), the worker's ``prepare_store_kv`` (remember) and
``start_kv_transfers`` (submit, our queued capture), the DMA (played here,
not timed), ``get_finished`` (our ack hook) and ``update_connector_output``.
``--model-ms`` of pure Python per step stands in for the forward pass, so
the writer's threads contend with it for the GIL; ``--launches N`` lets the
GIL go N times a pass, as torch does around each op it dispatches, and the
pass's wall time beyond its CPU time is printed (``model_wait_s``). The
same steps run with GLM53_KV_OFFLOAD=0 (vLLM's connector alone) and 1; the
difference in the engine thread's CPU in those calls is what the tier costs
it. Also printed: the CPU of every other
thread (the writer's), the keys' fate (written, deduplicated, dropped by
reason), and with ``--profile`` the engine thread's cProfile of the
connector calls (knob 1).

usage: bench/engine_thread_bench.py [--jobs 580] [--keys 40] [--jobs-per-step 13]
    [--model-ms 20] [--launches 0] [--rows 1024] [--pool-mib 512] [--repeat 1]
    [--dir D] [--knobs 0,1] [--write-threads N] [--ablate capture|hooks]
    [--profile N] [--json F]
Needs the built `overlay` and store library (KVTIER_BUILD_DIR, default build/).
"""

from __future__ import annotations

import argparse
import cProfile
import ctypes
import hashlib
import io
import json
import os
import pstats
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "sim"))
sys.path.insert(0, str(REPO / "engine"))

import harness  # noqa: E402
import probe  # noqa: E402
from fake_offloading import FakeTransferWorker, make_spec  # noqa: E402
from hybrid_layout import OFFLOADING, HybridVllm  # noqa: E402
from trees import patched_copy  # noqa: E402

LAYERS = 16
BLOCK = 16  # tokens
PAGE = 64 << 10  # 16 tokens x 2 (K, V) x 8 heads x 128 x bf16


def build_dir() -> Path:
    return Path(os.environ.get("KVTIER_BUILD_DIR", REPO / "build")).resolve()


def engine_tree() -> Path:
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "fixtures/fetch.py"),
            "--pins",
            str(REPO / "fixtures/vllm-0.33.0/PINS"),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(done.stdout.strip())


def thread_cpu() -> dict[str, float]:
    """CPU seconds of every live Python thread, by name."""
    out = {}
    for t in threading.enumerate():
        try:
            clock = time.pthread_getcpuclockid(t.ident)
            out[t.name] = out.get(t.name, 0.0) + time.clock_gettime(clock)
        except (OSError, TypeError):
            continue
    return out


def spin(ms: float) -> None:
    """Pure Python holding the GIL for about ``ms`` ms of CPU."""
    end = time.thread_time() + ms / 1e3
    while time.thread_time() < end:
        for _ in range(200):
            pass


_LIBC = ctypes.CDLL(None)


def forward(ms: float, launches: int) -> None:
    """The forward pass: ``ms`` of Python, cut into ``launches`` kernel
    launches. torch lets the GIL go around each op it dispatches and takes
    it back after, so another thread that wants the GIL gets it there and
    the engine thread waits until that thread lets it go (at most the
    switch interval); a ctypes call stands in for the op."""
    if launches <= 0:
        spin(ms)
        return
    for _ in range(launches):
        spin(ms / launches)
        _LIBC.getpid()  # ctypes lets the GIL go around it (and yields no core)


class Bench:
    """One boot of the patched connector with the knob at ``knob``."""

    def __init__(self, ns, args, root: Path, knob: str) -> None:
        self.args = args
        self.knob = knob
        os.environ.update(
            {
                "GLM53_KV_OFFLOAD": knob,
                "GLM53_KV_OFFLOAD_DIR": str(root),
                "GLM53_KV_OFFLOAD_CPU_GB": "1",
                "GLM53_KV_OFFLOAD_KEEP_BOUNDARIES": "2",
                "GLM53_KV_OFFLOAD_CAPTURE_MIB": str(args.pool_mib),
            }
        )
        self.gpu_blocks = args.gpu_blocks
        vllm = HybridVllm(
            ns,
            block=BLOCK,
            hash_unit=BLOCK,
            num_blocks=self.gpu_blocks,
            max_model_len=4 * args.keys * BLOCK,
            model="bench/llama-big",
        )
        self.vllm = vllm
        spec = vllm.kci.FullAttentionSpec(
            block_size=BLOCK, num_kv_heads=8, head_size=128, dtype=vllm.torch.bfloat16
        )
        assert spec.page_size_bytes == PAGE, spec.page_size_bytes
        names = [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)]
        kv_cache_config = vllm.kv_cache_config((spec, False, names))
        vllm_config = vllm.vllm_config(speculative=None, layout=kv_cache_config)
        manager = ns.load("vllm.v1.kv_offload.cpu.manager")
        self.gpu = FakeTransferWorker(vllm.base)
        self.spec = make_spec(
            vllm,
            vllm.offloading_config(vllm_config, kv_cache_config),
            worker=self.gpu,
            rows=args.rows,
            manager=manager.CPUOffloadingManager(num_chunks=args.rows),
        )
        self.scheduler = vllm.scheduler.OffloadingConnectorScheduler(
            self.spec, vllm_config, kv_cache_config
        )
        self.worker = vllm.worker.OffloadingConnectorWorker(
            self.spec, vllm_config, kv_cache_config
        )
        self.store = self.worker._kv_store
        row = LAYERS * PAGE
        self.region = bytearray(args.rows * row)
        self.kv = [bytearray(self.gpu_blocks * PAGE) for _ in range(LAYERS)]
        devices = ns.load(f"{OFFLOADING}.kv_store_local.capture_device")
        self.devices = devices
        self.region_addr = devices.host_address(self.region)
        self.kv_addr = [devices.host_address(b) for b in self.kv]
        self.device = None
        if self.store is not None:
            adapter = ns.load(f"{OFFLOADING}.kv_store_local.vllm_worker")
            staging = [
                adapter.StagingTensor(self.region, i * PAGE, row, PAGE)
                for i in range(LAYERS)
            ]
            blocks = [
                devices.BlockTensor(a, PAGE, self.gpu_blocks) for a in self.kv_addr
            ]
            self.device = devices.HostCopy(threaded=True)
            real = adapter.staging_from_worker, adapter.store_stream_device
            real_pinned = adapter.pinned_memory
            adapter.staging_from_worker = lambda worker, caches: staging
            adapter.store_stream_device = lambda worker, caches: (self.device, blocks)
            adapter.pinned_memory = None
        base = vllm.base
        refs = [[base.CanonicalKVCacheRef(i, PAGE) for i in range(LAYERS)]]
        try:
            self.worker._init_worker(
                base.CanonicalKVCaches(
                    [base.CanonicalKVCacheTensor(None, PAGE) for _ in range(LAYERS)],
                    refs,
                )
            )
        finally:
            if self.store is not None:
                adapter.staging_from_worker, adapter.store_stream_device = real
                adapter.pinned_memory = real_pinned
        if self.store is not None:
            assert self.store.active, self.store.disabled_reason
            if args.ablate:
                probe.ablate(self.store, args.ablate)
            if args.write_threads:
                self.store.writer.write_threads = args.write_threads
        self.outputs = ns.load("vllm.v1.outputs")
        self.next_block = 0
        self.cpu = 0.0  # engine thread in the connector calls
        self.wall = 0.0  # and their wall time (GIL waits included)
        self.calls: dict[str, float] = {}
        self.model_wall = 0.0
        self.model_cpu = 0.0
        self.profile = cProfile.Profile() if args.profile and knob != "0" else None
        # Our hooks alone (knob 1): their CPU on this thread, by hook.
        self.ours: dict[str, float] = {}
        if self.store is not None:
            for name in ("remember", "submitted", "capture"):
                self._wrap(self.store, name)
            self._wrap(self.scheduler._kv_store_meta, "attach")

    def _wrap(self, obj, name: str) -> None:
        real = getattr(obj, name)
        ours = self.ours

        def timed(*a, **kw):
            c = time.thread_time()
            try:
                return real(*a, **kw)
            finally:
                ours[name] = ours.get(name, 0.0) + time.thread_time() - c

        setattr(obj, name, timed)

    def _timed(self, name: str, fn, *a):
        c, w = time.thread_time(), time.perf_counter()
        if self.profile is not None:
            self.profile.enable()
        try:
            return fn(*a)
        finally:
            if self.profile is not None:
                self.profile.disable()
            spent = time.thread_time() - c
            self.wall += time.perf_counter() - w
            self.cpu += spent
            self.calls[name] = self.calls.get(name, 0.0) + spent

    def _dma(self, job) -> None:
        """vLLM's store copy: GPU blocks -> staging rows (its copy engine)."""
        src = job.src_spec.block_ids.tolist()
        dst = job.dst_spec.block_ids.tolist()
        row = LAYERS * PAGE
        for b, r in zip(src, dst, strict=True):
            for i, a in enumerate(self.kv_addr):
                ctypes.memmove(
                    self.region_addr + r * row + i * PAGE, a + b * PAGE, PAGE
                )

    def step(self, n: int) -> int:
        """One engine step of ``jobs_per_step`` new prompts; the keys stored."""
        args = self.args
        vllm = self.vllm
        new = []
        for r in range(args.jobs_per_step):
            req_id = f"s{n}r{r}"
            hashes = [
                hashlib.sha256(f"{req_id}/{b}".encode()).digest()
                for b in range(args.keys)
            ]
            request = vllm.request(req_id, hashes, args.keys * BLOCK)
            # Block 0 is vLLM's null block: never a request's.
            blocks = [
                1 + (self.next_block + b) % (self.gpu_blocks - 1)
                for b in range(args.keys)
            ]
            self.next_block += args.keys
            new.append((request, blocks))
        for request, _ in new:
            self._timed("scheduler", self.scheduler.on_new_request, request)
        for request, _ in new:
            self._timed(
                "scheduler", self.scheduler.get_num_new_matched_tokens, request, 0
            )
        output = SimpleNamespace(
            scheduled_new_reqs=[
                SimpleNamespace(req_id=req.request_id, block_ids=(blocks,))
                for req, blocks in new
            ],
            scheduled_cached_reqs=SimpleNamespace(
                req_ids=[], new_block_ids=[], resumed_req_ids=set()
            ),
            kv_cache_block_copies=None,
            num_scheduled_tokens={req.request_id: req.num_tokens for req, _ in new},
            finished_req_ids=set(),
            preempted_req_ids=set(),
            kv_connector_block_state=None,
        )
        meta = self._timed("scheduler", self.scheduler.build_connector_meta, output)
        self._timed("prepare_store_kv", self.worker.prepare_store_kv, meta)
        empty = vllm.common.OffloadingConnectorMetadata(load_jobs={}, store_jobs={})
        self._timed("start_kv_transfers", self.worker.start_kv_transfers, empty)
        m0, c0 = time.perf_counter(), time.thread_time()
        forward(args.model_ms, args.launches)  # the forward pass
        self.model_wall += time.perf_counter() - m0
        self.model_cpu += time.thread_time() - c0
        for job in meta.store_jobs.values():
            self._dma(job)
        if self.store is not None:
            for job_id in self.gpu.submitted:  # the copy engine runs beside us
                queued = self.store._queued.get(job_id)
                if queued is not None:
                    queued.fence.wait()
        self.gpu.done, self.gpu.submitted = self.gpu.submitted, []
        self._timed("get_finished", self.worker.get_finished, set())
        out = self.outputs.KVConnectorOutput(
            kv_connector_worker_meta=self._timed(
                "get_finished", self.worker.build_connector_worker_meta
            )
        )
        self._timed("scheduler", self.scheduler.update_connector_output, out)
        for req, _ in new:
            self._timed("scheduler", self.scheduler.request_finished, req)
        return sum(len(j.src_spec.block_ids) for j in meta.store_jobs.values())


def run(ns, args, root: Path, knob: str) -> dict:
    bench = Bench(ns, args, root, knob)
    try:
        return measure(bench, args, knob)
    finally:
        bench.worker.shutdown()  # the writer stops before its store goes
        if bench.device is not None:
            bench.device.close()


def measure(bench: Bench, args, knob: str) -> dict:
    steps = -(-args.jobs // args.jobs_per_step)
    warm = max(1, steps // 10)
    before_threads: dict[str, float] = {}
    usage0 = None
    keys = 0
    for n in range(steps + warm):
        if n == warm:  # the first steps fault in pages and build tables
            bench.cpu = 0.0
            bench.calls.clear()
            bench.ours.clear()
            bench.model_wall = bench.wall = bench.model_cpu = 0.0
            if bench.profile is not None:
                bench.profile = cProfile.Profile()
            before_threads = thread_cpu()
            usage0 = resource.getrusage(resource.RUSAGE_SELF)
            wall0 = time.perf_counter()
            keys = 0
        keys += bench.step(n)
    loop_wall = time.perf_counter() - wall0
    store = bench.store
    drained = True
    if store is not None:
        drained = store.writer.wait_idle(600)
    after_threads = thread_cpu()
    usage1 = resource.getrusage(resource.RUSAGE_SELF)
    me = threading.current_thread().name
    others = {
        name: round(cpu - before_threads.get(name, 0.0), 3)
        for name, cpu in after_threads.items()
        if name != me and cpu - before_threads.get(name, 0.0) > 0.0005
    }
    process = (usage1.ru_utime + usage1.ru_stime) - (usage0.ru_utime + usage0.ru_stime)
    jobs = steps * args.jobs_per_step
    out = {
        "knob": knob,
        "jobs": jobs,
        "keys": keys,
        "keys_per_job": round(keys / jobs, 1),
        "engine_cpu_s": round(bench.cpu, 4),
        "engine_us_per_job": round(1e6 * bench.cpu / jobs, 1),
        "engine_us_per_key": round(1e6 * bench.cpu / keys, 2),
        "engine_cpu_by_call_s": {k: round(v, 4) for k, v in bench.calls.items()},
        # Inside those calls, our hooks (the scheduler's side channel, the
        # worker's remember / submitted / capture), timed on their own.
        "hooks_cpu_s": {k: round(v, 4) for k, v in bench.ours.items()},
        "hooks_us_per_job": round(1e6 * sum(bench.ours.values()) / jobs, 1),
        "hooks_us_per_key": round(1e6 * sum(bench.ours.values()) / keys, 2),
        "calls_wall_s": round(bench.wall, 3),
        "model_wall_s": round(bench.model_wall, 3),
        # The forward pass's wall beyond its CPU: waiting for the GIL (and
        # for a core, on a loaded machine).
        "model_wait_s": round(bench.model_wall - bench.model_cpu, 3),
        # What the engine's step would take without the DMA: our calls and
        # the forward pass (both slowed by threads taking the GIL).
        "step_wall_s": round(bench.wall + bench.model_wall, 3),
        "loop_wall_s": round(loop_wall, 3),
        "other_threads_cpu_s": others,
        "other_python_threads_cpu_s": round(sum(others.values()), 3),
        "process_cpu_s": round(process, 3),
        "writer_drained": drained,
    }
    if store is not None:
        s = store.stats
        out["stats"] = {
            k: getattr(s, k)
            for k in (
                "jobs_captured",
                "jobs_queued_on_device",
                "keys_captured",
                "keys_written",
                "keys_deduplicated",
                "keys_recaptured",
                "keys_recaptured_writer",
                "keys_recaptured_last_chance",
                "keys_lost",
                "keys_lost_last_chance_bound",
                "keys_dropped_budget",
                "manifests_published",
                "capture_fence_waits",
            )
        }
        out["stats"]["capture_seconds"] = round(s.capture_seconds, 4)
        out["stats"]["last_chance_seconds"] = round(s.last_chance_seconds, 4)
        out["drops"] = s.drops()
    if bench.profile is not None:
        text = io.StringIO()
        stats = pstats.Stats(bench.profile, stream=text)
        stats.sort_stats("tottime").print_stats(args.profile)
        out["profile"] = text.getvalue()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=580)
    ap.add_argument("--keys", type=int, default=40, help="blocks (keys) a job")
    ap.add_argument("--jobs-per-step", type=int, default=13)
    ap.add_argument("--model-ms", type=float, default=20.0)
    ap.add_argument(
        "--launches",
        type=int,
        default=0,
        help="let the GIL go this many times a forward pass, as torch's ops do (0: never)",
    )
    ap.add_argument("--rows", type=int, default=1024, help="CPU tier rows (1 MiB)")
    ap.add_argument("--pool-mib", type=int, default=512)
    ap.add_argument("--gpu-blocks", type=int, default=600)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--knobs", default="0,1")
    ap.add_argument(
        "--repeat", type=int, default=1, help="alternating rounds; medians printed"
    )
    ap.add_argument("--profile", type=int, default=0, help="top N functions")
    ap.add_argument(
        "--write-threads",
        type=int,
        default=0,
        help="the store library's threads a write call (0: the writer's default)",
    )
    ap.add_argument(
        "--ablate",
        choices=("capture", "hooks"),
        default=None,
        help="knob 1 with the writer ablated as the GPU suite's TURNS_REF_ABLATE does",
    )
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    os.environ.setdefault(
        "KVTIER_STORE_LIB", str(build_dir() / "storeio" / "libkvtier_store.so")
    )
    work = Path(args.dir or tempfile.mkdtemp(prefix="kvengine-"))
    try:
        tree = work / "tree"
        # Applied afresh each time: a tree left by an earlier call would hold
        # that call's overlay files.
        shutil.rmtree(tree, ignore_errors=True)
        patched_copy(
            build_dir() / "patcher" / "overlay",
            engine_tree(),
            tree,
            REPO / "anchors" / "vllm-0.33.0",
            "kv-offload-scope,kv-offload-store-local",
        )
        results = []
        knobs = args.knobs.split(",")
        with harness.engine(tree / "site-packages", package="vllm") as ns:
            for n in range(args.repeat):
                # Alternate the order (off on, on off, ...): a drift cancels.
                for knob in knobs if n % 2 == 0 else knobs[::-1]:
                    root = work / f"store-{knob}"
                    shutil.rmtree(root, ignore_errors=True)
                    root.mkdir()
                    try:
                        r = run(ns, args, root, knob)
                    finally:
                        # Gigabytes a run: the next would fill a small disk.
                        shutil.rmtree(root, ignore_errors=True)
                    profile = r.pop("profile", None)
                    print(json.dumps(r), flush=True)
                    if profile:
                        print(profile, flush=True)
                    results.append(r)
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)
    runs = {k: [r for r in results if r["knob"] == k] for k in knobs}
    if runs.get("0") and runs.get("1"):
        off, on = runs["0"], runs["1"]

        def med(rs, key):
            return statistics.median(r[key] for r in rs)

        jobs = on[0]["jobs"]
        extra = med(on, "engine_cpu_s") - med(off, "engine_cpu_s")
        print(
            f"medians of {len(on)}: engine thread in the connector calls, {jobs} "
            f"jobs of {on[0]['keys_per_job']} keys: off "
            f"{med(off, 'engine_us_per_job')} us/job, on "
            f"{med(on, 'engine_us_per_job')} us/job (the tier adds "
            f"{1e6 * extra / jobs:.0f} us a job); our hooks alone "
            f"{med(on, 'hooks_us_per_job')} us a job, "
            f"{med(on, 'hooks_us_per_key')} us a key; step wall on/off "
            f"{med(on, 'step_wall_s') / med(off, 'step_wall_s'):.3f}; other Python "
            f"threads {med(on, 'other_python_threads_cpu_s')} s CPU for "
            f"{statistics.median(r['stats']['keys_written'] for r in on)} keys "
            f"written; process {med(on, 'process_cpu_s')} s (off "
            f"{med(off, 'process_cpu_s')} s)"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
