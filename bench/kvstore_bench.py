#!/usr/bin/env python3
"""kvstore benchmark: prints each figure, each ratio and the commands behind it
(not a test; no pass/fail).

Parts (--only picks one; default all):
  verify-large  27 MiB chunks (2.1 GiB) in the page cache, in two states:
                "written" (the files were just rewritten, then synced) and
                "re-read" (evicted with fadvise(DONTNEED), then read back by
                cat). `kvstore verify` against the C reference bench/read_crc.c
                with the same access pattern (pread 512 KiB, mmap the rest, as
                many threads); also `cat` and a Python read + zlib.crc32 loop.
  verify-small  40,000 chunks of 64 KiB: `kvstore verify` against read_crc.c
                (one pread per file, same threads) fed a list of the files,
                and read_crc.c -w, which finds the files itself by walking
                the store as kvstore must (also with -n, which spares the
                fstat of a file its first read returned whole, as verify
                does); also find alone and the Python loop.
  gc            200,000 small chunks (1,000 chains of 200, one manifest each):
                `kvstore gc` (dry run) against `find ROOT -type f | wc -l`,
                with kvstore's peak RSS.
  gc-manifests  110,000 chunks and 10,000 manifests (1,000 chains, a manifest
                every 11 chunks): the same comparison.
  sweep         200,000 chunks of which 100,000 are orphans: `kvstore gc
                --sweep --grace 0` against `xargs rm -f` of the same files then
                `sync`, and against `find -newer STAMP -delete` (which walks
                the store, as kvstore does) with and without `sync`; the
                orphans are re-created before every run.

Each figure is the best of --repeat runs (commands alternate within a
repeat), as wall time and as CPU time (user + system of the command). Each
ratio is printed twice: of the best runs, and as the median of the ratios
of the runs that shared a repeat. Stores are generated once under --dir and
reused. --smoke runs tiny sizes (CI).

usage: bench/kvstore_bench.py [--kvstore build/kvstore/kvstore] [--dir /tmp/kvstore-bench]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for folder in ("overlays/kv-offload-store-local", "sim"):
    sys.path.insert(0, str(REPO / folder))
# The format codec is the native store library's: this checkout's build
# unless KVTIER_STORE_LIB names another.
os.environ.setdefault(
    "KVTIER_STORE_LIB", str(REPO / "build" / "storeio" / "libkvtier_store.so")
)

import kv_store_format  # noqa: E402
from bench_fenced import bench_fenced  # noqa: E402
from chunk_calls import ChunkCalls  # noqa: E402
from page_cache import evict  # noqa: E402

fmt = ChunkCalls(kv_store_format)  # the package, and the chunk calls of sim/

MiB = 1 << 20
GiB = 1 << 30


class Writer:
    """Writes one rank's chunks fast: no temps, no fsync (bench data only)."""

    def __init__(self, tier: Path, model: str) -> None:
        self.fenced = bench_fenced(model)
        self.ns = fmt.namespace_hash(self.fenced)
        self.layout = fmt.StoreLayout.create(str(tier), model, self.ns, 0)
        tier.mkdir(parents=True, exist_ok=True)
        Path(self.layout.namespace_record).write_bytes(
            fmt.encode_namespace_record(
                fmt.NamespaceRecord(self.fenced, {"keep_boundaries": 2})
            )
        )
        self.dirs: set[str] = set()

    def chunk(self, key: str, boundary: int, payload: bytes) -> fmt.ManifestEntry:
        segs = fmt.make_segments(
            [(0, fmt.SegmentKind.KV, fmt.DType.UINT8, (len(payload),), (1,))]
        )
        header = fmt.make_header(
            self.ns, 0, bytes.fromhex(key), boundary, segs, payload
        )
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

    def manifest(
        self, chain: list[str], entries: list[fmt.ManifestEntry], tokens: int
    ) -> None:
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
            print(
                f"  generated {len(chain) * (c + 1)} files, {time.monotonic() - t0:.0f} s",
                flush=True,
            )
    return base


