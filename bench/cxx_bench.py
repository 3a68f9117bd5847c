#!/usr/bin/env python3
"""Times the C/C++ backend on the pinned vLLM sources: one Clang parse per file
(what scope resolution and the compile check each cost), and the engine's
plan / apply --check-injected / wheel rebuild of overlay vllm-fs-durable.

    python3 bench/cxx_bench.py [--build build] [--repeat 5]

Prints a table of medians. "parse" is the time kvtier-cxxscope reports for the
parse itself; "process" adds starting the tool (loading libclang-cpp). Needs
the sources and built pins fetched (scripts/setup.sh does it).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PIN_DIR = REPO / "fixtures" / "vllm-0.33.0"
PY_INCLUDE = sysconfig.get_paths()["include"]
FILES = {  # file -> flags, as the manifests give them ({python_include} expanded)
    "csrc/fs_io.cpp": ["-std=c++17", "-DPy_LIMITED_API=0x030B0000", f"-I{PY_INCLUDE}"],
    "csrc/cache_kernels.cu": ["-std=c++17", "-Icsrc"],
    "csrc/cache_kernels.cu -DCUDA_VERSION=13000": [
        "-std=c++17",
        "-Icsrc",
        "-DCUDA_VERSION=13000",
    ],
}


def fetch(kind: str) -> Path:
    out = subprocess.run(
        [sys.executable, str(REPO / "fixtures/fetch.py"), "--pins", str(PIN_DIR / "PINS"), f"--{kind}"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return Path(out.stdout.strip())


def timed(cmd: list[str], **kw) -> tuple[float, subprocess.CompletedProcess]:
    t = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, **kw)
    return time.perf_counter() - t, done


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=str(REPO / "build"))
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    build = Path(args.build).resolve()
    tool = build / "cxxscope" / "kvtier-cxxscope"
    overlay = build / "patcher" / "overlay"
    sources, built = fetch("sources"), fetch("built")

    print(
        f"{'file':48} {'parse s':>8} {'process s':>10} {'defs':>5} {'errors':>7} {'missing hdrs':>12}"
    )
    for label, flags in FILES.items():
        rel = label.split()[0]
        req = json.dumps([{"root": str(sources), "file": rel, "args": flags}])
        parse, wall = [], []
        for _ in range(args.repeat):
            t, done = timed([str(tool)], input=req)
            res = json.loads(done.stdout)[0]
            parse.append(res["seconds"])
            wall.append(t)
        print(
            f"{label:48} {statistics.median(parse):8.3f} {statistics.median(wall):10.3f} "
            f"{len(res['definitions']):5d} {len(res['diagnostics']):7d} {len(res['missing_headers']):12d}"
        )

    print()
    print(f"{'engine, overlay vllm-fs-durable':48} {'median s':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        common = [
            "--manifests",
            str(REPO / "anchors/vllm-0.33.0"),
            "--overlays",
            "vllm-fs-durable",
        ]
        rows: dict[str, list[float]] = {}
        for _ in range(args.repeat):
            src = Path(tmp) / "src"
            shutil.rmtree(src, ignore_errors=True)
            shutil.copytree(sources, src)
            o = [str(overlay)]
            for name, cmd in (
                (
                    "source tree: plan (scope resolution)",
                    [*o, "plan", "--root", str(src), *common],
                ),
                (
                    "source tree: apply --check-injected",
                    [*o, "apply", "--check-injected", "--root", str(src), *common],
                ),
                ("source tree: revert", [*o, "revert", "--root", str(src), *common]),
            ):
                t, done = timed(cmd)
                if done.returncode != 0:
                    print(done.stderr, file=sys.stderr)
                    return 1
                rows.setdefault(name, []).append(t)
            whl = Path(tmp) / "whl"
            shutil.rmtree(whl, ignore_errors=True)
            (whl / "vllm").mkdir(parents=True)
            shutil.copy2(built / "vllm/fs_io_C.abi3.so", whl / "vllm/fs_io_C.abi3.so")
            (whl / "vllm/_version.py").write_text('__version__ = version = "0.33.0"\n')
            for name, cmd in (
                ("wheel: apply --check-injected (rebuild .so)",
                 [*o, "apply", "--check-injected", "--sources", str(sources), "--root", str(whl), *common]),
                ("wheel: revert", [*o, "revert", "--root", str(whl), *common]),
            ):  # fmt: skip
                t, done = timed(cmd)
                if done.returncode != 0:
                    print(done.stderr, file=sys.stderr)
                    return 1
                rows.setdefault(name, []).append(t)
        for name, ts in rows.items():
            print(f"{name:48} {statistics.median(ts):8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
