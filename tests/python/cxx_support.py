"""Helpers for the C/C++ tests: the pinned source tree, the scope tool, and
a site-packages-like tree holding the wheel's built extension."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT

FETCH = REPO_ROOT / "fixtures" / "fetch.py"


def pin_dirs_with(name: str) -> list[Path]:
    """Pin sets that have the given pin file (SDIST, BUILT)."""
    return sorted(p.parent for p in REPO_ROOT.glob(f"fixtures/*/{name}"))


def fetch(pin_dir: Path, kind: str) -> Path:
    """fixtures/fetch.py --sources or --built for one pin set; the tree path."""
    done = subprocess.run(
        [sys.executable, str(FETCH), "--pins", str(pin_dir / "PINS"), f"--{kind}"],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.fail(f"fetch.py --{kind} failed ({done.returncode}): {done.stderr}")
    return Path(done.stdout.strip())


def pins(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            digest, name = line.split(maxsplit=1)
            out[name.strip()] = digest
    return out


def scope_tool(build_dir: Path) -> Path:
    path = build_dir / "cxxscope" / "kvtier-cxxscope"
    if not path.is_file():
        pytest.skip(f"{path} is not built (Clang 14 LibTooling missing?)")
    return path


def run_scope(tool: Path, requests: list[dict]) -> list[dict]:
    done = subprocess.run(
        [str(tool)], input=json.dumps(requests), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def copy_tree(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    for p in dst.rglob("*"):
        if p.is_file():
            p.chmod(0o644)
    return dst
