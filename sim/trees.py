"""Patched copies of the pinned engine tree, made by the real `overlay` tool."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path


def run_overlay(overlay_bin, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(overlay_bin), *map(str, args)], capture_output=True, text=True, timeout=120
    )


def patched_copy(
    overlay_bin,
    engine_tree: Path,
    dst: Path,
    manifests: Path,
    overlays: str,
    *,
    fragments: Path | None = None,
    check_injected: bool = False,
) -> Path:
    """Copy the pristine tree to ``dst/site-packages`` and apply ``overlays``
    (comma-separated) with `overlay apply`; returns the copy's root."""
    root = Path(dst) / "site-packages"
    shutil.copytree(engine_tree, root, ignore=shutil.ignore_patterns("__pycache__"))
    args = ["apply", "--root", root, "--manifests", manifests, "--overlays", overlays]
    if fragments is not None:
        args += ["--fragments", fragments]
    if check_injected:
        args.append("--check-injected")
    done = run_overlay(overlay_bin, *args)
    if done.returncode != 0:
        raise AssertionError(f"overlay apply {overlays}: {done.stdout}{done.stderr}")
    return root
