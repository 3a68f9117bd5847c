"""The benchmarks still run against the code they measure.

A benchmark prints figures and is not a test, but one that drifted from the
overlays' interfaces prints wrong figures without saying so:
bench/engine_thread_bench.py's stand-in for the CUDA store device took one
argument where the adapter passes two, so every capture silently fell back
to the slow copy out of staging. Each benchmark must at least import, and the
engine-thread benchmark must run its knob-1 steps on the path it claims to
measure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO_ROOT

BENCH = REPO_ROOT / "bench"
# Modules the benchmarks import, not benchmarks themselves.
HELPERS = {"bench_fenced.py", "page_cache.py"}


@pytest.mark.parametrize(
    "script",
    sorted(p.name for p in BENCH.glob("*.py") if p.name not in HELPERS),
)
def test_a_benchmark_imports_what_it_measures(script, build_dir):
    res = subprocess.run(
        [sys.executable, str(BENCH / script), "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "KVTIER_BUILD_DIR": str(build_dir)},
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert "usage" in res.stdout.lower()


def test_the_engine_thread_benchmark_captures_on_the_store_device(build_dir, tmp_path):
    lib = build_dir / "storeio" / "libkvtier_store.so"
    if not lib.is_file():
        pytest.skip(f"{lib} is not built")
    out = tmp_path / "bench.json"
    res = subprocess.run(
        [sys.executable, str(BENCH / "engine_thread_bench.py"), "--jobs", "20",
         "--dir", str(tmp_path / "store"), "--json", str(out)],
        capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "KVTIER_BUILD_DIR": str(build_dir)},
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    # The adapter's fallback says so; the benchmark must not measure it.
    assert "first capture from staging" not in res.stdout + res.stderr
    on = next(r for r in json.loads(out.read_text()) if r["knob"] == "1")
    stats = on["stats"]
    assert stats["jobs_captured"] > 0
    assert stats["jobs_queued_on_device"] == stats["jobs_captured"]
    assert stats["keys_written"] > 0
    assert on["writer_drained"]
