#!/usr/bin/env python3
"""kvstore benchmark: prints throughputs and ratios (not a test; no pass/fail).

1. verify: a rank of 27 MiB chunks (>= 2 GiB) in the page cache. Compares
   `kvstore verify` with `cat FILES > /dev/null` and with a plain Python loop
   of read + zlib.crc32 over the same files, all in this run.
2. gc: a rank of 200,000 small chunks (1,000 chains of 200, one manifest each).
   Compares `kvstore gc` (dry run) with `find ROOT -type f | wc -l`.

Each figure is the best of --repeat runs after a warm-up read, as wall time
and as CPU time (user + system, children included: what the command costs
the machine, robust when other load shares it). Stores are
generated once under --dir and reused. --smoke runs tiny sizes (for CI).

usage: bench/kvstore_bench.py [--kvstore build/kvstore/kvstore] [--dir /tmp/kvstore-bench]
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import subprocess
import sys
import time
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "overlays" / "kv-offload-store-local"))

import kv_store_format as fmt  # noqa: E402

MiB = 1 << 20
GiB = 1 << 30


def fenced(model: str) -> dict:
    return fmt.make_fenced(
        model=model,
        vllm_version="bench",
        build_id="bench",
        tp_size=1,
        kv_dtype="auto",
        hash_algorithm="sha256_cbor",
        num_speculative_tokens=0,
        page_sizes={0: 4096},
        state_abi={},
    )


class Writer:
    """Writes one rank's chunks fast: no temps, no fsync (bench data only)."""

    def __init__(self, tier: Path, model: str) -> None:
        self.fenced = fenced(model)
        self.ns = fmt.namespace_hash(self.fenced)
        self.layout = fmt.StoreLayout.create(str(tier), model, self.ns, 0)
        tier.mkdir(parents=True, exist_ok=True)
        Path(self.layout.namespace_record).write_bytes(
            fmt.encode_namespace_record(fmt.NamespaceRecord(self.fenced, {"keep_boundaries": 2}))
        )
        self.dirs: set[str] = set()

    def chunk(self, key: str, boundary: int, payload: bytes) -> fmt.ManifestEntry:
        segs = fmt.make_segments([(0, fmt.SegmentKind.KV, fmt.DType.UINT8, (len(payload),), (1,))])
        header = fmt.make_header(self.ns, 0, bytes.fromhex(key), boundary, segs, payload)
        path = self.layout.chunk(key, 0)
        d = os.path.dirname(path)
        if d not in self.dirs:
            os.makedirs(d, exist_ok=True)
            self.dirs.add(d)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, fmt.encode_header(header))
            view = memoryview(payload)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        return fmt.ManifestEntry(key, header.payload_length, header.payload_checksum)

    def manifest(self, chain: list[str], entries: list[fmt.ManifestEntry], tokens: int) -> None:
        m = fmt.BoundaryManifest(
            namespace=self.ns.hex(),
            rank=0,
            boundary=len(chain) * tokens,
            chunk_tokens=tokens,
            chain=tuple(chain),
            groups=(fmt.ManifestGroup(0, fmt.GROUP_KIND_FULL, tuple(entries)),),
        )
        path = Path(self.layout.manifest(m.boundary, m.tip))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(fmt.encode_manifest(m))


def key(i: int, salt: str) -> str:
    return zlib.crc32(f"{salt}{i}".encode()).to_bytes(4, "little").hex() + f"{i:024x}"


