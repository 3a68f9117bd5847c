#!/usr/bin/env python3
"""The engine thread's cost of the first capture, per store job (not a test).

Drives kv_store_local.WorkerStore's hooks the way vLLM 0.33.0's connector
calls them (remember, vLLM's store submit, our ``submitted``, the job's
completion, ``capture`` before the ack) on the `llama-big` shape of the GPU
suite's pressure stage (16 layers, 64 KiB pages: 1 MiB a key), and prints the
CPU seconds of the calling thread in those hooks per job, for

- ``staging``: the first capture copied out of staging before the ack (the
  path runs 3 and 6-8 measured, and the fallback without a device);
- ``device``: the first capture queued on the capture device. With CUDA the
  KV blocks are GPU tensors and the device is ``vllm_worker.StoreStreamDevice``
  over a stand-in for vLLM's transfer handler (one stream per job, its store
  copy and events as vLLM queues them, cudaMemcpyAsync for its batched copy
  op); without CUDA the blocks are host memory and the device is
  ``HostCopy(threaded=True)`` (a copy thread standing in for the copy engine).

The writer releases each job unwritten (as the suite's pressure.capture), so
only the capture side is measured; then one more pass writes the jobs, with
the KV blocks and staging overwritten right after each ack, and checks every
file's payload against the bytes the blocks held.

usage: bench/capture_bench.py [--jobs 100] [--keys 40] [--dir D] [--json F]
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "sim"))

from overlay_modules import ksl, kv_offload_knobs  # noqa: E402

try:
    import torch
except ImportError:
    torch = None

LAYERS = 16
PAGE = 64 << 10  # llama-big: 16 tokens x 2 x 8 heads x 128 x bf16


def cuda() -> bool:
    return torch is not None and torch.cuda.is_available()


class CudaRuntime:
    """cudaMemcpyAsync through ctypes: the stand-in for vLLM's batched op."""

    def __init__(self) -> None:
        # torch's own runtime first: the streams are its handles.
        base = Path(torch.__file__).parents[1] / "nvidia"
        names = [str(p) for p in sorted(base.glob("*/lib/libcudart.so*"))]
        names += ["libcudart.so", "libcudart.so.13", "libcudart.so.12"]
        self.lib = None
        for name in names:
            try:
                self.lib = ctypes.CDLL(name)
                break
            except OSError:
                continue
        assert self.lib is not None, "no libcudart"
        self.lib.cudaMemcpyAsync.argtypes = [
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int,
            ctypes.c_void_p,
        ]

    # CPU seconds spent in swap: vLLM's op is one driver call
    # (cuMemcpyBatchAsync), this stand-in one ctypes call a move, so the
    # figures below leave its time inside our hook out.
    cpu_seconds = 0.0

    def swap(self, src, dst, sizes, is_src_access_order_any=False) -> None:
        start = time.thread_time()
        try:
            self._swap(src, dst, sizes)
        finally:
            CudaRuntime.cpu_seconds += time.thread_time() - start

    def _swap(self, src, dst, sizes) -> None:
        stream = torch.cuda.current_stream().cuda_stream
        for s, d, n in zip(src.tolist(), dst.tolist(), sizes.tolist(), strict=True):
            rc = self.lib.cudaMemcpyAsync(d, s, n, 4, stream)  # cudaMemcpyDefault
            assert rc == 0, rc


class StandInHandler:
    """What StoreStreamDevice reads of vLLM's GPU->CPU handler: a stream and
    two events per job, the job's copy after the compute stream and after
    the previous job, ``_transfers`` in submission order."""

    gpu_to_cpu = True

    def __init__(self, runtime: CudaRuntime) -> None:
        self._transfers: deque = deque()
        self._swap_blocks_batch = runtime.swap

    def transfer_async(self, job_id: int, moves) -> None:
        stream = torch.cuda.Stream()
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        stream.wait_stream(torch.cuda.current_stream())
        if self._transfers:
            stream.wait_event(self._transfers[-1].end_event)
        t = [
            torch.frombuffer(a, dtype=torch.int64)
            for a in (moves.src, moves.dst, moves.size)
        ]
        with torch.cuda.stream(stream):
            start.record(stream)
            self._swap_blocks_batch(*t)
            end.record(stream)
        self._transfers.append(
            SimpleNamespace(
                job_id=job_id,
                stream=stream,
                start_event=start,
                end_event=end,
                t=(t, moves),
            )
        )

    def get_finished(self) -> list[int]:
        done = []
        while self._transfers and self._transfers[0].end_event.query():
            done.append(self._transfers.popleft().job_id)
        return done


