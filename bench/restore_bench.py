"""Restore throughput and restore-vs-recompute time for one named model shape.

    python3 bench/restore_bench.py --dir /tmp/rb --tokens 32768,131072 --gpu \
        [--recompute-layers 2] [--readers N] [--willneed] [--json out.json]

Model shape: Llama-3.1-70B at tensor-parallel size 2, one rank's share
(80 layers, 4 of 8 KV heads, head size 128, bf16: 160 KiB of KV per token),
vLLM blocks of 16 tokens, 16 blocks (256 tokens) per offloaded chunk, so a
chunk file holds 80 layers x 16 blocks x 32 KiB = 40 MiB of payload.

For each prefix length it writes that rank's store with the format codec
(the bytes the writer would write: headers, segment tables, CRCs, one
boundary manifest), then measures, page cache evicted before every pass
(``sync`` + ``posix_fadvise(DONTNEED)`` on every file):

- restore: the real ``kv_restore_worker.WorkerRestore.promote`` of this
  rank (store lock, every check of FORMAT.md, payload CRC, scatter into CPU
  rows laid out like vLLM's offload region), then the CPU rows -> GPU copy
  (pinned memory, ``copy_(non_blocking=True)``, synchronize), in batches of
  ``--rows`` chunks, as vLLM's CPU tier of that many rows would;
- plain read: the same files read into one buffer, no checks, one thread
  (``plain_1``), and with the restore's number of reader threads (``plain_n``).

With ``--gpu`` it also times the prefill of ``--recompute-layers`` real
decoder layers of the same shape's rank (RMSNorm, QKV, RoPE-free causal
flash attention via torch SDPA (KV heads expanded for GQA), O, RMSNorm, SwiGLU MLP; no
all-reduce, so the recompute figure is a lower bound) and scales by 80.
Prints one line per figure and, with --json, all of them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import mmap
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
for folder in ("kv-offload-store-local", "kv-offload-scope", "kv-offload-restore"):
    sys.path.insert(0, str(REPO / "overlays" / folder))
sys.path.insert(0, str(REPO / "sim"))  # chunk_calls

# The promotions read through the native store library: this checkout's
# build unless KVTIER_STORE_LIB names another.
os.environ.setdefault(
    "KVTIER_STORE_LIB", str(REPO / "build" / "storeio" / "libkvtier_store.so")
)
import kv_restore_worker as krw  # noqa: E402
import kv_store_format  # noqa: E402
from bench_fenced import bench_fenced  # noqa: E402
from chunk_calls import ChunkCalls  # noqa: E402
from kv_store_local.layout import GroupLayout, LayerLayout, StagingTensor  # noqa: E402
from kv_store_local.restore_access import RestoreAccess  # noqa: E402
from page_cache import evict  # noqa: E402

fmt = ChunkCalls(kv_store_format)  # the package, and the chunk calls of sim/

SHAPE = "Llama-3.1-70B, TP 2 (one rank: 80 layers, 4 KV heads x 128, bf16)"
LAYERS = 80
KV_HEADS = 4  # per rank
HEAD = 128
BLOCK_TOKENS = 16
BLOCKS_PER_CHUNK = 16
CHUNK_TOKENS = BLOCK_TOKENS * BLOCKS_PER_CHUNK
PAGE = 2 * KV_HEADS * HEAD * 2 * BLOCK_TOKENS  # K and V, bf16: 32 KiB per block
MODEL = "meta-llama/Llama-3.1-70B"
# Per rank at TP 2: hidden 8192, 32 of 64 query heads, MLP 14336 of 28672.
HIDDEN, Q_HEADS, MLP = 8192, 32, 14336


def layout() -> GroupLayout:
    layers = tuple(LayerLayout(tensor=i, real_bytes=PAGE) for i in range(LAYERS))
    return GroupLayout(group=0, slot=0, kind="full", layers=layers)


class BenchStore:
    """A written rank store as the writer's WorkerStore hands it to restore
    (``restore_access``); no writer runs, no disk budget."""

    def __init__(self, layout: fmt.StoreLayout, namespace: bytes, group: GroupLayout):
        self.layout, self.namespace, self.group = layout, namespace, group
        self.staging: list[StagingTensor] = []  # the rows a promotion fills

    def restore_access(self) -> RestoreAccess:
        return RestoreAccess(
            layout=self.layout,
            namespace=self.namespace,
            key=None,
            rank=0,
            groups=(self.group,),
            blocks_per_chunk=BLOCKS_PER_CHUNK,
            staging=lambda: self.staging,
            rows_taken=lambda chunks: None,  # no writer owes keys from these rows
            distrust=lambda ident: None,
        )


def write_store(root: Path, tokens: int) -> tuple[BenchStore, list[bytes]]:
    """One rank's store for a prefix of ``tokens``: chunks + one manifest."""
    fenced = bench_fenced(
        MODEL,
        vllm_version="0.33.0",
        tp_size=2,
        hash_algorithm="sha256",
        page_sizes={0: LAYERS * PAGE},
        key_scheme={"hash": "sha256", "seed": "PYTHONHASHSEED=0"},
    )
    ns = fmt.namespace_hash(fenced)
    store_layout = fmt.StoreLayout.create(str(root), MODEL, ns, 0)
    os.makedirs(store_layout.manifest_dir, exist_ok=True)
    with open(store_layout.namespace_record, "wb") as f:
        f.write(fmt.encode_namespace_record(fmt.NamespaceRecord(fenced, {})))
    group = layout()
    segments = group.segments(BLOCKS_PER_CHUNK)
    chain, entries = [], []
    payload = bytearray(LAYERS * PAGE * BLOCKS_PER_CHUNK)
    for i in range(tokens // CHUNK_TOKENS):
        key = hashlib.sha256(b"bench/%d" % i).digest()
        seed = hashlib.sha256(key).digest()
        payload[:] = seed * (len(payload) // len(seed))
        header = fmt.make_header(ns, 0, key, (i + 1) * CHUNK_TOKENS, segments, payload)
        chunk = fmt.encode_chunk(header, payload)
        path = store_layout.chunk(key.hex(), 0)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(chunk)
        header = fmt.decode_header(chunk)
        chain.append(key.hex())
        entries.append(
            fmt.ManifestEntry(key.hex(), header.payload_length, header.payload_checksum)
        )
    manifest = fmt.BoundaryManifest(
        namespace=ns.hex(),
        rank=0,
        boundary=len(chain) * CHUNK_TOKENS,
        chunk_tokens=CHUNK_TOKENS,
        chain=tuple(chain),
        groups=(fmt.ManifestGroup(0, fmt.GROUP_KIND_FULL, tuple(entries)),),
    )
    with open(os.path.join(store_layout.manifest_dir, manifest.file_name), "wb") as f:
        f.write(fmt.encode_manifest(manifest))
    os.sync()
    return BenchStore(store_layout, ns, group), [
        bytes.fromhex(k) + (0).to_bytes(4, "big") for k in chain
    ]


def chunk_files(store) -> list[str]:
    out = []
    for top, _, files in os.walk(store.layout.base):
        out += [os.path.join(top, n) for n in files if n.endswith(".bin")]
    return sorted(out)


def plain_read(files: list[str], threads: int, buf_bytes: int) -> float:
    """Seconds to read every file once into a reused buffer, no checks."""
    bufs = [bytearray(buf_bytes) for _ in range(threads)]

    def read(item):
        index, path = item
        view = memoryview(bufs[index % threads])
        fd = os.open(path, os.O_RDONLY)
        try:
            done = 0
            while n := os.readv(fd, [view[done:]]):
                done += n
        finally:
            os.close(fd)
        return done

    start = time.perf_counter()
    if threads == 1:
        total = sum(map(read, enumerate(files)))
    else:
        with ThreadPoolExecutor(threads) as pool:
            # one file per thread at a time: buffer i % threads is never shared
            total = 0
            for base in range(0, len(files), threads):
                total += sum(
                    pool.map(read, list(enumerate(files))[base : base + threads])
                )
    seconds = time.perf_counter() - start
    assert total == sum(os.path.getsize(p) for p in files)
    return seconds


class Rows:
    """CPU rows laid out like vLLM's offload region (one slot, LAYERS tensors).

    ``shm``: the memory vLLM 0.34.0's CPU tier has (shared_offload_region.py):
    a MAP_SHARED file in /dev/shm, pre-faulted with MADV_POPULATE_WRITE and,
    with ``gpu``, pinned in place by cudaHostRegister; else torch's pinned
    memory (``gpu``) or a bytearray."""

    def __init__(self, rows: int, gpu: bool, shm: bool = False):
        self.row_bytes = LAYERS * PAGE * BLOCKS_PER_CHUNK
        self.rows = rows
        self.torch = None
        if gpu:
            import torch

            self.torch = torch
        size = rows * self.row_bytes
        if shm:
            self.host = shared_rows(size, self.torch)
        elif gpu:
            self.host = self.torch.empty(size, dtype=self.torch.uint8, pin_memory=True)
        else:
            self.host = bytearray(size)
        source = self.host
        width = PAGE * BLOCKS_PER_CHUNK
        self.staging = [
            StagingTensor(source, i * width, self.row_bytes, width)
            for i in range(LAYERS)
        ]


def shared_rows(size: int, torch=None):
    """``size`` bytes of a /dev/shm file mapped MAP_SHARED and pre-faulted for
    writing (the file unlinked at once: the mapping keeps it); pinned with
    cudaHostRegister when ``torch`` is given."""
    path = f"/dev/shm/kvtier_bench_rows_{os.getpid()}"
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.unlink(path)
        os.ftruncate(fd, size)
        region = mmap.mmap(fd, size, flags=mmap.MAP_SHARED)
    finally:
        os.close(fd)
    region.madvise(getattr(mmap, "MADV_POPULATE_WRITE", 23), 0, size)
    if torch is None:
        return region
    host = torch.frombuffer(region, dtype=torch.uint8)
    rc = torch.cuda.cudart().cudaHostRegister(host.data_ptr(), size, 0)
    if int(rc) != 0:
        raise SystemExit(f"restore_bench: cudaHostRegister failed ({rc})")
    return host


def restore(store, keys, rows: Rows, gpu_dst) -> tuple[float, int]:
    """Seconds to promote every key (batches of rows) and copy it to the GPU."""
    restorer = krw.WorkerRestore(rescan_seconds=1e9)
    store.staging = rows.staging
    restorer.bind(store)
    if not restorer.active:
        raise SystemExit(f"restore_bench: restore off: {restorer.disabled_reason}")
    torch = rows.torch
    stream = torch.cuda.Stream() if torch else None
    start = time.perf_counter()
    job = 0
    for base in range(0, len(keys), rows.rows):
        batch = keys[base : base + rows.rows]
        if stream is not None:
            stream.synchronize()  # the rows are free again
        restorer.promote(
            SimpleNamespace(
                kv_restore=[
                    {"job": job, "keys": batch, "chunks": list(range(len(batch)))}
                ]
            ),
            store,
        )
        restorer.wait_idle()  # the promotion thread read the batch
        if restorer.stats.jobs_failed:
            raise SystemExit(
                f"restore_bench: promotion failed: {restorer.stats.failures}"
            )
        job += 1
        if torch is not None:
            n = len(batch) * rows.row_bytes
            with torch.cuda.stream(stream):
                gpu_dst[base * rows.row_bytes : base * rows.row_bytes + n].copy_(
                    rows.host[:n], non_blocking=True
                )
    if stream is not None:
        stream.synchronize()
    seconds = time.perf_counter() - start
    return seconds, restorer.stats.bytes_restored


def recompute_seconds(tokens: int, layers: int) -> float:
    """Prefill time of ``layers`` real decoder layers of the rank, scaled to 80."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dev, dt = "cuda", torch.bfloat16
    torch.manual_seed(0)
    x = torch.randn(tokens, HIDDEN, device=dev, dtype=dt)
    w = [
        {
            "qkv": torch.randn(
                HIDDEN, (Q_HEADS + 2 * KV_HEADS) * HEAD, device=dev, dtype=dt
            )
            * 0.01,
            "o": torch.randn(Q_HEADS * HEAD, HIDDEN, device=dev, dtype=dt) * 0.01,
            "gu": torch.randn(HIDDEN, 2 * MLP, device=dev, dtype=dt) * 0.01,
            "down": torch.randn(MLP, HIDDEN, device=dev, dtype=dt) * 0.01,
        }
        for _ in range(layers)
    ]

    def layer(h, p):
        a = F.rms_norm(h, (HIDDEN,))
        qkv = a @ p["qkv"]
        q, k, v = qkv.split([Q_HEADS * HEAD, KV_HEADS * HEAD, KV_HEADS * HEAD], dim=-1)
        q = q.view(tokens, Q_HEADS, HEAD).transpose(0, 1).unsqueeze(0)
        # GQA: each KV head serves Q_HEADS / KV_HEADS query heads. Expanded so the
        # flash kernel runs (forced: a silent fallback to the math kernel would
        # materialise a tokens x tokens matrix).
        rep = Q_HEADS // KV_HEADS
        k = k.view(tokens, KV_HEADS, HEAD).repeat_interleave(rep, dim=1)
        v = v.view(tokens, KV_HEADS, HEAD).repeat_interleave(rep, dim=1)
        k = k.transpose(0, 1).unsqueeze(0)
        v = v.transpose(0, 1).unsqueeze(0)
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = h + o.squeeze(0).transpose(0, 1).reshape(tokens, Q_HEADS * HEAD) @ p["o"]
        m = F.rms_norm(h, (HIDDEN,)) @ p["gu"]
        g, u = m.chunk(2, dim=-1)
        return h + (F.silu(g) * u) @ p["down"]

    with torch.no_grad():
        h = x
        for p in w:  # warm-up (kernels, autotuning)
            h = layer(h, p)
        torch.cuda.synchronize()
        best = float("inf")
        for _ in range(2):
            start = time.perf_counter()
            h = x
            for p in w:
                h = layer(h, p)
            torch.cuda.synchronize()
            best = min(best, time.perf_counter() - start)
    del w, x, h
    torch.cuda.empty_cache()
    return best / layers * LAYERS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", required=True, type=Path)
    parser.add_argument("--tokens", default="32768")
    parser.add_argument(
        "--rows", type=int, default=32, help="CPU rows (chunks) per batch"
    )
    parser.add_argument("--gpu", action="store_true")
    parser.add_argument("--recompute-layers", type=int, default=2)
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--readers", type=int, help="threads of the native read (krw.READERS)"
    )
    parser.add_argument(
        "--willneed", action="store_true", help="fadvise(WILLNEED) each payload first"
    )
    parser.add_argument(
        "--passes",
        default="plain_1,restore,plain_n,restore_2",
        help="in this order, each after evicting the files from the page cache",
    )
    args = parser.parse_args()
    if args.readers:
        krw.READERS = args.readers
    krw.READ_WILLNEED = args.willneed
    figures = {"shape": SHAPE, "chunk_tokens": CHUNK_TOKENS, "runs": []}
    print(
        f"shape: {SHAPE}; {CHUNK_TOKENS} tokens ({LAYERS * PAGE * BLOCKS_PER_CHUNK >> 20} MiB) a chunk"
    )
    rows = Rows(args.rows, args.gpu)
    for tokens in (int(t) for t in args.tokens.split(",")):
        root = args.dir / f"t{tokens}"
        start = time.perf_counter()
        store, keys = write_store(root, tokens)
        files = chunk_files(store)
        size = sum(os.path.getsize(p) for p in files)
        print(
            f"{tokens} tokens: {len(files)} chunk files, {size / 1e9:.2f} GB written in {time.perf_counter() - start:.1f} s"
        )
        gpu_dst = None
        if args.gpu:
            import torch

            gpu_dst = torch.empty(
                len(keys) * rows.row_bytes, dtype=torch.uint8, device="cuda"
            )
        run = {"tokens": tokens, "files": len(files), "bytes": size}
        passes = {
            "plain_1": lambda: plain_read(files, 1, max(map(os.path.getsize, files))),
            "restore": lambda: restore(store, keys, rows, gpu_dst)[0],
            "plain_n": lambda: plain_read(
                files, krw.READERS, max(map(os.path.getsize, files))
            ),
            "restore_2": lambda: restore(store, keys, rows, gpu_dst)[0],
        }
        for name in args.passes.split(","):
            fn = passes[name]
            evict(files)
            seconds = fn()
            run[name] = seconds
            print(f"  {name:10s} {seconds:7.2f} s  {size / seconds / 1e9:6.2f} GB/s")
        if gpu_dst is not None:
            # the last chunk on the GPU equals its file's payload
            import torch

            last = gpu_dst[
                (len(keys) - 1) * rows.row_bytes : len(keys) * rows.row_bytes
            ].cpu()
            seed = hashlib.sha256(keys[-1][:-4]).digest()
            expect = torch.frombuffer(
                bytearray(seed * (rows.row_bytes // 32)), dtype=torch.uint8
            )
            run["gpu_bytes_equal"] = bool(torch.equal(last, expect))
            print(f"  GPU bytes equal the file's payload: {run['gpu_bytes_equal']}")
            del gpu_dst
            torch.cuda.empty_cache()
        best_restore = min(run[k] for k in ("restore", "restore_2") if k in run)
        for plain in ("plain_1", "plain_n"):
            if plain in run:
                run[f"restore_vs_{plain}"] = run[plain] / best_restore
                print(
                    f"  restore / {plain} read throughput: {run[f'restore_vs_{plain}']:.2f}x"
                )
        if args.gpu:
            run["recompute"] = recompute_seconds(tokens, args.recompute_layers)
            run["recompute_vs_restore"] = run["recompute"] / best_restore
            print(
                f"  recompute (prefill, {args.recompute_layers} layers timed x {LAYERS // args.recompute_layers}): {run['recompute']:.2f} s; restore {best_restore:.2f} s: {run['recompute_vs_restore']:.1f}x faster"
            )
        figures["runs"].append(run)
        for path in files:
            os.unlink(path)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
