#!/usr/bin/env python3
"""How long `overlay plan` takes to answer a drifted anchor, by anchor size.

The nearest-match search behind a drift report used to be super-linear in the
anchor's length (a 100 KB anchor took 9 s, 1 MB 114 s) and a 200 MB manifest
was refused only after 31 s. This builds a synthetic engine tree with one large
target file and, for each size, a manifest whose anchor almost matches a
stretch of it (so the search has to work), runs `overlay plan` a few times and
prints the median wall time and the exit code. Anchors above the 64 KiB limit
and oversized manifests must be refused with exit 2, quickly.

    python3 bench/overlay_drift_bench.py --overlay build/patcher/overlay
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import subprocess
import tempfile
import time
from pathlib import Path


def target_text(lines: int) -> str:
    out = ["class Engine:", "    def step(self, batch):"]
    for i in range(lines):
        out.append(
            f"        value_{i} = compute(batch, index={i}, scale={i % 97} * self.factor_{i % 13})"
        )
    return "\n".join(out) + "\n"


def anchor_for(text_lines: list[str], size: int) -> str:
    """A stretch of the target about `size` bytes long, one character changed per line."""
    picked, total = [], 0
    for line in text_lines[1000:]:
        if total >= size:
            break
        picked.append(line.replace("compute", "kompute", 1))
        total += len(line) + 1
    return "\n".join(picked)


def write_case(root: Path, anchor: str, manifest_padding: int = 0) -> tuple[Path, Path]:
    tree = root / "tree"
    manifests = root / "anchors" / "bench-1.0"
    frags = root / "overlays" / "bench-edit"
    for d in (tree / "bench", manifests, frags):
        d.mkdir(parents=True, exist_ok=True)
    target = tree / "bench" / "engine.py"
    sha = hashlib.sha256(target.read_bytes()).hexdigest()
    (frags / "hook.py").write_text("pass\n")
    toml = (
        'format = 1\noverlay = "bench-edit"\nengine = "bench"\nengine_version = "1.0"\n\n'
        f'[[files]]\npath = "bench/engine.py"\nsha256 = "{sha}"\n\n'
        f"  [[files.edits]]\n  id = \"hook\"\n  anchor = '''\n{anchor}\n'''\n"
        '  action = "insert_after"\n  fragment = "hook.py"\n'
    )
    if manifest_padding:
        toml += "# " + "x" * manifest_padding + "\n"
    (manifests / "bench-edit.toml").write_text(toml)
    return tree, manifests


def run(overlay: str, tree: Path, manifests: Path, repeat: int) -> tuple[float, int]:
    times, code = [], 0
    for _ in range(repeat):
        start = time.perf_counter()
        p = subprocess.run(
            [overlay, "plan", "--root", str(tree), "--manifests", str(manifests)],
            capture_output=True,
        )
        times.append(time.perf_counter() - start)
        code = p.returncode
    return statistics.median(times), code


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--overlay", default="build/patcher/overlay")
    ap.add_argument("--lines", type=int, default=20000, help="lines in the target file")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print(f"target: {args.lines} lines; median of {args.repeat} runs of `overlay plan`")
    print(f"{'case':<34} {'seconds':>8} {'exit':>5}")
    cases = [
        ("anchor 1 KiB", 1 << 10, 0),
        ("anchor 16 KiB", 16 << 10, 0),
        ("anchor 64 KiB (the limit)", 63 << 10, 0),
        ("anchor 100 KB (over the limit)", 100_000, 0),
        ("anchor 1 MB (over the limit)", 1_000_000, 0),
        ("manifest 200 MB (over the limit)", 1 << 10, 200_000_000),
    ]
    with tempfile.TemporaryDirectory(prefix="overlay-bench-") as tmp:
        text = target_text(args.lines)
        for i, (name, size, pad) in enumerate(cases):
            root = Path(tmp) / f"case{i}"
            (root / "tree" / "bench").mkdir(parents=True, exist_ok=True)
            (root / "tree" / "bench" / "engine.py").write_text(text)
            tree, manifests = write_case(root, anchor_for(text.splitlines(), size), pad)
            secs, code = run(args.overlay, tree, manifests, args.repeat)
            print(f"{name:<34} {secs:>8.3f} {code:>5}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