class Rig:
    """KV blocks, staging rows and a WorkerStore over them."""

    def __init__(self, root: Path, mode: str, blocks: int, rows: int, budget: int):
        self.mode = mode
        self.gpu = cuda()
        self.blocks = blocks
        self.rows = rows
        if self.gpu:
            self.kv = [
                torch.zeros((blocks, PAGE), dtype=torch.int8, device="cuda")
                for _ in range(LAYERS)
            ]
            self.staging_t = torch.zeros(
                (rows, LAYERS * PAGE), dtype=torch.int8, pin_memory=True
            )
            kv_tensors = [
                ksl.capture_device.BlockTensor(t.data_ptr(), PAGE, blocks)
                for t in self.kv
            ]
            staging_addr = self.staging_t.data_ptr()
            self.region = (ctypes.c_char * (rows * LAYERS * PAGE)).from_address(
                staging_addr
            )
        else:
            self.kv = [bytearray(blocks * PAGE) for _ in range(LAYERS)]
            kv_tensors = [
                ksl.capture_device.BlockTensor(
                    ksl.capture_device.host_address(b), PAGE, blocks
                )
                for b in self.kv
            ]
            self.region = bytearray(rows * LAYERS * PAGE)
            staging_addr = ksl.capture_device.host_address(self.region)
        self.staging_addr = staging_addr
        self.kv_addr = [t.address for t in kv_tensors]
        staging = [
            ksl.layout.StagingTensor(self.region, i * PAGE, LAYERS * PAGE, PAGE)
            for i in range(LAYERS)
        ]
        group = ksl.layout.GroupLayout(
            0,
            0,
            "full",
            tuple(ksl.layout.LayerLayout(i, PAGE, (), i) for i in range(LAYERS)),
        )
        settings = ksl.worker_store.WorkerSettings(
            model="bench/llama-big",
            vllm_version="0.33.0",
            kv_dtype="bfloat16",
            hash_algorithm="sha256",
            num_speculative_tokens=0,
            tp_size=1,
            config_rank=0,
            blocks_per_chunk=1,
            groups=[group],
        )
        knobs = kv_offload_knobs.Knobs(
            enabled=True,
            root=str(root),
            cpu_gb=None,
            drafter=False,
            keep_boundaries=2,
            build_id="bench",
        )
        self.store = ksl.worker_store.WorkerStore(
            knobs, settings, tp=lambda: (0, 1), capture_budget=budget
        )
        device, allocate = None, None
        self.handler = StandInHandler(CudaRuntime()) if self.gpu else None
        if mode == "device":
            if self.gpu:
                import kv_store_local.vllm_worker as vw

                device = vw.StoreStreamDevice(self.handler)
                allocate = vw.pinned_memory
            else:
                device = ksl.capture_device.HostCopy(threaded=True)
        self.store.start(
            staging, True, blocks=kv_tensors, device=device, allocate=allocate
        )
        self.writer = self.store.writer

    def compute(self, blocks: list[int], seed: int) -> None:
        """The forward pass writes these blocks' KV."""
        for i, layer in enumerate(self.kv):
            for b in blocks:
                value = (seed * 31 + b * 7 + i) % 251 + 1
                if self.gpu:
                    layer[b].fill_(value if value < 128 else value - 256)
                else:
                    layer[b * PAGE : (b + 1) * PAGE] = bytes([value]) * PAGE

    def expected(self, block: int, seed: int) -> bytes:
        return b"".join(
            bytes([(seed * 31 + block * 7 + i) % 251 + 1]) * PAGE for i in range(LAYERS)
        )

    def store_copy(self, job_id: int, blocks: list[int], rows: list[int]) -> None:
        """vLLM's store copy of the job (GPU blocks -> staging rows)."""
        moves = ksl.capture_device.Moves()
        for i in range(LAYERS):
            for b, r in zip(blocks, rows, strict=True):
                src = self.kv_addr[i] + b * PAGE
                moves.add(src, self.staging_addr + r * LAYERS * PAGE + i * PAGE, PAGE)
        if self.handler is not None:
            self.handler.transfer_async(job_id, moves)
        else:
            ksl.capture_device.copy_moves(moves)

    def finished(self, job_id: int) -> None:
        """The job's store copy completed (vLLM's get_finished). On CUDA its
        end event covers our copy; the host copy thread is waited for here
        to match (a copy engine runs beside the CPU)."""
        if self.handler is not None:
            while job_id not in self.handler.get_finished():
                time.sleep(0)
            return
        queued = self.store._queued.get(job_id)
        if queued is not None:
            queued.fence.wait()


