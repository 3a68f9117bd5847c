"""Which vLLM release the real-vLLM tier runs, and where its package is.

One venv (scripts/real-venv.sh) holds the newest pinned release with its
dependencies; every other pinned release runs in it from its own package tree
(fixtures/fetch.py --package: the wheel's Python files and dist-info), put
first on the path. KVTIER_RELEASE picks one (e.g. vllm-0.33.0); the default
is the venv's own. tests/realsched and tests/upstream both use this.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def installed_release() -> str:
    """The release pip installed in this interpreter's site-packages."""
    purelib = Path(sysconfig.get_paths()["purelib"])
    found = sorted(purelib.glob("vllm-*.dist-info"))
    if not found:
        raise RuntimeError(f"{sys.executable} has no installed vllm")
    return found[-1].name.removesuffix(".dist-info")


def release() -> str:
    wanted = os.environ.get("KVTIER_RELEASE") or installed_release()
    if (
        not re.fullmatch(r"vllm-[0-9][0-9.]*", wanted)
        or not (REPO / "fixtures" / wanted / "PINS").is_file()
    ):
        raise RuntimeError(f"KVTIER_RELEASE={wanted}: no fixtures/{wanted}/PINS")
    return wanted


@functools.cache
def package_root(name: str) -> Path | None:
    """The folder to put first on the path for release ``name`` (holding
    vllm/ and its dist-info), or None when it is the installed one."""
    if name == installed_release():
        return None
    done = subprocess.run(
        [sys.executable, str(REPO / "fixtures" / "fetch.py"), "--pins",
         str(REPO / "fixtures" / name / "PINS"), "--package"],
        capture_output=True, text=True,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"fetch.py --package {name}: {done.stderr.strip()}")
    return Path(done.stdout.strip())


def subprocess_path(*first: str) -> str | None:
    """PYTHONPATH for a child that runs the release under test: ``first``
    (a patched tree), then the release's package tree if it is not the
    venv's; None when nothing is needed."""
    root = package_root(release())
    paths = [*first, *([str(root)] if root is not None else [])]
    return os.pathsep.join(paths) or None


def package_dir(name: str) -> Path:
    """The release's vllm package folder (to copy and patch)."""
    root = package_root(name)
    if root is None:
        return Path(sysconfig.get_paths()["purelib"]) / "vllm"
    return root / "vllm"
