"""Shared fixtures: built tools, the pinned engine tree, and the harness.

The engine version is never written here: every pin set fixtures/<engine>-<version>/
is a parameter of `pin_dir` (KVTIER_ENGINE=<engine>-<version> picks one), and the
fixtures below derive the tree, pins, manifests and ORDER from it.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

# tests/python: this file and the support modules the tests in its subfolders import
# (and the helper scripts they run import: pass it on PYTHONPATH or sys.path).
TESTS_PYTHON = Path(__file__).resolve().parent
REPO_ROOT = TESTS_PYTHON.parents[1]
sys.path.insert(0, str(TESTS_PYTHON))
sys.path.insert(0, str(REPO_ROOT / "sim"))  # harness, hybrid layout, fakes
# The pure-Python codec of FORMAT.md (kv_store_format_oracle): the oracle the
# shipped codec (kv_store_format, the C++ one through ctypes) is checked by.
sys.path.insert(0, str(REPO_ROOT / "tests" / "oracle"))

import harness  # noqa: E402

# The overlays' native store library (kv_store_format/native.py) is this
# build's; a test that wants another sets KVTIER_STORE_LIB itself.
os.environ.setdefault(
    "KVTIER_STORE_LIB",
    str(
        Path(os.environ.get("KVTIER_BUILD_DIR", REPO_ROOT / "build")).resolve()
        / "storeio"
        / "libkvtier_store.so"
    ),
)


def load_module(name: str, path: Path) -> ModuleType:
    """A module file, or a package folder (its submodules found beside it), loaded under
    `name` and registered in sys.modules: the overlays' code (the store codec, the knobs)
    is loaded from the repo without installing it; each caller picks its own name."""
    if path.is_dir():
        spec = importlib.util.spec_from_file_location(
            name, path / "__init__.py", submodule_search_locations=[str(path)]
        )
    else:
        spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _pin_dirs() -> list[Path]:
    dirs = sorted(p.parent for p in REPO_ROOT.glob("fixtures/*/PINS"))
    wanted = os.environ.get("KVTIER_ENGINE")
    if wanted:
        dirs = [d for d in dirs if d.name == wanted]
        if not dirs:
            raise pytest.UsageError(
                f"KVTIER_ENGINE={wanted}: no fixtures/{wanted}/PINS"
            )
    return dirs


PIN_DIRS = _pin_dirs()


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def build_dir(repo_root) -> Path:
    return Path(os.environ.get("KVTIER_BUILD_DIR", repo_root / "build")).resolve()


def _tool(build_dir: Path, rel: str) -> Path:
    path = build_dir / rel
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.skip(f"{path} is not built (set KVTIER_BUILD_DIR or build it)")
    return path


@pytest.fixture(scope="session")
def overlay_bin(build_dir) -> Path:
    return _tool(build_dir, "patcher/overlay")


@pytest.fixture(scope="session")
def kvstore_bin(build_dir) -> Path:
    return _tool(build_dir, "kvstore/kvstore")


@pytest.fixture(scope="session", params=PIN_DIRS, ids=[d.name for d in PIN_DIRS])
def pin_dir(request) -> Path:
    """fixtures/<engine>-<version>/: one pin set (a parameter when several exist)."""
    return request.param


@pytest.fixture(scope="session")
def engine_name(pin_dir) -> str:
    return harness.split_pin_dir(pin_dir)[0]


@pytest.fixture(scope="session")
def engine_version(pin_dir) -> str:
    return harness.split_pin_dir(pin_dir)[1]


@pytest.fixture(scope="session")
def pins(pin_dir) -> list[harness.Pin]:
    return harness.read_pins(pin_dir / "PINS")


@functools.cache
def fetch_tree(pin_dir: Path) -> Path:
    """Runs fixtures/fetch.py for one pin set (once per session); its tree path."""
    done = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "fixtures/fetch.py"),
            "--pins",
            str(pin_dir / "PINS"),
        ],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.fail(f"fetch.py failed (exit {done.returncode}): {done.stderr.strip()}")
    return Path(done.stdout.strip())


@pytest.fixture(scope="session")
def engine_tree(pin_dir) -> Path:
    """The pristine pinned tree (fetched and verified by fixtures/fetch.py).

    Shared by the whole session and by other checkouts: read it, never write it;
    use `tree_copy` to change files.
    """
    return fetch_tree(pin_dir)


@pytest.fixture
def tree_copy(engine_tree, tmp_path) -> Path:
    """A private, writable copy of the pristine tree (site-packages-like root)."""
    dst = tmp_path / "site-packages"
    shutil.copytree(engine_tree, dst, ignore=shutil.ignore_patterns("__pycache__"))
    return dst


@pytest.fixture(scope="session")
def manifests_dir(repo_root, engine_name, engine_version) -> Path:
    return repo_root / "anchors" / f"{engine_name}-{engine_version}"


@pytest.fixture(scope="session")
def order(manifests_dir) -> list[str]:
    """The pinned overlay apply order (anchors/<engine>-<version>/ORDER)."""
    path = manifests_dir / "ORDER"
    if not path.is_file():
        return []
    lines = (line.strip() for line in path.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


@pytest.fixture
def pristine(engine_tree, engine_name):
    """An active harness namespace over the pristine tree: pristine.load("vllm...")."""
    with harness.engine(engine_tree, package=engine_name) as ns:
        yield ns