@dataclass
class Took:
    wall: float
    cpu: float
    rss_mib: float


GNU_TIME = "/usr/bin/time"
RSS_FILE = Path(tempfile.gettempdir()) / f"kvstore-bench-rss.{os.getpid()}"


def measure(cmd: list[str] | str) -> Took:
    """Runs one command: wall time, CPU time (user + system, wait4) and, for
    a plain command line, peak RSS through GNU time (0 where unknown)."""
    rss = isinstance(cmd, list) and os.path.exists(GNU_TIME)
    argv = [GNU_TIME, "-f", "%M", "-o", str(RSS_FILE), *cmd] if rss else cmd
    t0 = time.perf_counter()
    p = subprocess.Popen(
        argv,
        shell=isinstance(cmd, str),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    err = p.stderr.read().decode()[-400:] if p.stderr else ""
    code = os.waitstatus_to_exitcode(status)
    if code not in (0, 1):  # 1: kvstore found orphans, which the bench stores have
        raise SystemExit(f"{shown(cmd)}: exit {code}: {err}")
    rss_mib = int(RSS_FILE.read_text().split()[-1]) / 1024 if rss else 0.0
    return Took(wall, ru.ru_utime + ru.ru_stime, rss_mib)


def best(runs: list[Took]) -> Took:
    return Took(
        min(r.wall for r in runs),
        min(r.cpu for r in runs),
        max(r.rss_mib for r in runs),
    )


def shown(cmd: list[str] | str) -> str:
    if isinstance(cmd, str):
        return cmd
    if cmd[1:2] == ["-c"]:
        cmd = [cmd[0], "-c", repr(cmd[2]), *cmd[3:]]
    return " ".join(cmd if len(cmd) < 8 else [*cmd[:5], f"... ({len(cmd) - 5} files)"])


def report(
    title: str, rows: list[tuple[str, list[str] | str, Took]], nbytes: int = 0
) -> None:
    print(title)
    for label, cmd, t in rows:
        rate = f" {nbytes / t.wall / 1e9:6.2f} GB/s" if nbytes else ""
        peak = f"  peak RSS {t.rss_mib:7.1f} MiB" if t.rss_mib else ""
        print(f"  {label:<26} {t.wall:8.3f} s{rate}  cpu {t.cpu:7.3f} s{peak}")
        print(f"      $ {shown(cmd)}")


def ratio(label: str, num: list[Took], den: list[Took], goal: str) -> None:
    """The ratio of the best runs, then the median of the per-repeat ratios:
    the runs alternate, so run i of each command shares the machine's state."""
    b_num, b_den = best(num), best(den)
    wall = statistics.median(n.wall / d.wall for n, d in zip(num, den, strict=True))
    cpu = statistics.median(n.cpu / d.cpu for n, d in zip(num, den, strict=True))
    print(
        f"  ratio {label:<28} wall {b_num.wall / b_den.wall:5.2f}x  cpu {b_num.cpu / b_den.cpu:5.2f}x"
        f"  (median of {len(num)} rounds: wall {wall:5.2f}x  cpu {cpu:5.2f}x)  ({goal})"
    )


def chunk_files(base: Path) -> list[str]:
    return sorted(str(p) for p in base.rglob("*.bin"))


def rewrite(files: list[str]) -> None:
    """Writes every file's bytes again: its pages are now freshly written."""
    for f in files:
        data = Path(f).read_bytes()
        evict([f])
        fd = os.open(f, os.O_WRONLY)
        try:
            view = memoryview(data)
            while view:
                view = view[os.pwrite(fd, view, len(data) - len(view)) :]
        finally:
            os.close(fd)
    os.sync()


def file_list(root: Path, name: str, files: list[str]) -> str:
    """The files one a line: commands take the list, not argv (ARG_MAX)."""
    path = root / f"{name}.list"
    path.write_text("".join(f + "\n" for f in files))
    return str(path)


def read_back(files: list[str]) -> None:
    evict(files)
    for i in range(0, len(files), 1000):
        subprocess.run(
            ["cat", *files[i : i + 1000]], stdout=subprocess.DEVNULL, check=True
        )


def c_reference(root: Path) -> str:
    """Compiles bench/read_crc.c (ISA-L when its header exists, else zlib)."""
    out = root / "read_crc"
    src = REPO / "bench" / "read_crc.c"
    if not out.exists() or out.stat().st_mtime < src.stat().st_mtime:
        root.mkdir(parents=True, exist_ok=True)
        isal = Path("/usr/include/isa-l/crc.h").exists()
        flags = ["-DHAVE_ISAL", "-lisal"] if isal else ["-lz"]
        subprocess.run(
            ["cc", "-O2", "-o", str(out), str(src), *flags, "-lpthread"], check=True
        )
    return str(out)


def py_crc_loop(listing: str) -> list[str]:
    code = "import sys, zlib\nfor f in open(sys.argv[1]).read().splitlines(): zlib.crc32(open(f, 'rb').read())"
    return [sys.executable, "-c", code, listing]


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--kvstore", default=str(REPO / "build" / "kvstore" / "kvstore"))
    ap.add_argument("--dir", default="/tmp/kvstore-bench")
    ap.add_argument("--big-gib", type=float, default=2.1)
    ap.add_argument("--chunk-mib", type=float, default=27)
    ap.add_argument("--small-files", type=int, default=200_000)
    ap.add_argument("--small-bytes", type=int, default=1024)
    ap.add_argument("--verify-files", type=int, default=40_000)
    ap.add_argument("--verify-kib", type=int, default=64)
    ap.add_argument("--manifest-chains", type=int, default=1_000)
    ap.add_argument("--sweep-files", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--threads",
        type=int,
        default=0,
        help="kvstore --threads (0: its default, min(4, cores))",
    )
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, one repeat (CI)")
    ap.add_argument("--only", choices=PARTS, help="run one part")
    a = ap.parse_args()
    if a.smoke:
        a.big_gib, a.chunk_mib, a.small_files, a.repeat = 0.01, 1, 400, 1
        a.verify_files, a.manifest_chains, a.sweep_files = 100, 4, 400
    a.kv_threads = ["--threads", str(a.threads)] if a.threads else []
    a.ref_threads = str(a.threads or min(4, os.cpu_count() or 1))
    root = Path(a.dir)
    print(
        f"machine: {platform.node()} {platform.machine()} {os.cpu_count()} cpus, "
        f"{platform.system()} {platform.release()}, python {platform.python_version()}; "
        f"load average before: {' '.join(f'{x:.1f}' for x in os.getloadavg())}"
    )
    for name, fn in PARTS.items():
        if a.only in (None, name):
            fn(a, root)
    print(
        f"load average after the run: {' '.join(f'{x:.1f}' for x in os.getloadavg())}"
    )
    return 0


def bench_verify_large(a: argparse.Namespace, root: Path) -> None:
    big = make_big(root / "big", int(a.big_gib * GiB), int(a.chunk_mib * MiB))
    files = chunk_files(big)
    total = sum(os.path.getsize(f) for f in files)
    ref = c_reference(root)
    listing = file_list(root, "big", files)
    kv = [a.kvstore, "verify", "--quiet", *a.kv_threads, str(big)]
    c = [ref, "-m", "-t", a.ref_threads, listing]
    for state, prepare in (("written", rewrite), ("re-read", read_back)):
        runs: dict[str, list[Took]] = {"kv": [], "c": []}
        for _ in range(a.repeat):
            for name, cmd in (("kv", kv), ("c", c)):
                prepare(files)
                runs[name].append(measure(cmd))
        report(
            f"verify-large ({state}): {len(files)} chunks, {total / GiB:.2f} GiB",
            [
                ("kvstore verify", kv, best(runs["kv"])),
                ("C read+CRC (same pattern)", c, best(runs["c"])),
            ],
            total,
        )
        ratio("verify/C reference", runs["kv"], runs["c"], "goal <= 1.1x")
    cat = f"xargs cat < {listing} > /dev/null"
    py = py_crc_loop(listing)
    warm: dict[str, list[Took]] = {"cat": [], "py": [], "kv": []}
    for _ in range(a.repeat):
        for name, cmd in (("cat", cat), ("py", py), ("kv", kv)):
            warm[name].append(measure(cmd))
    report(
        "verify-large (warm) against cat and Python",
        [
            ("kvstore verify", kv, best(warm["kv"])),
            ("cat > /dev/null", cat, best(warm["cat"])),
            ("python read+zlib.crc32", py, best(warm["py"])),
        ],
        total,
    )
    ratio(
        "cat/verify (speed)",
        warm["cat"],
        warm["kv"],
        "speed ratio: goal >= 0.9x means verify/cat time <= 1.11x",
    )
    ratio("verify/python (time)", warm["kv"], warm["py"], "goal <= 0.25x")


def bench_verify_small(a: argparse.Namespace, root: Path) -> None:
    base = make_small(
        root / "verify-small",
        a.verify_files,
        200 if not a.smoke else 20,
        a.verify_kib << 10,
    )
    files = chunk_files(base)
    total = sum(os.path.getsize(f) for f in files)
    ref = c_reference(root)
    listing = file_list(root, "verify-small", files)
    kv = [a.kvstore, "verify", "--quiet", *a.kv_threads, str(base)]
    c = [ref, "-t", a.ref_threads, listing]
    c_walk = [ref, "-t", a.ref_threads, "-w", str(base)]
    c_lean = [ref, "-t", a.ref_threads, "-n", "-w", str(base)]
    find = f"find {base} -type f | wc -l"
    py = py_crc_loop(listing)
    read_back(files)
    cmds = {
        "kv": kv,
        "c": c,
        "c_walk": c_walk,
        "c_lean": c_lean,
        "find": find,
        "py": py,
    }
    runs: dict[str, list[Took]] = {name: [] for name in cmds}
    for _ in range(a.repeat):
        for name, cmd in cmds.items():
            runs[name].append(measure(cmd))
    t = {name: best(r) for name, r in runs.items()}
    dirs = sum(1 for _ in base.rglob("*") if _.is_dir())
    report(
        f"verify-small: {len(files)} chunks of {a.verify_kib} KiB in {dirs} folders, {total / GiB:.2f} GiB, in the page cache",
        [
            ("kvstore verify", kv, t["kv"]),
            ("C read+CRC of a list", c, t["c"]),
            ("C walk+read+CRC", c_walk, t["c_walk"]),
            ("C walk+read+CRC, no fstat of a whole read", c_lean, t["c_lean"]),
            ("find -type f (walk only)", find, t["find"]),
            ("python read+zlib.crc32", py, t["py"]),
        ],
        total,
    )
    # kvstore must find the files itself; the list-fed reference is told them.
    ratio("verify/C walk+read+CRC", runs["kv"], runs["c_walk"], "goal <= 1.0x")
    ratio(
        "verify/C walk+read+CRC, no fstat",
        runs["kv"],
        runs["c_lean"],
        "the same syscalls per chunk as verify",
    )
    ratio(
        "verify/C read+CRC of a list",
        runs["kv"],
        runs["c"],
        "goal <= 1.0x; the list spares the walk",
    )
    ratio("verify/python", runs["kv"], runs["py"], "goal < 1x")


def gc_against_find(a: argparse.Namespace, base: Path, title: str, goal: str) -> None:
    n = sum(1 for _ in base.rglob("*.json")) + sum(1 for _ in base.rglob("*.bin"))
    find = f"find {base} -type f | wc -l"
    kv = [a.kvstore, "gc", "--quiet", *a.kv_threads, str(base)]
    measure(find)
    runs: dict[str, list[Took]] = {"kv": [], "find": []}
    for _ in range(a.repeat):
        runs["find"].append(measure(find))
        runs["kv"].append(measure(kv))
    t_kv, t_find = best(runs["kv"]), best(runs["find"])
    report(
        f"{title}: {n} files under {base}",
        [("find -type f | wc -l", find, t_find), ("kvstore gc (dry run)", kv, t_kv)],
    )
    ratio("gc/find", runs["kv"], runs["find"], goal)


def bench_gc(a: argparse.Namespace, root: Path) -> None:
    base = make_small(
        root / "small", a.small_files, 200 if not a.smoke else 20, a.small_bytes
    )
    gc_against_find(a, base, "gc", "goal <= 1.4x")


def bench_gc_manifests(a: argparse.Namespace, root: Path) -> None:
    base = make_manifest_heavy(
        root / "manifests", a.manifest_chains, 110, 11, a.small_bytes
    )
    gc_against_find(a, base, "gc-manifests", "goal <= 2x")


def make_manifest_heavy(
    tier: Path, chains: int, per_chain: int, every: int, size: int
) -> Path:
    w = Writer(tier, "bench-manifests")
    base = Path(w.layout.base)
    if (base / "manifests").is_dir():
        return base
    payload = os.urandom(size)
    for c in range(chains):
        chain, entries = [], []
        for j in range(per_chain):
            k = key(c * per_chain + j, "heavy")
            chain.append(k)
            entries.append(w.chunk(k, (j + 1) * 16, payload))
            if (j + 1) % every == 0:
                w.manifest(chain, entries, 16)
    return base


def bench_sweep(a: argparse.Namespace, root: Path) -> None:
    half = a.sweep_files // 2
    base = make_small(root / "sweep", half, 200 if not a.smoke else 20, a.small_bytes)
    w = Writer(root / "sweep", "bench-small")
    payload = os.urandom(a.small_bytes)
    orphans = [w.layout.chunk(key(i, "orphan"), 0) for i in range(half)]
    listing = root / "sweep-orphans.txt"
    listing.write_text("\n".join(orphans) + "\n")

    def recreate() -> None:
        for i in range(half):
            w.chunk(key(i, "orphan"), 16, payload)
        os.sync()

    # The orphans are the only files newer than the stamp, so find can name
    # them the way kvstore must: by walking the whole store.
    stamp = root / "sweep-stamp"
    stamp.touch()
    kv = [
        a.kvstore,
        "gc",
        "--sweep",
        "--grace",
        "0",
        "--quiet",
        *a.kv_threads,
        str(base),
    ]
    cmds = {
        "kv": kv,
        "rm": f"xargs rm -f < {listing} && sync",
        "find": f"find {base} -type f -newer {stamp} -delete",
        "find_sync": f"find {base} -type f -newer {stamp} -delete && sync",
    }
    runs: dict[str, list[Took]] = {name: [] for name in cmds}
    for _ in range(max(2, a.repeat) if not a.smoke else 1):
        for name, cmd in cmds.items():
            recreate()
            runs[name].append(measure(cmd))
            assert not any(os.path.exists(o) for o in orphans[:50]), (
                f"{shown(cmd)} left orphans"
            )
    t = {name: best(r) for name, r in runs.items()}
    report(
        f"sweep: {a.sweep_files} chunks, {half} of them orphans deleted per run",
        [
            ("kvstore gc --sweep", kv, t["kv"]),
            ("xargs rm -f + sync", cmds["rm"], t["rm"]),
            ("find -delete", cmds["find"], t["find"]),
            ("find -delete + sync", cmds["find_sync"], t["find_sync"]),
        ],
    )
    ratio("sweep/(rm + sync)", runs["kv"], runs["rm"], "goal <= 1.3x")
    ratio(
        "sweep/(find -delete + sync)",
        runs["kv"],
        runs["find_sync"],
        "goal <= 1.0x; both walk, kvstore also reads headers",
    )
    ratio(
        "sweep/find -delete (no sync)",
        runs["kv"],
        runs["find"],
        "kvstore's deletes are durable when it exits",
    )


PARTS = {
    "verify-large": bench_verify_large,
    "verify-small": bench_verify_small,
    "gc": bench_gc,
    "gc-manifests": bench_gc_manifests,
    "sweep": bench_sweep,
}


if __name__ == "__main__":
    sys.exit(main())
