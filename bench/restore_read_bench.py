"""The restore's read of a store from the page cache: the Python per-file
read it had vs the native library (libkvtier_store.so), by thread count.

    python3 bench/restore_read_bench.py --dir /tmp/rrb [--tokens 8192] \
        [--threads 1,2,4,8,16] [--rows 16] [--repeat 3] [--gpu] [--shm] \
        [--lib PATH] [--json out.json]

The store is restore_bench.py's (Llama-3.1-70B at TP 2, one rank: 40 MiB of
payload a chunk file), written once and read once to warm the page cache;
then every pass promotes every key in batches of ``--rows`` CPU rows laid
out like vLLM's offload region (``--gpu``: pinned host memory through torch,
as on the serving machine; ``--shm``: a pre-faulted MAP_SHARED /dev/shm file,
the memory vLLM 0.34.0's CPU tier has, registered in place with ``--gpu``;
``--rows 512`` makes a job as big as run 30's; no vLLM is imported either way):

- ``python``: the restore's former read (sim/restore_read_py.py: header
  checks with kv_store_format, preadv into the rows, zlib CRC) on a thread
  pool of N threads, one file a task, as kv_restore_worker ran it;
- ``native``: the real ``WorkerRestore.promote`` of today (lock, opens, one
  ``kvtier_read_chunks`` call a job on N threads);
- ``plain``: restore_bench's plain read of the same files on N threads
  (reused buffers, no checks): what the page cache gives.

Prints GB/s per pass (the best of ``--repeat``; payload bytes for python
and native, file bytes for plain) and native / python.
Needs no GPU; the library comes from ``--lib``, KVTIER_STORE_LIB or
build/storeio/.

    python3 bench/restore_read_bench.py --mac --dir /tmp/rrb [--tokens 8192] \
        [--threads 1,4] [--repeat 3]

``--mac``: what a keyed store (GLM53_KV_OFFLOAD_KEY_FILE, FORMAT.md 3.6)
costs the two native paths, the same chunk files with and without the key:
``kvtier_write_chunks`` (header, CRC, the MAC when keyed, pwrite,
fdatasync, rename, folder fsync: the writer's call; disk-bound on a real
disk) and ``kvtier_read_chunks`` from a warm page cache (header checks,
preadv into the rows, CRC, the MAC when keyed: the restore's call). The
MAC is whatever the library seals with (since v3: AES-GMAC under a
per-chunk subkey; before: HMAC-SHA256). Payload GB/s, best of ``--repeat``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "sim"))
import restore_bench as rb  # noqa: E402  (puts the overlays on sys.path)
import restore_read_py as oracle  # noqa: E402

krw = rb.krw
fmt = rb.fmt


def promote_all(restorer, store, keys, rows, read_job) -> int:
    """Every key promoted in batches of rows.rows; the payload bytes."""
    total = 0
    for job, base in enumerate(range(0, len(keys), rows.rows)):
        batch = keys[base : base + rows.rows]
        total += read_job(restorer, store, job, batch)
    return total


def native_job(threads: int):
    def run(restorer, store, job, batch) -> int:
        krw.READERS = threads
        before = restorer.stats.bytes_restored
        restorer.promote(
            SimpleNamespace(
                kv_restore=[
                    {"job": job, "keys": batch, "chunks": list(range(len(batch)))}
                ]
            ),
            store,
        )
        restorer.wait_idle()  # a promotion runs on its own thread, across steps
        if restorer.stats.jobs_failed:
            raise SystemExit(f"restore_read_bench: failed: {restorer.stats.failures}")
        return restorer.stats.bytes_restored - before

    return run


def python_job(pool: ThreadPoolExecutor):
    def run(restorer, store, job, batch) -> int:
        def one(item) -> int:
            chunk, key = item
            proof = restorer.inventory.proof(key)
            layout, first, count = restorer._rows.geometry(proof)
            fd = fmt.open_regular(store.layout.chunk(proof.key_hex, proof.group))
            try:
                reason = oracle.read_one(
                    fd,
                    restorer._namespace,
                    proof.group,
                    bytes.fromhex(proof.key_hex),
                    proof.boundary,
                    proof.length,
                    proof.checksum,
                    layout.segments(count),
                    restorer._rows.runs(layout, chunk, first, count),
                )
            finally:
                os.close(fd)
            if reason:
                raise SystemExit(f"restore_read_bench: python read refused: {reason}")
            return proof.length

        return sum(pool.map(one, enumerate(batch)))

    return run


def mac_costs(args) -> dict:
    """Native write and read GB/s of one store's chunks, plain vs keyed."""
    native = krw.native
    lib = native.load()
    if not lib.supports_mac():
        raise SystemExit(
            f"restore_read_bench: {lib.path} has no MAC (built without OpenSSL)"
        )
    segments = rb.layout().segments(rb.BLOCKS_PER_CHUNK)
    length = sum(seg.length for seg in segments)
    count = max(1, args.tokens // rb.CHUNK_TOKENS)
    payload = bytearray(os.urandom(1 << 20) * (length >> 20)) + bytearray(
        length % (1 << 20)
    )
    address = krw.chunk_read.buffer_address(payload)
    dest = bytearray(length * min(count, 64))
    dest_at = krw.chunk_read.buffer_address(dest)
    key = os.urandom(32)
    namespace = bytes(32)
    root = args.dir / "mac"
    print(
        f"keyed store costs: {count} chunk files of {length / 2**20:.1f} MiB "
        f"({rb.SHAPE}), {os.cpu_count()} cores; library {lib.path}"
    )
    print(
        f"{'threads':>7s} {'path':>6s} {'plain GB/s':>11s} {'keyed GB/s':>11s} {'keyed/plain':>12s}"
    )
    figures: dict = {"files": count, "payload_bytes": length, "rows": []}
    for threads in (int(t) for t in args.threads.split(",")):
        row: dict = {"threads": threads}
        for mode, mac in (("plain", None), ("keyed", key)):
            folder = root / mode
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            requests = [
                native.WriteRequest(
                    path=str(folder / f"{i:05d}.bin"),
                    group=0,
                    namespace_hash=namespace,
                    key_hash=hashlib.sha256(b"%d" % i).digest(),
                    boundary=(i + 1) * rb.CHUNK_TOKENS,
                    segments=segments,
                    runs=[(address, length)],
                )
                for i in range(count)
            ]
            best = None
            results = []
            for _ in range(args.repeat):
                start = time.perf_counter()
                results = lib.write_chunks(requests, threads, key=mac)
                took = time.perf_counter() - start
                best = took if best is None else min(best, took)
                if not all(r.ok for r in results):
                    raise SystemExit(f"restore_read_bench: write failed: {results[0]}")
            row[f"write_{mode}"] = count * length / best / 1e9
            reads = [
                native.ReadRequest(
                    group=0,
                    namespace_hash=namespace,
                    key_hash=w.key_hash,
                    boundary=w.boundary,
                    payload_length=length,
                    payload_checksum=r.payload_checksum,
                    segments=segments,
                    runs=[(dest_at + (i % 64) * length, length)],
                    path=w.path,
                )
                for i, (w, r) in enumerate(zip(requests, results, strict=True))
            ]
            best = None
            for _ in range(args.repeat):  # the writes left every file in the page cache
                start = time.perf_counter()
                got = []
                for first in range(0, count, 64):  # 64 rows of memory a call
                    read = lib.prepare_read(reads[first : first + 64], key=mac)
                    read.run(threads)
                    got += read.results()
                took = time.perf_counter() - start
                best = took if best is None else min(best, took)
                if not all(r.ok for r in got):
                    raise SystemExit(f"restore_read_bench: read failed: {got[0]}")
            row[f"read_{mode}"] = count * length / best / 1e9
            shutil.rmtree(folder, ignore_errors=True)
        figures["rows"].append(row)
        for path in ("write", "read"):
            plain, keyed = row[f"{path}_plain"], row[f"{path}_keyed"]
            print(
                f"{threads:7d} {path:>6s} {plain:11.2f} {keyed:11.2f} {keyed / plain:11.2f}x"
            )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", required=True, type=Path)
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--threads", default="1,2,4,8,16")
    parser.add_argument("--rows", type=int, default=16, help="CPU rows per job")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--gpu", action="store_true", help="pinned rows (torch)")
    parser.add_argument(
        "--shm",
        action="store_true",
        help="rows in a pre-faulted MAP_SHARED /dev/shm file, as vLLM 0.34.0's CPU tier "
        "(with --gpu: cudaHostRegister'd in place)",
    )
    parser.add_argument("--lib", help="libkvtier_store.so (else KVTIER_STORE_LIB)")
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--mac", action="store_true", help="keyed vs plain native write and read"
    )
    args = parser.parse_args()
    if args.lib:
        os.environ["KVTIER_STORE_LIB"] = args.lib
    os.environ.setdefault(
        "KVTIER_STORE_LIB", str(REPO / "build" / "storeio" / "libkvtier_store.so")
    )
    if args.mac:
        figures = mac_costs(args)
        if args.json:
            args.json.write_text(json.dumps(figures, indent=1))
        return
    store, keys = rb.write_store(args.dir / f"t{args.tokens}", args.tokens)
    files = rb.chunk_files(store)
    size = sum(os.path.getsize(p) for p in files)
    for path in files:  # warm: every pass reads from the page cache
        with open(path, "rb") as f:
            while f.read(8 << 20):
                pass
    rows = rb.Rows(args.rows, args.gpu, args.shm)
    store.staging = rows.staging
    restorer = krw.WorkerRestore(rescan_seconds=1e9)
    restorer.bind(store)
    if not restorer.active:
        raise SystemExit(f"restore_read_bench: restore off: {restorer.disabled_reason}")
    lib = restorer._native
    kind = {(True, True): "shm, registered", (True, False): "shm"}.get(
        (args.shm, args.gpu), "pinned" if args.gpu else "bytearray"
    )
    print(
        f"shape: {rb.SHAPE}; {len(files)} chunk files, {size / 1e9:.2f} GB, "
        f"page cache warm; rows {kind}; "
        f"{os.cpu_count()} cores; library {lib.path} ({lib.version})"
    )
    print(
        f"{'threads':>7s} {'python GB/s':>12s} {'native GB/s':>12s} "
        f"{'plain GB/s':>11s} {'native/python':>14s}"
    )
    biggest = max(map(os.path.getsize, files))
    figures = {"files": len(files), "bytes": size, "cores": os.cpu_count(), "rows": []}
    for threads in (int(t) for t in args.threads.split(",")):
        row = {"threads": threads}
        with ThreadPoolExecutor(threads) as pool:
            for name, job in (
                ("python", python_job(pool)),
                ("native", native_job(threads)),
            ):
                best = None
                for _ in range(args.repeat):
                    start = time.perf_counter()
                    payload = promote_all(restorer, store, keys, rows, job)
                    seconds = time.perf_counter() - start
                    best = seconds if best is None else min(best, seconds)
                row[name] = payload / best / 1e9
        plain = min(rb.plain_read(files, threads, biggest) for _ in range(args.repeat))
        row["plain"] = size / plain / 1e9
        row["ratio"] = row["native"] / row["python"]
        figures["rows"].append(row)
        print(
            f"{threads:7d} {row['python']:12.2f} {row['native']:12.2f} "
            f"{row['plain']:11.2f} {row['ratio']:13.2f}x"
        )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    for path in files:
        os.unlink(path)


if __name__ == "__main__":
    main()
