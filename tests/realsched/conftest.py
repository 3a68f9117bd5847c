"""The real-scheduler tier: runs under the venv that scripts/real-venv.sh builds.

    $(scripts/real-venv.sh) -m pytest -q tests/realsched
    KVTIER_RELEASE=vllm-0.33.0 $(scripts/real-venv.sh) -m pytest -q tests/realsched

At import (before any test module imports vllm) this copies the release's vllm package (the
venv's installed one, or another pinned release's package tree: tests/real_release.py) as
hard links into a scratch folder on the same disk, applies the overlays with the real
`overlay apply --check-injected` (KVTIER_BUILD_DIR, default build/, holds patcher/overlay),
and puts the copy first on sys.path. `overlay apply` replaces each patched file by rename, so
the package's own files stay pristine (checked against the pins); the pristine engine runs in
a subprocess with only the release's package tree on its path (realsched_trace.py).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
OVERLAYS = "kv-offload-scope,kv-offload-store-local,kv-offload-restore"
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(REPO / "sim"))  # chunk_calls
import real_release  # noqa: E402

RELEASE = real_release.release()
# Block hashes (and so offload keys) must not depend on the process: the pristine engine
# runs in a subprocess and its keys are compared with this one's.
os.environ["PYTHONHASHSEED"] = "0"
# The venv is installed with --no-compile (scripts/real-venv.sh): the first import must write
# the bytecode, or every model_layout.py process compiles vLLM and torch again (17 s of 31).
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
# The overlays' native store library (kv_store_format/native.py): this build's.
os.environ.setdefault(
    "KVTIER_STORE_LIB",
    str(
        Path(os.environ.get("KVTIER_BUILD_DIR", REPO / "build")).resolve()
        / "storeio"
        / "libkvtier_store.so"
    ),
)


def _setup_error(message: str) -> None:
    raise pytest.UsageError(f"tests/realsched: {message}")


def _build_patched_tree() -> tuple[Path, Path]:
    import importlib.util

    spec = importlib.util.find_spec("vllm")  # locates it without importing it
    if spec is None or spec.origin is None:
        _setup_error(
            f"{sys.executable} has no vllm: run these tests with the python that "
            "scripts/real-venv.sh prints"
        )
    site = Path(sysconfig.get_paths()["purelib"])
    if Path(spec.origin).parent != site / "vllm":
        _setup_error(f"vllm found at {spec.origin}, not in {site}")
    installed = real_release.package_dir(RELEASE)
    if any(name == "vllm" or name.startswith("vllm.") for name in sys.modules):
        _setup_error("vllm was imported before the patched tree was put on sys.path")
    build = Path(os.environ.get("KVTIER_BUILD_DIR", REPO / "build"))
    overlay = build / "patcher" / "overlay"
    if not os.access(overlay, os.X_OK):
        _setup_error(f"{overlay} is not built (set KVTIER_BUILD_DIR)")
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvtier"
    scratch = Path(tempfile.mkdtemp(prefix="realsched-tree.", dir=cache))
    try:
        subprocess.run(
            ["cp", "-al", str(installed), str(scratch / "vllm")],
            check=True,
            capture_output=True,
        )
    except subprocess.CalledProcessError:  # another disk: a plain copy
        shutil.copytree(installed, scratch / "vllm", symlinks=True)
    # The anchors and fragments of this checkout (KVTIER_OVERLAY_SRC: another source tree).
    src = Path(os.environ.get("KVTIER_OVERLAY_SRC", REPO))
    done = subprocess.run(
        [
            str(overlay),
            "apply",
            "--root",
            str(scratch),
            "--overlays",
            OVERLAYS,
            "--manifests",
            str(src / "anchors" / RELEASE),
            "--fragments",
            str(src / "overlays"),
            "--check-injected",
            "--python",
            sys.executable,
        ],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        shutil.rmtree(scratch, ignore_errors=True)
        _setup_error(
            f"overlay apply failed ({done.returncode}): {done.stdout}{done.stderr}"
        )
    return scratch, installed


def _pinned_files_intact(installed: Path) -> list[str]:
    """Pinned files of the installed tree whose bytes differ from the pins."""
    bad = []
    for line in (REPO / "fixtures" / RELEASE / "PINS").read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        digest, name = line.split(maxsplit=1)
        path = installed.parent / name
        if hashlib.sha256(path.read_bytes()).hexdigest() != digest:
            bad.append(name)
    return bad


PATCHED_ROOT, INSTALLED = _build_patched_tree()
# The release's own package tree (another release than the venv's) goes behind the patched
# copy, for its dist-info and for the pristine engine's subprocess.
RELEASE_ROOT = real_release.package_root(RELEASE)
if RELEASE_ROOT is not None:
    sys.path.insert(0, str(RELEASE_ROOT))
sys.path.insert(0, str(PATCHED_ROOT))
# The CPU platform before any test module imports vLLM: a module that binds
# vllm.platforms.current_platform at import keeps what it found (vLLM 0.34.0's
# config turns the hybrid KV cache manager off on an unspecified platform).
import realsched  # noqa: E402

realsched.use_cpu_platform()


def pytest_unconfigure(config) -> None:
    shutil.rmtree(PATCHED_ROOT, ignore_errors=True)


@pytest.fixture(scope="session")
def patched_root() -> Path:
    return PATCHED_ROOT


@pytest.fixture(scope="session")
def installed_tree() -> Path:
    return INSTALLED


@pytest.fixture(scope="session")
def pinned_files_intact():
    return lambda: _pinned_files_intact(INSTALLED)


@pytest.fixture
def knobs(monkeypatch):
    """Sets GLM53_KV_OFFLOAD* for one test; everything else of that family is unset."""

    def set_(**values: str | None) -> None:
        for key in [k for k in os.environ if k.startswith("GLM53_KV_OFFLOAD")]:
            monkeypatch.delenv(key)
        for key, value in values.items():
            name = "GLM53_KV_OFFLOAD" + ("_" + key if key else "")
            if value is not None:
                monkeypatch.setenv(name, value)

    set_()
    return set_


@pytest.fixture(scope="session")
def pristine_traces():
    """Scenario traces of the unpatched engine (one subprocess, cached for the session)."""
    cache: dict[str, dict] = {}

    def get(*scenarios: str) -> dict:
        missing = [s for s in scenarios if s not in cache]
        if missing:
            import json

            env = {k: v for k, v in os.environ.items() if not k.startswith("GLM53_")}
            env.pop("PYTHONPATH", None)
            path = real_release.subprocess_path()
            if path:
                env["PYTHONPATH"] = path
            done = subprocess.run(
                [sys.executable, str(HERE / "realsched_trace.py"), *missing],
                capture_output=True,
                text=True,
                env=env,
                cwd=str(REPO),
            )
            if done.returncode != 0:
                raise AssertionError(f"pristine trace failed:\n{done.stderr[-4000:]}")
            cache.update(json.loads(done.stdout.splitlines()[-1]))
        return {s: cache[s] for s in scenarios}

    return get


@pytest.fixture(autouse=True)
def no_region_left_behind():
    """Each test shuts down the schedulers it booted and leaves no CPU-tier region in
    /dev/shm: a file there outlives the process and keeps its memory."""
    import realsched

    before = realsched.offload_regions()
    yield
    realsched.shut_down_booted()
    left = realsched.offload_regions() - before
    # test_model_layouts boots ahead, in other processes: their regions are theirs
    # while they run (its module fixture checks none outlives its boot).
    left = realsched.left_behind(left)
    assert not left, f"left in /dev/shm: {sorted(left)}"