def job_entry(job_id: int, blocks: list[int], rows: list[int], seed: int):
    keys = [
        hashlib.sha256(f"{seed}:{b}".encode()).digest() + (0).to_bytes(4, "big")
        for b in blocks
    ]
    meta = {
        "version": ksl.side_channel.META_VERSION,
        "keys": keys,
        "groups": [0] * len(keys),
        "tokens": [16 * (i + 1) for i in range(len(keys))],
        "candidates": [],
    }
    return SimpleNamespace(
        src_spec=SimpleNamespace(
            group_sizes=[len(blocks)], block_indices=[0], block_ids=list(blocks)
        ),
        dst_spec=SimpleNamespace(block_ids=list(rows)),
        kv_store_meta=meta,
    )


def run(mode: str, root: Path, jobs: int, keys: int, write: bool) -> dict:
    blocks = 4 * keys
    rig = Rig(root, mode, blocks=blocks, rows=2 * keys, budget=(2 * keys + 8) << 20)
    store = rig.store
    if not write:
        writer = rig.writer

        def release(job) -> None:  # capture only: free each key unwritten
            for item in job.keys:
                writer._free(item)

        writer.process = release
    hook_cpu: list[float] = []
    hook_wall: list[float] = []
    stand_ins: list[float] = []
    wrong = missing = 0
    kept = []
    for j in range(jobs):
        base = (j % 4) * keys
        blk = list(range(base, base + keys))
        rows = [((j % 2) * keys) + i for i in range(keys)]
        rig.compute(blk, j)
        entry = job_entry(j, blk, rows, j)
        c0, w0 = time.thread_time(), time.perf_counter()
        store.remember(j, entry)
        c1, w1 = time.thread_time(), time.perf_counter()
        rig.store_copy(j, blk, rows)  # vLLM's, not ours
        c2, w2 = time.thread_time(), time.perf_counter()
        stand_in = CudaRuntime.cpu_seconds
        store.submitted(j)
        c3, w3 = time.thread_time(), time.perf_counter()
        stand_in = CudaRuntime.cpu_seconds - stand_in  # not ours (see swap)
        c3 -= stand_in
        w3 -= stand_in
        rig.finished(j)
        c4, w4 = time.thread_time(), time.perf_counter()
        store.capture(j)
        c5, w5 = time.thread_time(), time.perf_counter()
        hook_cpu.append((c1 - c0) + (c3 - c2) + (c5 - c4))
        hook_wall.append((w1 - w0) + (w3 - w2) + (w5 - w4))
        stand_ins.append(stand_in)
        if write:
            kept.append((entry.kv_store_meta["keys"], blk, j))
            # vLLM may now reuse the blocks (the rows: only for a later
            # store job, which remember sees first, as the next jobs do).
            rig.compute(blk, j + 10_000)
            if rig.gpu:
                torch.cuda.synchronize()
    assert rig.writer.wait_idle(300)
    if write:
        for ks, blk, seed in kept:
            for k, b in zip(ks, blk, strict=True):
                path = Path(rig.writer.layout.chunk(k[:-4].hex(), 0))
                if not path.exists():
                    missing += 1  # dropped and its row reused: counted as lost
                    continue
                wrong += not path.read_bytes().endswith(rig.expected(b, seed))
    stats = store.stats
    store.shutdown()
    n = len(hook_cpu)
    steady = sorted(hook_cpu[n // 10 :])  # after the first jobs (warm-up)
    wall = sorted(hook_wall[n // 10 :])
    return {
        "mode": mode,
        "cuda": rig.gpu,
        "jobs": n,
        "keys_per_job": keys,
        "MiB_per_job": keys * LAYERS * PAGE / (1 << 20),
        "hook_cpu_ms_per_job_mean": round(1e3 * sum(steady) / len(steady), 3),
        "hook_cpu_ms_per_job_p50": round(1e3 * steady[len(steady) // 2], 3),
        "hook_cpu_ms_per_job_max": round(1e3 * steady[-1], 3),
        "hook_cpu_s_total": round(sum(hook_cpu), 3),
        "hook_wall_ms_per_job_mean": round(1e3 * sum(wall) / len(wall), 3),
        "hook_wall_ms_per_job_max": round(1e3 * wall[-1], 3),
        "stand_in_swap_ms_per_job_left_out": round(1e3 * sum(stand_ins) / n, 3),
        "capture_seconds": round(stats.capture_seconds, 3),
        "jobs_queued_on_device": stats.jobs_queued_on_device,
        "capture_fence_waits": stats.capture_fence_waits,
        "keys_captured": stats.keys_captured,
        "keys_dropped_budget": stats.keys_dropped_budget,
        "keys_written": stats.keys_written,
        "files_wrong": wrong if write else None,
        "files_missing": missing if write else None,
        "keys_lost": stats.keys_lost + stats.keys_lost_last_chance_bound,
        "keys_recaptured": stats.keys_recaptured,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=100)
    ap.add_argument("--keys", type=int, default=40, help="keys (1 MiB each) a job")
    ap.add_argument("--dir", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    root = Path(args.dir or tempfile.mkdtemp(prefix="kvcap-"))
    out = {
        "host": platform.node(),
        "python": platform.python_version(),
        "torch": getattr(torch, "__version__", None),
        "cuda": cuda(),
        "cores": os.cpu_count(),
        "runs": [],
    }
    for mode in ("staging", "device"):
        for write in (False, True):
            d = root / f"{mode}-{int(write)}"
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir(parents=True)
            jobs = args.jobs if not write else max(4, args.jobs // 10)
            r = run(mode, d, jobs, args.keys, write)
            r["written"] = write
            out["runs"].append(r)
            print(json.dumps(r), flush=True)
    by = {(r["mode"], r["written"]): r for r in out["runs"]}
    s, d = by[("staging", False)], by[("device", False)]
    print(
        f"engine thread in the capture hooks per job of {s['MiB_per_job']:.0f} MiB "
        f"({'CUDA' if out['cuda'] else 'CPU, HostCopy threaded'}): staging "
        f"{s['hook_wall_ms_per_job_mean']} ms wall / {s['hook_cpu_ms_per_job_mean']} "
        f"ms CPU, device {d['hook_wall_ms_per_job_mean']} ms wall / "
        f"{d['hook_cpu_ms_per_job_mean']} ms CPU "
        f"({d['hook_wall_ms_per_job_mean'] / s['hook_wall_ms_per_job_mean']:.2f}x "
        f"wall); files wrong: staging {by[('staging', True)]['files_wrong']}, "
        f"device {by[('device', True)]['files_wrong']}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    bad = by[("staging", True)]["files_wrong"] or by[("device", True)]["files_wrong"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
