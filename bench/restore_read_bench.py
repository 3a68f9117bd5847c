"""The restore's read of a store from the page cache: the Python per-file
read it had vs the native library (libkvtier_store.so), by thread count.

    python3 bench/restore_read_bench.py --dir /tmp/rrb [--tokens 8192] \
        [--threads 1,2,4,8,16] [--rows 16] [--repeat 3] [--gpu] [--lib PATH] \
        [--json out.json]

The store is restore_bench.py's (Llama-3.1-70B at TP 2, one rank: 40 MiB of
payload a chunk file), written once and read once to warm the page cache;
then every pass promotes every key in batches of ``--rows`` CPU rows laid
out like vLLM's offload region (``--gpu``: pinned host memory through torch,
as on the serving machine; no vLLM is imported either way):

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
"""

from __future__ import annotations

import argparse
import json
import os
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
        if restorer.stats.jobs_failed:
            raise SystemExit(f"restore_read_bench: failed: {restorer.stats.failures}")
        return restorer.stats.bytes_restored - before

    return run


def python_job(pool: ThreadPoolExecutor):
    def run(restorer, store, job, batch) -> int:
        def one(item) -> int:
            chunk, key = item
            proof = restorer.inventory.proof(key)
            layout, first, count = restorer._geometry(proof)
            fd = fmt.open_regular(store.writer.layout.chunk(proof.key_hex, proof.group))
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
                    restorer._runs(layout, chunk, first, count),
                )
            finally:
                os.close(fd)
            if reason:
                raise SystemExit(f"restore_read_bench: python read refused: {reason}")
            return proof.length

        return sum(pool.map(one, enumerate(batch)))

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", required=True, type=Path)
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--threads", default="1,2,4,8,16")
    parser.add_argument("--rows", type=int, default=16, help="CPU rows per job")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--gpu", action="store_true", help="pinned rows (torch)")
    parser.add_argument("--lib", help="libkvtier_store.so (else KVTIER_STORE_LIB)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.lib:
        os.environ["KVTIER_STORE_LIB"] = args.lib
    os.environ.setdefault(
        "KVTIER_STORE_LIB", str(REPO / "build" / "storeio" / "libkvtier_store.so")
    )
    store, keys = rb.write_store(args.dir / f"t{args.tokens}", args.tokens)
    files = rb.chunk_files(store)
    size = sum(os.path.getsize(p) for p in files)
    for path in files:  # warm: every pass reads from the page cache
        with open(path, "rb") as f:
            while f.read(8 << 20):
                pass
    rows = rb.Rows(args.rows, args.gpu)
    store._staging = rows.staging
    restorer = krw.WorkerRestore(rescan_seconds=1e9)
    restorer.bind(store)
    if not restorer.active:
        raise SystemExit(f"restore_read_bench: restore off: {restorer.disabled_reason}")
    lib = restorer._native
    print(
        f"shape: {rb.SHAPE}; {len(files)} chunk files, {size / 1e9:.2f} GB, "
        f"page cache warm; rows {'pinned' if args.gpu else 'bytearray'}; "
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
