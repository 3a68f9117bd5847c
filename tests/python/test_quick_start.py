"""The README's two commands, as scripts: scripts/setup.sh's demo profile and
scripts/test.sh's stages, run on a copy of scripts/ with every tool they call
replaced by a stub that records its arguments (no build, no install, no venv)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

STUB = """#!/usr/bin/env bash
printf '%s\\n' "$(basename "$0") $*" >>"$STUB_LOG"
{body}
"""


def stub(path: Path, body: str = "exit 0") -> None:
    path.write_text(STUB.format(body=body))
    path.chmod(0o755)


@pytest.fixture
def tree(tmp_path) -> Path:
    """scripts/ copied beside stub fixtures, tools on PATH that only log."""
    root = tmp_path / "repo"
    (root / "scripts").mkdir(parents=True)
    for name in ("setup.sh", "test.sh", "demo.sh"):
        shutil.copy(REPO / "scripts" / name, root / "scripts" / name)
    for release in ("vllm-0.33.0", "vllm-0.34.0"):
        (root / "fixtures" / release).mkdir(parents=True)
        (root / "fixtures" / release / "PINS").write_text("")
    (root / "fixtures" / "fetch.py").write_text("")
    # Test files are in subfolders only: test.sh must still find them.
    (root / "tests" / "python" / "store").mkdir(parents=True)
    (root / "tests" / "python" / "store" / "test_x.py").write_text("")
    (root / "build").mkdir()
    (root / "build" / "build.ninja").write_text("")
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    # Every package is installed; every module imports.
    stub(bin_ / "dpkg-query", "echo 'install ok installed'")
    for tool in ("cmake", "ctest", "hadolint", "nproc"):
        stub(bin_ / tool, "[ $(basename $0) != nproc ] || echo 2")
    stub(bin_ / "python3", 'case "$*" in *"ruff --version"*) echo "ruff 0.17.6";; esac')
    venv_py = tmp_path / "venv-python"
    stub(venv_py)
    # The venv build marks that it runs; hardening says whether it saw it running.
    stub(root / "scripts" / "real-venv.sh",
         f'touch "$STUB_LOG.venv"; sleep 2; rm "$STUB_LOG.venv"; echo {venv_py}')  # fmt: skip
    stub(root / "scripts" / "hardening.sh",
         'sleep 0.5; [ ! -e "$STUB_LOG.venv" ] || echo "venv building" >>"$STUB_LOG"')  # fmt: skip
    stub(root / "scripts" / "demo.py")
    stub(root / "scripts" / "upstream-tests.sh")
    return root


def run(tree: Path, script: str, **env) -> subprocess.CompletedProcess:
    log = tree.parent / "calls.log"
    full = {
        "PATH": f"{tree.parent / 'bin'}:/usr/bin:/bin",
        "HOME": str(tree.parent),
        "STUB_LOG": str(log),
        **env,
    }
    return subprocess.run(
        ["bash", str(tree / "scripts" / script)],
        env=full,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def calls(tree: Path) -> list[str]:
    return (tree.parent / "calls.log").read_text().splitlines()


def test_the_demo_sets_up_only_what_it_runs(tree):
    res = run(tree, "setup.sh", KVTIER_SETUP="demo")
    assert res.returncode == 0, res.stderr
    log = calls(tree)
    (build,) = [c for c in log if c.startswith("cmake --build")]
    # The store library too: the demo's patched writer refuses to start without it (a
    # fresh clone's demo failed at "write a store" when this list lacked it).
    assert build.endswith("--target overlay kvstore kvtier_store kvtier-cxxscope")
    assert not any(c.startswith("real-venv.sh") for c in log)  # no 9 GB venv
    assert not any("xdist" in c or "hadolint" in c or "ruff" in c for c in log)
    # The full setup builds everything and the venv.
    (tree.parent / "calls.log").unlink()
    res = run(tree, "setup.sh")
    assert res.returncode == 0, res.stderr
    log = calls(tree)
    assert [c for c in log if c.startswith("cmake --build")] == [
        "cmake --build build -j2"
    ]
    assert any(c.startswith("real-venv.sh") for c in log)
    demo = (REPO / "scripts/demo.sh").read_text()
    assert "KVTIER_SETUP=demo KVTIER_ENGINES=$engine scripts/setup.sh" in demo


def fetched(tree: Path) -> list[str]:
    """The pin sets fetch.py was asked for, in order, once each."""
    pins = [c.split("--pins ")[1].split()[0] for c in calls(tree) if "fetch.py" in c]
    return list(dict.fromkeys(pins))


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ([], "vllm-0.34.0"),  # the newest pinned release, as demo.py runs
        (["--engine", "vllm-0.33.0"], "vllm-0.33.0"),
        (["--pins", "fixtures/vllm-0.33.0/PINS"], "vllm-0.33.0"),
    ],
)
def test_the_demo_fetches_only_the_release_it_runs(tree, args, expected):
    """Each release's wheel and sdist are hundreds of MB: a fresh clone's demo
    spent most of its setup fetching the release it did not run."""
    log = tree.parent / "calls.log"
    res = subprocess.run(
        ["bash", str(tree / "scripts" / "demo.sh"), *args],
        env={
            "PATH": f"{tree.parent / 'bin'}:/usr/bin:/bin",
            "HOME": str(tree.parent),
            "STUB_LOG": str(log),
        },  # fmt: skip
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert fetched(tree) == [f"fixtures/{expected}/PINS"]
    (demo,) = [c for c in calls(tree) if "demo.py" in c]
    assert demo.endswith(" ".join(args))  # its arguments reach demo.py unchanged
    # The test command's setup still fetches every release.
    log.unlink()
    assert run(tree, "setup.sh").returncode == 0
    assert fetched(tree) == ["fixtures/vllm-0.33.0/PINS", "fixtures/vllm-0.34.0/PINS"]


def test_setup_refuses_an_unknown_release_before_installing(tree):
    res = run(tree, "setup.sh", KVTIER_ENGINES="vllm-9.9.9")
    assert res.returncode == 2
    assert "fixtures/vllm-9.9.9/PINS: no such pinned release" in res.stderr
    assert not (tree.parent / "calls.log").exists()  # nothing ran


def test_setup_refuses_an_unknown_profile(tree):
    res = run(tree, "setup.sh", KVTIER_SETUP="everything")
    assert res.returncode == 2 and "expected all or demo" in res.stderr


def test_test_sh_times_every_stage_and_builds_the_venv_beside_the_cxx_stages(tree):
    res = run(tree, "test.sh")
    assert res.returncode == 0, res.stdout + res.stderr
    log = calls(tree)
    # setup without the venv; the venv started before the C++ stages ran.
    assert log.index("real-venv.sh ") < log.index("venv building")
    (pytest_call,) = [c for c in log if "-m pytest" in c and "tests/python" in c]
    assert "-n auto --dist loadfile --durations=30 tests/python" in pytest_call
    assert any(c.startswith("venv-python -m pytest -q tests/realsched") for c in log)
    times = res.stdout[res.stdout.index("== stage times") :].splitlines()[1:]
    names = [line.split()[0] for line in times]
    # The real-vLLM tier once per pinned release, newest first: each release's
    # tests/realsched, then vLLM's own tests, one release at a time.
    assert names == ["setup", "hardening", "ctest", "venv-wait", "pytest",
                     "realsched-0.34.0", "realsched-0.33.0", "upstream-0.34.0",
                     "upstream-0.33.0", "total"]  # fmt: skip
    assert "== realsched-0.33.0\n" in res.stdout
    assert "upstream-tests.sh " in log  # vLLM's own tests on both trees
    assert all(line.split()[2] == "s" for line in times)
    assert all(line.rstrip().endswith("ok") for line in times[:-1])


def test_test_sh_reports_a_failed_stage_and_exits_1(tree):
    stub(tree / "scripts" / "hardening.sh", "exit 3")
    res = run(tree, "test.sh", PYTEST_WORKERS="0")
    assert res.returncode == 1
    assert "hardening" in res.stdout and "FAILED (exit 3)" in res.stdout
    (pytest_call,) = [
        c for c in calls(tree) if "-m pytest" in c and "tests/python" in c
    ]
    assert "-n" not in pytest_call.split()  # serial on request
    assert "== stage times" in res.stdout


def test_the_real_venv_is_not_byte_compiled_while_the_cxx_stages_run():
    text = (REPO / "scripts/real-venv.sh").read_text()
    assert "--no-compile" in text