def make_big(tier: Path, total: int, chunk: int) -> Path:
    w = Writer(tier, "bench-big")
    base = Path(w.layout.base)
    if (base / "manifests").is_dir():
        return base
    n = -(-total // chunk)
    payload = bytearray(os.urandom(chunk))
    chain, entries = [], []
    for i in range(n):
        payload[:8] = i.to_bytes(8, "little")
        k = key(i, "big")
        chain.append(k)
        entries.append(w.chunk(k, (i + 1) * 16, bytes(payload)))
    w.manifest(chain, entries, 16)
    return base


def make_small(tier: Path, files: int, per_chain: int, size: int) -> Path:
    w = Writer(tier, "bench-small")
    base = Path(w.layout.base)
    if (base / "manifests").is_dir():
        return base
    payload = os.urandom(size)
    t0 = time.monotonic()
    for c in range(files // per_chain):
        chain, entries = [], []
        for j in range(per_chain):
            k = key(c * per_chain + j, "small")
            chain.append(k)
            entries.append(w.chunk(k, (j + 1) * 16, payload))
        w.manifest(chain, entries, 16)
        if c % 100 == 99:
            print(f"  generated {len(chain) * (c + 1)} files, {time.monotonic() - t0:.0f} s", flush=True)
    return base


def cpu_now() -> float:
    """CPU seconds (user + system) of this process and its waited-for children."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def best(fn, repeat: int) -> tuple[float, float]:
    """Best wall time and best CPU time (user + system) over `repeat` runs."""
    walls, cpus = [], []
    for _ in range(repeat):
        c0, t0 = cpu_now(), time.perf_counter()
        fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(cpu_now() - c0)
    return min(walls), min(cpus)


def chunk_files(base: Path) -> list[str]:
    return sorted(str(p) for p in base.rglob("*.bin"))


def run_quiet(cmd: list[str], shell: bool = False, ok=(0,)) -> None:
    r = subprocess.run(cmd, shell=shell, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if r.returncode not in ok:
        raise SystemExit(f"{cmd}: exit {r.returncode}: {r.stderr.decode()[-400:]}")


def py_crc_loop(files: list[str]) -> None:
    for f in files:
        with open(f, "rb") as fh:
            zlib.crc32(fh.read())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvstore", default=str(REPO / "build" / "kvstore" / "kvstore"))
    ap.add_argument("--dir", default="/tmp/kvstore-bench")
    ap.add_argument("--big-gib", type=float, default=2.1)
    ap.add_argument("--chunk-mib", type=float, default=27)
    ap.add_argument("--small-files", type=int, default=200_000)
    ap.add_argument("--small-bytes", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="kvstore --threads (0: its default)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, one repeat (CI)")
    ap.add_argument("--only", choices=("verify", "gc"), help="run one of the two parts")
    a = ap.parse_args()
    if a.smoke:
        a.big_gib, a.chunk_mib, a.small_files, a.repeat = 0.01, 1, 400, 1
    kv = a.kvstore
    threads = ["--threads", str(a.threads)] if a.threads else []
    root = Path(a.dir)
    print(f"machine: {platform.node()} {platform.machine()} {os.cpu_count()} cpus, "
          f"{platform.system()} {platform.release()}, python {platform.python_version()}")

    if a.only != "gc":
        bench_verify(a, kv, threads, root)
    if a.only != "verify":
        bench_gc(a, kv, threads, root)
    print(f"load average after the run: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return 0


def bench_verify(a: argparse.Namespace, kv: str, threads: list[str], root: Path) -> None:
    big = make_big(root / "big", int(a.big_gib * GiB), int(a.chunk_mib * MiB))
    files = chunk_files(big)
    total = sum(os.path.getsize(f) for f in files)
    print(f"verify: {len(files)} chunks, {total / GiB:.2f} GiB under {big}")
    run_quiet(["cat", *files])  # into the page cache
    t_cat, c_cat = best(lambda: run_quiet(["cat", *files]), a.repeat)
    t_kv, c_kv = best(lambda: run_quiet([kv, "verify", "--quiet", *threads, str(big)]), a.repeat)
    t_py, c_py = best(lambda: py_crc_loop(files), a.repeat)
    gbs = lambda t: total / t / 1e9  # noqa: E731
    print("                               wall            cpu (user+sys)")
    print(f"  cat > /dev/null          {t_cat:7.3f} s {gbs(t_cat):6.2f} GB/s  {c_cat:7.3f} s")
    print(f"  kvstore verify           {t_kv:7.3f} s {gbs(t_kv):6.2f} GB/s  {c_kv:7.3f} s")
    print(f"  python read+zlib.crc32   {t_py:7.3f} s {gbs(t_py):6.2f} GB/s  {c_py:7.3f} s")
    print(f"  ratio verify/cat    wall {t_cat / t_kv:5.2f}x  cpu {c_cat / c_kv:5.2f}x  (goal >= 0.9x)")
    print(f"  ratio verify/python wall {t_py / t_kv:5.2f}x  cpu {c_py / c_kv:5.2f}x  (goal >= 4x)")


def bench_gc(a: argparse.Namespace, kv: str, threads: list[str], root: Path) -> None:
    small = make_small(root / "small", a.small_files, 200 if not a.smoke else 20, a.small_bytes)
    n = sum(1 for _ in small.rglob("*.bin"))
    print(f"gc: {n} small chunks under {small}")
    find = f"find {small} -type f | wc -l"
    run_quiet(find, shell=True)
    t_find, c_find = best(lambda: run_quiet(find, shell=True), a.repeat)
    t_gc, c_gc = best(lambda: run_quiet([kv, "gc", "--quiet", *threads, str(small)]), a.repeat)
    print(f"  find -type f | wc -l     {t_find:7.3f} s  cpu {c_find:7.3f} s")
    print(f"  kvstore gc (dry run)     {t_gc:7.3f} s  cpu {c_gc:7.3f} s")
    print(f"  ratio gc/find       wall {t_gc / t_find:5.2f}x  cpu {c_gc / c_find:5.2f}x  (goal <= 2x)")


if __name__ == "__main__":
    sys.exit(main())
