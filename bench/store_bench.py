#!/usr/bin/env python3
"""Store-local writer benchmark: prints figures and ratios (not a test).

Lays out a staging region like vLLM 0.33.0's SharedOffloadRegion (a shared
/dev/shm mmap, rows of every worker's slot, pinned by cudaHostRegister when
CUDA is there), fills it from real GPU tensors (or host memory on a CPU-only
machine) the way the offload DMA does, and drives kv_store_local on it:

1. capture: the serving-path copy out of staging, per MiB, against a plain
   memmove of the same bytes (and torch copy_ when torch is present);
   target: within 1.5x of plain memcpy;
2. writer: sustained GB/s of header + payload + fsync + rename + dir fsync
   (through the native store library, KVTIER_STORE_LIB, as in the engine),
   against a plain sequential write + fsync of the same bytes to the same
   disk; target: at least 0.8x;
3. budget under pressure: a burst larger than the capture budget with the
   writer thread running: what is captured, what is dropped, capture latency;
4. verify: `kvstore verify` on the result (or the Python codec if no kvstore).

The layout mimics the deployment: a full-attention group of 22 layers
(27,163,136-byte chunk payloads) and four state groups of 16 layers with a
conv/temporal split. usage: bench/store_bench.py [--dir D] [--kvstore BIN]
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import mmap
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "sim"))

from overlay_modules import chunk_fmt, fmt, hybrid_groups, ksl, kv_offload_knobs  # noqa: E402

try:
    import torch
except ImportError:
    torch = None

MiB = 1 << 20
FULL_LAYERS = 22
FULL_PAGE = 1_234_688  # real bytes per layer and block: 22 x = 27,163,136
STATE_LAYERS = 16
CONV = ksl.layout.StatePart("bfloat16", (4, 12288))
TEMPORAL = ksl.layout.StatePart("float32", (16, 128, 128))
STATE_GROUPS = (2, 3, 4, 5)
TOKENS_PER_CHUNK = 3584


def round_up(n: int, k: int) -> int:
    return -(-n // k) * k


class Region:
    """A SharedOffloadRegion look-alike: /dev/shm file, MAP_SHARED, rows."""

    def __init__(self, rows: int, world: int, rank: int, pin: bool) -> None:
        self.page = round_up(max(FULL_PAGE, CONV.nbytes + TEMPORAL.nbytes), 4096)
        self.tensors = max(FULL_LAYERS, STATE_LAYERS)
        self.slot = self.tensors * self.page
        self.row_stride = round_up(self.slot * world, mmap.PAGESIZE)
        self.rows = rows
        self.rank = rank
        self.size = rows * self.row_stride
        self.path = f"/dev/shm/kvtier_store_bench_{os.getpid()}.mmap"
        fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        os.ftruncate(fd, self.size)
        self.mmap = mmap.mmap(fd, self.size, flags=mmap.MAP_SHARED)
        os.close(fd)
        os.unlink(self.path)
        try:  # pre-fault like the region does; older kernels: touch pages
            self.mmap.madvise(getattr(mmap, "MADV_POPULATE_WRITE", 23), 0, self.size)
        except OSError:
            for off in range(0, self.size, mmap.PAGESIZE):
                self.mmap[off] = 0
        self.pinned = False
        if torch is not None:
            self.flat = torch.frombuffer(self.mmap, dtype=torch.uint8)
            if pin and torch.cuda.is_available():
                err = torch.cuda.cudart().cudaHostRegister(
                    self.flat.data_ptr(), self.size, 0
                )
                self.pinned = int(err) == 0
        else:
            self.flat = self.mmap
        self.address = ctypes.addressof(ctypes.c_char.from_buffer(self.mmap))

    def staging(self) -> list[ksl.layout.StagingTensor]:
        return [
            ksl.layout.StagingTensor(
                self.flat,
                self.rank * self.slot + i * self.page,
                self.row_stride,
                self.page,
            )
            for i in range(self.tensors)
        ]

    def close(self) -> None:
        if self.pinned:
            torch.cuda.cudart().cudaHostUnregister(self.flat.data_ptr())


def group_layouts() -> list[ksl.layout.GroupLayout]:
    return hybrid_groups(FULL_LAYERS, FULL_PAGE, STATE_LAYERS, CONV, TEMPORAL)


class Filler:
    """Writes keys' real bytes into staging rows like the offload DMA."""

    def __init__(self, region: Region, device: str) -> None:
        self.region = region
        self.device = device
        self.gpu = None
        if device == "cuda":
            # One GPU KV tensor per layer slot, 8 blocks of random bytes.
            self.gpu = [
                torch.randint(
                    -128, 127, (8, region.page), dtype=torch.int8, device="cuda"
                )
                for _ in range(region.tensors)
            ]
        self.host = os.urandom(region.page)

    def dma(self, row: int, group: ksl.layout.GroupLayout, block: int) -> None:
        r = self.region
        for layer in group.layers:
            start = row * r.row_stride + r.rank * r.slot + layer.tensor * r.page
            if self.gpu is not None:
                dst = r.flat[start : start + layer.real_bytes].view(torch.int8)
                dst.copy_(
                    self.gpu[layer.tensor][block % 8, : layer.real_bytes],
                    non_blocking=True,
                )
            else:
                r.mmap[start : start + layer.real_bytes] = self.host[: layer.real_bytes]
        if self.gpu is not None:
            torch.cuda.synchronize()


