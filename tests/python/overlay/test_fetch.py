"""fixtures/fetch.py against a private cache (XDG_CACHE_HOME in tmp_path).

The cached release wheel is linked into the private cache, and pip is pointed
at no index, so any attempt to download fails the run loudly.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import harness
import pytest
from conftest import REPO_ROOT

FETCH = REPO_ROOT / "fixtures" / "fetch.py"


def _wheel_name(pin_dir: Path) -> str:
    line = next(x for x in (pin_dir / "WHEEL").read_text().splitlines() if x.strip())
    return line.split()[1]


@pytest.fixture
def cache(tmp_path, pin_dir, engine_tree) -> Path:
    """A private XDG cache holding only a link to the already verified wheel."""
    home = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    real = Path(home) / "kvtier" / "wheels" / _wheel_name(pin_dir)
    if not real.is_file():
        pytest.skip(f"{real} is not cached (the tree was fetched without it)")
    xdg = tmp_path / "xdg"
    (xdg / "kvtier" / "wheels").mkdir(parents=True)
    (xdg / "kvtier" / "wheels" / real.name).symlink_to(real)
    return xdg


@pytest.fixture
def pins_copy(tmp_path, pin_dir) -> Path:
    """A private copy of the pin set, same directory name, safe to edit."""
    dst = tmp_path / "pinsets" / pin_dir.name
    shutil.copytree(pin_dir, dst)
    return dst / "PINS"


def fetch(cache: Path, *args: str):
    env = dict(os.environ, XDG_CACHE_HOME=str(cache), PIP_NO_INDEX="1")
    env.pop("PIP_FIND_LINKS", None)
    return subprocess.run(
        [sys.executable, str(FETCH), *args], capture_output=True, text=True, env=env
    )


def tree_of(cache: Path, pin_dir: Path) -> Path:
    return cache / "kvtier" / "engines" / pin_dir.name


def test_cold_extracts_exactly_the_pins(cache, pin_dir, pins, engine_tree):
    """The tree is PINS and INTERFACE (the files the interface pins name), nothing
    else, each file as the verified wheel has it."""
    done = fetch(cache, "--pins", str(pin_dir / "PINS"))
    assert done.returncode == 0, done.stderr
    tree = Path(done.stdout.strip())
    assert tree == tree_of(cache, pin_dir)
    interface = harness.read_pins(pin_dir / "INTERFACE")
    assert interface, "a release's INTERFACE names the files its API pins read"
    assert sorted(
        p.relative_to(tree).as_posix() for p in tree.rglob("*") if p.is_file()
    ) == sorted(pin.path for pin in pins + interface)
    for pin in pins + interface:
        assert (tree / pin.path).read_bytes() == (engine_tree / pin.path).read_bytes()


def test_warm_needs_no_wheel(cache, pin_dir):
    """A warm run neither downloads nor even opens the wheel."""
    assert fetch(cache, "--pins", str(pin_dir / "PINS")).returncode == 0
    wheel = cache / "kvtier" / "wheels" / _wheel_name(pin_dir)
    wheel.unlink()
    done = fetch(cache, "--pins", str(pin_dir / "PINS"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(tree_of(cache, pin_dir))
    assert not wheel.exists()


def test_tampered_tree_file_is_restored(cache, pin_dir, pins, engine_tree):
    assert fetch(cache, "--pins", str(pin_dir / "PINS")).returncode == 0
    victim = tree_of(cache, pin_dir) / pins[0].path
    victim.write_bytes(b"tampered\n")
    stray = tree_of(cache, pin_dir) / "vllm" / "stray.py"
    stray.write_text("x = 1\n")
    done = fetch(cache, "--pins", str(pin_dir / "PINS"))
    assert done.returncode == 0, done.stderr
    assert victim.read_bytes() == (engine_tree / pins[0].path).read_bytes()
    assert not stray.exists(), "an unpinned file was left in the tree"


def test_pin_mismatch_names_file_and_writes_nothing(cache, pins_copy, pins):
    lines = pins_copy.read_text().splitlines()
    digest, _, path = lines[-1].partition("  ")
    lines[-1] = f"{'0' * 64}  {path}"
    pins_copy.write_text("\n".join(lines) + "\n")
    done = fetch(cache, "--pins", str(pins_copy))
    assert done.returncode == 1
    assert path in done.stderr and "does not match" in done.stderr
    assert not tree_of(cache, pins_copy.parent).exists(), "wrote despite a mismatch"


def test_pinned_file_missing_from_wheel(cache, pins_copy):
    with pins_copy.open("a") as f:
        f.write(f"{'1' * 64}  vllm/no_such_file.py\n")
    done = fetch(cache, "--pins", str(pins_copy))
    assert done.returncode == 1
    assert "vllm/no_such_file.py" in done.stderr


def test_wrong_wheel_is_downloaded_again(cache, pin_dir, tmp_path):
    """A cached wheel with the wrong sha256 is not trusted: fetch calls pip, which
    here has no index and fails, so the run fails with a download error."""
    wheel = cache / "kvtier" / "wheels" / _wheel_name(pin_dir)
    wheel.unlink()
    wheel.write_bytes(b"not the release wheel")
    done = fetch(cache, "--pins", str(pin_dir / "PINS"))
    assert done.returncode == 3
    assert "pip download" in done.stderr
    assert wheel.read_bytes() == b"not the release wheel"
    assert not tree_of(cache, pin_dir).exists()


def test_malformed_pins_line_is_named(cache, pins_copy):
    with pins_copy.open("a") as f:
        f.write("not-a-sha  vllm/x.py\n")
    done = fetch(cache, "--pins", str(pins_copy))
    assert done.returncode == 2
    n = len(pins_copy.read_text().splitlines())
    assert f"{pins_copy}:{n}:" in done.stderr


def test_unsafe_pin_path_is_refused(cache, pins_copy):
    with pins_copy.open("a") as f:
        f.write(f"{'2' * 64}  ../escape.py\n")
    done = fetch(cache, "--pins", str(pins_copy))
    assert done.returncode == 2 and "unsafe path" in done.stderr


def test_tree_only_prints_path_and_fetches_nothing(cache, pin_dir):
    done = fetch(cache, "--pins", str(pin_dir / "PINS"), "--tree-only")
    assert done.returncode == 0
    assert done.stdout.strip() == str(tree_of(cache, pin_dir))
    assert not tree_of(cache, pin_dir).exists()


def test_engine_and_version_come_from_the_pin_dir(cache, tmp_path, pin_dir):
    """No version is built in: a pin set in another directory name is another tree."""
    other = tmp_path / "pinsets" / "vllm-9.9.9"
    shutil.copytree(pin_dir, other)
    done = fetch(cache, "--pins", str(other / "PINS"), "--tree-only")
    assert done.stdout.strip().endswith("engines/vllm-9.9.9")
    done = fetch(
        cache, "--pins", str(other / "PINS"), "--tree-only", "--version", "1.2.3"
    )
    assert done.stdout.strip().endswith("engines/vllm-1.2.3")


def test_pin_lines_reproduce_the_pins(cache, pin_dir, pins):
    done = fetch(cache, "--pins", str(pin_dir / "PINS"), "--pin-lines", pins[0].path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{pins[0].sha256}  {pins[0].path}"


def test_a_download_is_adopted_only_when_it_is_the_pinned_file(tmp_path):
    import hashlib
    import importlib.util

    spec = importlib.util.spec_from_file_location("kvtier_fetch", FETCH)
    fetch = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fetch)
    tmp = tmp_path / "dl"
    tmp.mkdir()
    (tmp / "x.whl").write_bytes(b"wheel bytes")
    good = hashlib.sha256(b"wheel bytes").hexdigest()
    dest = tmp_path / "x.whl"

    with pytest.raises(fetch.FetchError) as bad:
        fetch._adopt_download(
            str(tmp), "x.whl", "0" * 64, dest, "WHEEL", "pip download"
        )
    assert "does not match WHEEL pin" in str(bad.value) and not dest.exists()
    with pytest.raises(fetch.FetchError) as missing:
        fetch._adopt_download(str(tmp), "y.whl", good, dest, "WHEEL", "pip download")
    assert "pip download gave x.whl, not y.whl (see WHEEL)" in str(missing.value)

    fetch._adopt_download(str(tmp), "x.whl", good, dest, "WHEEL", "pip download")
    assert dest.read_bytes() == b"wheel bytes"


def test_a_cached_download_runs_only_for_a_missing_or_wrong_file(tmp_path):
    import hashlib
    import importlib.util

    spec = importlib.util.spec_from_file_location("kvtier_fetch", FETCH)
    fetch = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fetch)
    folder = tmp_path / "wheels"
    good = hashlib.sha256(b"wheel bytes").hexdigest()
    calls = []

    def download(tmp: str) -> None:
        calls.append(tmp)
        (Path(tmp) / "x.whl").write_bytes(b"wheel bytes")

    def cached() -> Path:
        return fetch._cached_download(
            folder, "x.whl", good, "WHEEL", "pip download", download
        )

    assert cached().read_bytes() == b"wheel bytes" and len(calls) == 1
    assert cached() == folder / "x.whl" and len(calls) == 1  # current: no download
    (folder / "x.whl").write_bytes(b"stale")
    assert cached().read_bytes() == b"wheel bytes" and len(calls) == 2
    assert [p.name for p in folder.iterdir()] == ["x.whl"]  # the private folder is gone

    def failing(tmp: str) -> None:
        raise fetch.FetchError(fetch.EXIT_IO, "pip download failed (exit 1)")

    (folder / "x.whl").write_bytes(b"stale")
    with pytest.raises(fetch.FetchError):
        fetch._cached_download(folder, "x.whl", good, "WHEEL", "pip download", failing)
    assert (folder / "x.whl").read_bytes() == b"stale"  # a failed download keeps it
