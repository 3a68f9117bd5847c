"""fixtures/fetch.py --sources / --built against a private cache (XDG_CACHE_HOME
in tmp_path) holding links to the already verified sdist and wheel, with pip
pointed at no index: any download attempt fails the run loudly."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT
from cxx_support import fetch, pin_dirs_with, pins

FETCH = REPO_ROOT / "fixtures" / "fetch.py"
PIN_DIRS = pin_dirs_with("SDIST")


@pytest.fixture(params=PIN_DIRS, ids=[d.name for d in PIN_DIRS])
def pin_set(request) -> Path:
    fetch(request.param, "sources")  # the real cache holds the sdist afterwards
    fetch(request.param, "built")
    return request.param


def _first_name(path: Path) -> str:
    return next(line for line in path.read_text().splitlines() if line.strip()).split()[
        1
    ]


@pytest.fixture
def cache(tmp_path, pin_set) -> Path:
    home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvtier"
    xdg = tmp_path / "xdg"
    for sub, name in (
        ("sdists", _first_name(pin_set / "SDIST")),
        ("wheels", _first_name(pin_set / "WHEEL")),
    ):
        (xdg / "kvtier" / sub).mkdir(parents=True)
        (xdg / "kvtier" / sub / name).symlink_to(home / sub / name)
    return xdg


def run(cache: Path, pins_file: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "XDG_CACHE_HOME": str(cache), "PIP_INDEX_URL": "http://127.0.0.1:9/none",
           "PIP_NO_INDEX": "1"}  # fmt: skip
    return subprocess.run(
        [sys.executable, str(FETCH), "--pins", str(pins_file), *args],
        capture_output=True,
        text=True,
        env=env,
    )


def test_sources_and_built_extract_exactly_the_pins(cache, pin_set):
    kinds = [("--sources", "SOURCES"), ("--built", "BUILT")]
    if (pin_set / "TESTS").is_file():
        kinds.append(("--tests", "TESTS"))
    for kind, pin_file in kinds:
        done = run(cache, pin_set / "PINS", kind)
        assert done.returncode == 0, done.stderr
        tree = Path(done.stdout.strip())
        want = pins(pin_set / pin_file)
        got = {p.relative_to(tree).as_posix() for p in tree.rglob("*") if p.is_file()}
        assert got == set(want)


def test_tampered_source_is_restored(cache, pin_set):
    tree = Path(run(cache, pin_set / "PINS", "--sources").stdout.strip())
    target = tree / "csrc/fs_io.cpp"
    target.write_text("tampered\n")
    done = run(cache, pin_set / "PINS", "--sources")
    assert done.returncode == 0, done.stderr
    assert (
        pins(pin_set / "SOURCES")["csrc/fs_io.cpp"]
        == __import__("hashlib").sha256(target.read_bytes()).hexdigest()
    )


def _pin_copy(pin_set: Path, tmp_path: Path) -> Path:
    d = tmp_path / pin_set.name
    shutil.copytree(pin_set, d)
    return d


def test_source_pin_mismatch_names_the_file_and_writes_nothing(
    cache, pin_set, tmp_path
):
    d = _pin_copy(pin_set, tmp_path)
    lines = (d / "SOURCES").read_text().splitlines()
    digest, name = lines[0].split()
    lines[0] = f"{'0' * 64}  {name}"
    (d / "SOURCES").write_text("\n".join(lines) + "\n")
    done = run(cache, d / "PINS", "--sources")
    assert done.returncode == 1
    assert name in done.stderr and "does not match pin" in done.stderr
    assert not (cache / "kvtier" / "sources" / pin_set.name / name).exists()


def test_source_not_in_sdist_is_named(cache, pin_set, tmp_path):
    d = _pin_copy(pin_set, tmp_path)
    with open(d / "SOURCES", "a") as f:
        f.write(f"{'1' * 64}  csrc/not_in_the_sdist.cpp\n")
    done = run(cache, d / "PINS", "--sources")
    assert done.returncode == 1
    assert "csrc/not_in_the_sdist.cpp: pinned but not in" in done.stderr


def test_wrong_sdist_pin_refuses_the_cached_file_and_cannot_download(
    cache, pin_set, tmp_path
):
    d = _pin_copy(pin_set, tmp_path)
    name = _first_name(d / "SDIST")
    (d / "SDIST").write_text(f"{'2' * 64}  {name}\n")
    done = run(cache, d / "PINS", "--sources")
    assert done.returncode in (1, 3), (
        done.stderr
    )  # cached file refused; no index to fetch another
    assert not (cache / "kvtier" / "sources" / pin_set.name).exists()


def test_malformed_sdist_pin_is_a_usage_error(cache, pin_set, tmp_path):
    d = _pin_copy(pin_set, tmp_path)
    (d / "SDIST").write_text("not a pin line\n")
    done = run(cache, d / "PINS", "--sources")
    assert done.returncode == 2
    assert "SDIST:1" in done.stderr


def test_upstream_test_pin_mismatch_names_the_file(cache, pin_set, tmp_path):
    if not (pin_set / "TESTS").is_file():
        pytest.skip("no TESTS pins")
    d = _pin_copy(pin_set, tmp_path)
    lines = (d / "TESTS").read_text().splitlines()
    i = next(n for n, line in enumerate(lines) if not line.startswith("#"))
    _, name = lines[i].split()
    lines[i] = f"{'0' * 64}  {name}"
    (d / "TESTS").write_text("\n".join(lines) + "\n")
    done = run(cache, d / "PINS", "--tests")
    assert done.returncode == 1
    assert name in done.stderr and "does not match pin" in done.stderr
    assert not (cache / "kvtier" / "upstream-tests" / pin_set.name).exists()


def test_pin_lines_read_the_sdist(cache, pin_set):
    done = run(
        cache, pin_set / "PINS", "--tests", "--pin-lines", "tests/v1/__init__.py"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [
        pins(pin_set / "TESTS")["tests/v1/__init__.py"],
        "tests/v1/__init__.py",
    ]