def key_hash(i: int, branch: int) -> bytes:
    return hashlib.sha256(f"{branch}:{i}".encode()).digest()


class Workload:
    """Boundaries of conversations: full chunks 0..b, then four state payloads."""

    def __init__(self, region: Region, filler: Filler) -> None:
        self.region = region
        self.filler = filler
        self.layouts = {g.group: g for g in group_layouts()}
        self.row = 0
        self.job = 0

    def jobs(self, branch: int, first: int, last: int):
        keys = [(key_hash(i, branch), 0, i) for i in range(first, last + 1)]
        yield self._job(keys, [len(keys), 0, 0, 0, 0], [first, 0, 0, 0, 0], None)
        chain = [key_hash(i, branch) for i in range(last + 1)]
        for g in STATE_GROUPS:
            sizes = [0] * 5
            sizes[self.layouts[g].slot] = 1
            indices = [0] * 5
            indices[self.layouts[g].slot] = last
            candidate = {
                "boundary": (last + 1) * TOKENS_PER_CHUNK,
                "chunk_tokens": TOKENS_PER_CHUNK,
                "chain": chain,
                "full": [0],
                "state": list(STATE_GROUPS),
            }
            yield self._job(
                [(key_hash(last, branch), g, last)], sizes, indices, candidate
            )

    def _job(self, keys, sizes, indices, candidate):
        rows = []
        for _, group, index in keys:
            row = self.row % self.region.rows
            self.row += 1
            self.filler.dma(row, self.layouts[group], index)
            rows.append(row)
        meta = {
            "version": ksl.side_channel.META_VERSION,
            "keys": [h + g.to_bytes(4, "big") for h, g, _ in keys],
            "groups": [g for _, g, _ in keys],
            "tokens": [(i + 1) * TOKENS_PER_CHUNK for _, _, i in keys],
            "candidates": [candidate] if candidate else [],
        }
        entry = ksl.worker_store.Remembered(rows, sizes, indices, meta)
        self.job += 1
        return self.job, entry, sum(self.layouts[g].block_bytes for _, g, _ in keys)


def open_store(
    root: Path, region: Region, budget: int, engine: str, threads: int, background: bool
) -> ksl.worker_store.WorkerStore:
    settings = ksl.worker_store.WorkerSettings(
        model="bench/GLM-like",
        vllm_version="bench",
        kv_dtype="bfloat16",
        hash_algorithm="sha256",
        num_speculative_tokens=1,
        tp_size=2,
        config_rank=region.rank,
        blocks_per_chunk=1,
        groups=group_layouts(),
        mamba_types={g: "bench" for g in STATE_GROUPS},
    )
    knobs = kv_offload_knobs.Knobs(True, str(root), None, False, 2, "bench")
    store = ksl.worker_store.WorkerStore(
        knobs,
        settings,
        tp=lambda: (region.rank, 2),
        capture_budget=budget,
        copy_engine=engine,
        copy_threads=threads,
    )
    store.start(region.staging(), background=background)
    return store


def capture_job(store: ksl.worker_store.WorkerStore, job_id: int, entry) -> float:
    store._remembered[job_id] = entry
    start = time.perf_counter()
    store.capture(job_id)
    return time.perf_counter() - start


def plain_memcpy(region: Region, nbytes: int, repeat: int) -> float:
    """Seconds for one memmove of nbytes out of the staging region (best of)."""
    dst = bytearray(nbytes)
    dst_addr = ctypes.addressof(ctypes.c_char.from_buffer(dst))
    ctypes.memset(dst_addr, 0, nbytes)
    best = float("inf")
    n = min(nbytes, region.size)
    for _ in range(repeat):
        start = time.perf_counter()
        done = 0
        while done < nbytes:
            step = min(n, nbytes - done)
            ctypes.memmove(dst_addr + done, region.address, step)
            done += step
        best = min(best, time.perf_counter() - start)
    return best


