"""A promotion beside an engine thread that holds the GIL: what it waits for.

    python3 bench/promotion_gil_bench.py --dir /tmp/pgb [--files 512] \
        [--layers 4] [--hold-ms 0,20,100] [--repeat 3] [--json out.json]

On the H200 (docs/ENGINE-RUNS.md, runs 19-21) a 32k-token restore on vLLM 0.34.0
read 4.9 GB in 27.8 s from disk and 52.6 s from the page cache while the
engine thread compiled Triton kernels, whose compiler holds the GIL for long
stretches. A promotion thread that needs the GIL once per file waits for
one such stretch per file. This bench plays that engine thread on the CPU:
the main thread starts the real ``WorkerRestore.promote`` of one job of
``--files`` chunk files (each in its own chunk folder, as a restore after a
restart finds them) from the page cache, then holds the GIL ``--hold-ms`` at
a time (a C call through ``ctypes.PyDLL``, which keeps it) and polls between
holds until the read is done, as a compiling engine thread would.

Prints per hold: the job's wall time (best of ``--repeat``, a fresh restorer
each pass), the part of it ``promote`` took on the step's thread (finding
the files and building the read call: the step that carries the job is
that much longer), the holds it waited for, and the wall time over the job's time
without holds. A promotion that needs the GIL O(1) times a job stays at a
few holds whatever the number of files; one that needs it per file grows
with ``files x hold``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
import restore_bench as rb  # noqa: E402  (puts the overlays on sys.path)

krw = rb.krw


def one_job(store, keys, rows, hold_s: float) -> tuple[float, float, int, int]:
    """One promotion of every key by a fresh restorer while this thread plays
    the engine thread: it prepares the job (``promote``), then holds the GIL
    ``hold_s`` at a time (a C call through ``ctypes.PyDLL``, which keeps
    it), polling between holds until the job's read is done, as a step
    would. (seconds, of them in ``promote`` on this thread, GIL holds, bytes)."""
    usleep = ctypes.PyDLL(None).usleep
    usleep.argtypes = [ctypes.c_uint]
    restorer = krw.WorkerRestore(rescan_seconds=1e9)
    store.staging = rows.staging
    restorer.bind(store)
    if not restorer.active:
        raise SystemExit(
            f"promotion_gil_bench: restore off: {restorer.disabled_reason}"
        )
    metadata = SimpleNamespace(
        kv_restore=[{"job": 0, "keys": keys, "chunks": list(range(len(keys)))}]
    )
    start = time.perf_counter()
    restorer.promote(metadata, store)
    step = time.perf_counter() - start
    holds = 0
    while not restorer.wait_idle(0):  # a step: the finished jobs reported
        if hold_s:
            usleep(int(hold_s * 1e6))
            holds += 1
        else:
            time.sleep(0.0005)
    seconds = time.perf_counter() - start
    if restorer.stats.jobs_failed:
        raise SystemExit(f"promotion_gil_bench: failed: {restorer.stats.failures}")
    restorer.shutdown()
    return seconds, step, holds, restorer.stats.bytes_restored


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", required=True, type=Path)
    parser.add_argument("--files", type=int, default=512)
    parser.add_argument(
        "--layers", type=int, default=4, help="chunk size: layers x 512 KiB"
    )
    parser.add_argument("--hold-ms", default="0,20,100")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--lib", help="libkvtier_store.so (else KVTIER_STORE_LIB)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.lib:
        os.environ["KVTIER_STORE_LIB"] = args.lib
    os.environ.setdefault(
        "KVTIER_STORE_LIB", str(REPO / "build" / "storeio" / "libkvtier_store.so")
    )
    rb.LAYERS = args.layers  # restore_bench's shape, fewer layers: smaller files
    store, keys = rb.write_store(
        args.dir / f"f{args.files}l{args.layers}", args.files * rb.CHUNK_TOKENS
    )
    files = rb.chunk_files(store)
    for path in files:  # the page cache holds them: the bytes are not the cost
        with open(path, "rb") as f:
            while f.read(8 << 20):
                pass
    rows = rb.Rows(len(keys), gpu=False)
    size = sum(map(os.path.getsize, files))
    folders = len({os.path.dirname(p) for p in files})
    print(
        f"{len(files)} chunk files in {folders} folders, {size / 1e9:.2f} GB, "
        f"page cache warm; {os.cpu_count()} cores; switch interval "
        f"{sys.getswitchinterval() * 1e3:.0f} ms"
    )
    print(
        f"{'hold ms':>8s} {'job s':>8s} {'step s':>8s} {'GIL holds':>10s} "
        f"{'x no hold':>9s}"
    )
    figures: dict = {"files": len(files), "folders": folders, "bytes": size, "rows": []}
    alone = None
    for hold_ms in (float(h) for h in args.hold_ms.split(",")):
        best, step, turns = None, 0.0, 0
        for _ in range(args.repeat):
            seconds, prep, holds, nbytes = one_job(store, keys, rows, hold_ms / 1e3)
            if nbytes != len(keys) * rb.LAYERS * rb.PAGE * rb.BLOCKS_PER_CHUNK:
                raise SystemExit(f"promotion_gil_bench: read {nbytes} bytes")
            if best is None or seconds < best:
                best, step, turns = seconds, prep, holds
        alone = best if alone is None else alone
        row = {
            "hold_ms": hold_ms,
            "seconds": best,
            "step_seconds": step,
            "holds": turns,
            "x": best / alone,
        }
        figures["rows"].append(row)
        print(
            f"{hold_ms:8.0f} {best:8.3f} {step:8.3f} {turns:10d} {best / alone:8.1f}x"
        )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    for path in files:
        os.unlink(path)


if __name__ == "__main__":
    main()
