"""What the restore cost guard's prefill fit costs the scheduler's thread.

    python3 bench/cost_fit_bench.py [--steps 256] [--outliers 0,0.1,0.4] [--repeat 5]

The guard refits whenever a step was timed since the last lookup that weighed a
restore, on the scheduler's thread, so a lookup pays it. This bench fills a
``PrefillRate`` window with ``--steps`` steps of an 8B-like engine (20 ms a step,
120 us a token, 1.5 ns a token per token of context; 512, 2,048 or 8,192 tokens at
contexts up to 60k) of which a share ``--outliers`` is 4-30x slower (kernel compiles,
pauses), and prints per share the fit's time (best of ``--repeat``), the steps it
dropped and its coefficients against the true ones.
"""

from __future__ import annotations

import argparse
import importlib
import random
import sys
import time
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def load_cost():
    # The overlay's modules import each other relatively: load them as a package.
    pkg = types.ModuleType("kv_offload_restore")
    pkg.__path__ = [str(REPO / "overlays" / "kv-offload-restore")]
    sys.modules["kv_offload_restore"] = pkg
    return importlib.import_module("kv_offload_restore.kv_restore_cost")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--outliers", default="0,0.1,0.4")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    cost = load_cost()
    true = (0.02, 120e-6, 1.5e-9)
    print("outliers  fit ms  dropped  c, a, b (true: 0.02, 1.2e-04, 1.5e-09)")
    for share in (float(x) for x in args.outliers.split(",")):
        rng = random.Random(1)
        points = []
        for _ in range(args.steps):
            n, ctx = rng.choice((512, 2048, 8192)), rng.uniform(0, 60000)
            s = true[0] + true[1] * n + true[2] * n * ctx
            points.append(
                (n, ctx, s * rng.uniform(4, 30) if rng.random() < share else s)
            )
        best = float("inf")
        for _ in range(args.repeat):
            rate = cost.PrefillRate(chunk=8192)
            for p in points:
                rate.observe(*p)
            t = time.perf_counter()
            fit = rate.coefficients()
            best = min(best, time.perf_counter() - t)
        c, a, b = fit
        print(
            f"{share:8.2f}  {best * 1e3:6.1f}  {rate.trimmed:7d}  {c:.3g}, {a:.3g}, {b:.3g}"
        )


if __name__ == "__main__":
    main()