def torch_copy(region: Region, nbytes: int, repeat: int) -> float | None:
    if torch is None:
        return None
    n = min(nbytes, region.size)
    dst = torch.empty(n, dtype=torch.uint8)
    dst.fill_(0)
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        done = 0
        while done < nbytes:
            step = min(n, nbytes - done)
            dst[:step].copy_(region.flat[:step])
            done += step
        best = min(best, time.perf_counter() - start)
    return best


def plain_files(directory: Path, payloads: list[memoryview]) -> float:
    """The same bytes as one file per chunk, each fsynced; seconds."""
    start = time.perf_counter()
    for i, p in enumerate(payloads):
        fd = os.open(directory / f"plain{i}.bin", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            ksl.durable_io.write_all(fd, p)
            os.fsync(fd)
        finally:
            os.close(fd)
    elapsed = time.perf_counter() - start
    for i in range(len(payloads)):
        (directory / f"plain{i}.bin").unlink()
    return elapsed


def plain_write(directory: Path, payloads: list[memoryview]) -> float:
    """Sequential write of the same bytes into one file, fsync; seconds."""
    path = directory / "plain.bin"
    start = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for p in payloads:
            ksl.durable_io.write_all(fd, p)
        os.fsync(fd)
    finally:
        os.close(fd)
    elapsed = time.perf_counter() - start
    path.unlink()
    return elapsed


def verify(root: Path, kvstore: str | None) -> dict:
    note = None
    if kvstore and os.access(kvstore, os.X_OK):
        start = time.perf_counter()
        done = subprocess.run(
            [kvstore, "verify", "--json", str(root)],
            check=False,
            capture_output=True,
            text=True,
        )
        if done.stdout.strip().startswith("{"):
            report = json.loads(done.stdout)
            return {
                "tool": "kvstore verify",
                "exit": done.returncode,
                "summary": report.get("summary"),
                "seconds": time.perf_counter() - start,
            }
        note = f"kvstore did not run (exit {done.returncode}): {done.stderr[:200]}"
    problems = 0
    chunks = manifests = 0
    for base in root.iterdir():
        if not base.is_dir():
            continue
        for p in base.rglob("*.bin"):
            chunk_fmt.verify_chunk_file(str(p))
            chunks += 1
        mdir = base / fmt.MANIFEST_DIR
        for p in mdir.iterdir():
            if not p.name.endswith(".json"):
                continue
            m = fmt.decode_manifest(p.read_bytes())
            manifests += 1
            for g in m.groups:
                for e in g.entries:
                    if not (base / fmt.chunk_rel_path(e.key, g.group)).is_file():
                        problems += 1
    return {
        "tool": "python codec (no kvstore binary)",
        "note": note,
        "chunks": chunks,
        "manifests": manifests,
        "problems": problems,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/tmp/kvtier-store-bench")
    ap.add_argument("--kvstore", default=str(REPO / "build" / "kvstore" / "kvstore"))
    ap.add_argument("--rows", type=int, default=40, help="staging rows (chunks)")
    ap.add_argument("--boundaries", type=int, default=6)
    ap.add_argument("--chunks-per-boundary", type=int, default=4)
    ap.add_argument("--threads", type=int, default=min(8, os.cpu_count() or 1))
    ap.add_argument("--pressure-budget-mib", type=int, default=256)
    ap.add_argument("--json", help="also write the figures here")
    ap.add_argument(
        "--drain-each-boundary",
        action="store_true",
        help="drain the writer after every boundary (the earlier method)",
    )
    args = ap.parse_args()

    device = "cuda" if torch is not None and torch.cuda.is_available() else "cpu"
    root = Path(args.dir)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    region = Region(args.rows, world=2, rank=1, pin=device == "cuda")
    filler = Filler(region, device)
    out: dict = {
        "host": platform.node(),
        "python": platform.python_version(),
        "torch": getattr(torch, "__version__", None),
        "torch_threads": torch.get_num_threads() if torch is not None else None,
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "store_library": fmt.native.load().path,
        "drain_each_boundary": args.drain_each_boundary,
        "staging": {
            "bytes": region.size,
            "row_stride": region.row_stride,
            "pinned": region.pinned,
            "rows": region.rows,
        },
    }

    # 1 + 2: capture everything of a round into a large budget, then write it.
    engines = ["memmove"] + (["torch"] if torch is not None else [])
    results = {}
    layouts = {g.group: g for g in group_layouts()}
    per_boundary = args.chunks_per_boundary * layouts[0].block_bytes + sum(
        layouts[g].block_bytes for g in STATE_GROUPS
    )
    # Sustained rate: everything captured first, then one drain of the full
    # queue (the writer's steady state when it is behind). With
    # --drain-each-boundary the queue is drained after every boundary (how
    # earlier figures were taken: the pipeline empties 8 times).
    budget = (
        1 << 30
        if args.drain_each_boundary
        else per_boundary * args.boundaries + (64 << 20)
    )
    for engine in engines:
        wl = Workload(region, filler)
        store = open_store(root / engine, region, budget, engine, args.threads, False)
        writer = store.writer
        writer.submit = writer._queue.append  # capture now, write in phase 2
        cap_s = cap_bytes = write_s = write_bytes = 0.0
        sizes: list[int] = []
        for b in range(args.boundaries):
            first = b * args.chunks_per_boundary
            # One conversation growing boundary by boundary: chains extend,
            # keep-K supersedes the older boundaries.
            jobs = wl.jobs(0, first, first + args.chunks_per_boundary - 1)
            for job_id, entry, nbytes in jobs:
                # Staging rows are reused: capture each job right after its DMA.
                cap_s += capture_job(store, job_id, entry)
                cap_bytes += nbytes
            if args.drain_each_boundary or b == args.boundaries - 1:
                queued = [k.size for job in writer._queue for k in job.keys]
                sizes += queued
                start = time.perf_counter()
                writer.drain()
                write_s += time.perf_counter() - start
                write_bytes += sum(queued)
        base_mem = plain_memcpy(region, int(cap_bytes), 3)
        base_torch = torch_copy(region, int(cap_bytes), 3)
        # Plain writes of the same bytes to the same disk: one file + fsync
        # (the disk's ceiling), and one file per chunk, each fsynced (the
        # same durability points as the writer, without header/crc/rename).
        source = memoryview(region.mmap)
        same = [source[:n] for n in sizes]
        base_write = plain_write(root, same)
        base_files = plain_files(root, same)
        base_write_bytes = sum(sizes)
        results[engine] = {
            "captured_bytes": int(cap_bytes),
            "capture_ms_per_mib": 1e3 * cap_s / (cap_bytes / MiB),
            "memcpy_ms_per_mib": 1e3 * base_mem / (cap_bytes / MiB),
            "torch_copy_ms_per_mib": (
                1e3 * base_torch / (cap_bytes / MiB) if base_torch else None
            ),
            "capture_vs_memcpy": cap_s / base_mem,
            "writer_gbps": write_bytes / write_s / 1e9,
            "plain_write_gbps": base_write_bytes / base_write / 1e9,
            "writer_vs_plain": (write_bytes / write_s)
            / (base_write_bytes / base_write),
            "plain_files_fsync_each_gbps": base_write_bytes / base_files / 1e9,
            "writer_vs_plain_files": (write_bytes / write_s)
            / (base_write_bytes / base_files),
            "stats": {k: v for k, v in vars(store.stats).items() if v},
        }
        results[engine]["verify"] = verify(root / engine, args.kvstore)
        store.shutdown()
    out["capture_and_write"] = results

    # 3: pressure: a burst larger than the budget, writer thread running.
    budget = args.pressure_budget_mib * MiB
    wl = Workload(region, filler)
    store = open_store(
        root / "pressure", region, budget, engines[-1], args.threads, True
    )
    burst = 0
    lat = []
    start = time.perf_counter()
    for b in range(args.boundaries):
        first = b * args.chunks_per_boundary
        for job_id, entry, nbytes in wl.jobs(
            2, first, first + args.chunks_per_boundary - 1
        ):
            lat.append(capture_job(store, job_id, entry))
            burst += nbytes
    burst_s = time.perf_counter() - start
    store.writer.wait_idle(600)
    s = store.stats
    out["pressure"] = {
        "budget_mib": args.pressure_budget_mib,
        "burst_bytes": burst,
        "burst_seconds_serving_side": burst_s,
        "captured_bytes": s.bytes_captured,
        "keys_captured": s.keys_captured,
        "keys_dropped_budget": s.keys_dropped_budget,
        "max_capture_ms": 1e3 * max(lat),
        "p50_capture_ms": 1e3 * sorted(lat)[len(lat) // 2],
        "first_capture_ms": 1e3 * lat[0],
        "manifests_published": s.manifests_published,
        "verify": verify(root / "pressure", args.kvstore),
    }
    store.shutdown()
    region.close()
    print(json.dumps(out, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
