"""`cmake --install` and the CPack .deb: the installed tools run from their
prefix (overlay finds share/kvtier/anchors by itself), the bash completion
offers every option the tools' help lists, and the .deb holds the same tree."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

COMMANDS = {"overlay": ["status", "plan", "apply", "check", "revert", "recover"],
            "kvstore": ["verify", "gc", "stat", "inspect"]}  # fmt: skip


@pytest.fixture(scope="module")
def installed(build_dir, tmp_path_factory) -> Path:
    for rel in ("patcher/overlay", "kvstore/kvstore"):
        if not (build_dir / rel).is_file():
            pytest.skip(f"{build_dir / rel} is not built")
    prefix = tmp_path_factory.mktemp("install") / "usr"
    done = subprocess.run(
        ["cmake", "--install", str(build_dir), "--prefix", str(prefix), "--component", "runtime"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return prefix


def test_layout(installed):
    for rel in ("bin/overlay", "bin/kvstore"):
        assert os.access(installed / rel, os.X_OK), rel
    data = installed / "share/kvtier"
    assert (data / "anchors").is_dir() and (data / "overlays").is_dir()
    assert os.access(data / "docker/gate.sh", os.X_OK)
    assert not list(data.rglob("__pycache__"))
    # Every pin set beside its anchors (docs/PORTING.md), the example's neither.
    pins = sorted(p.parent.name for p in (data / "pins").glob("*/PINS"))
    assert pins == sorted(p.name for p in (data / "anchors").iterdir()), pins
    for tool in COMMANDS:
        assert (installed / "share/bash-completion/completions" / tool).is_file()
        assert (installed / "share/zsh/site-functions" / f"_{tool}").is_file()
        assert (
            installed / "share/fish/vendor_completions.d" / f"{tool}.fish"
        ).is_file()
        assert (installed / "share/man/man1" / f"{tool}.1").is_file()
    assert (installed / "share/doc/kvtier/DEPLOY.md").is_file()
    assert (
        installed / "share/doc/kvtier/examples/monitoring/kvtier-rules.yml"
    ).is_file()
    assert (installed / "share/kvtier/docker/doctor_probe.py").is_file()


def test_installed_overlay_finds_its_anchors(installed, tree_copy):
    """No --manifests: the anchors come from <prefix>/share/kvtier."""
    done = subprocess.run(
        [str(installed / "bin/overlay"), "status", "--root", str(tree_copy)],
        capture_output=True, text=True, check=False, env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "pristine" in done.stdout


def test_installed_scripts_bake_and_gate_from_the_prefix(
    installed, tree_copy, tmp_path, engine_name, engine_version
):
    """bake.sh and gate.sh take the install prefix and find everything under it;
    with every release installed, no --engine: the bake reads the tree's
    release (here vllm/_version.py: the fetched tree has no dist-info), the
    gate the one the bake recorded."""
    env = {"PATH": "/usr/bin:/bin"}
    data = installed / "share/kvtier"
    done = subprocess.run(
        [str(data / "docker/bake.sh"), "--prefix", str(installed), "--root", str(tree_copy),
         "--artifacts", str(tmp_path / "ARTIFACTS.sha256")],
        capture_output=True, text=True, check=False, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    version_py = tree_copy / engine_name / "_version.py"
    assert f"tree {tree_copy}: {engine_name} {engine_version} (from {version_py})" in (
        done.stderr
    )
    listed = (tmp_path / "ARTIFACTS.sha256").read_text().splitlines()
    assert listed[0].endswith(f"  anchors/{engine_name}-{engine_version}/ORDER")
    done = subprocess.run(
        [str(data / "docker/gate.sh"), "--prefix", str(installed), "--root", str(tree_copy),
         "--artifacts", str(tmp_path / "ARTIFACTS.sha256")],
        capture_output=True, text=True, check=False,
        env=dict(env, GLM53_KV_OFFLOAD="1", GLM53_KV_OFFLOAD_DIR="/data/kv", GLM53_KV_OFFLOAD_CPU_GB="4"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def _complete(tool: Path, completion: Path, words: list[str]) -> list[str]:
    """What bash completion offers for `words` (the last one being completed)."""
    script = (
        f"source {completion}\n"
        f"COMP_WORDS=({' '.join(repr(w) for w in words)})\n"
        f"COMP_CWORD={len(words) - 1}\n"
        f"_kvtier_{tool.name}\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    done = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, check=True
    )
    return done.stdout.split()


def _help_options(tool: Path, sub: str) -> set[str]:
    done = subprocess.run(
        [str(tool), sub, "--help"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    options = done.stdout.split("\nExit codes")[
        0
    ]  # the shared footer names other tools' flags
    return set(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", options))


@pytest.mark.parametrize("tool_name", sorted(COMMANDS))
def test_completion_offers_subcommands_and_every_option(installed, tool_name):
    tool = installed / "bin" / tool_name
    completion = installed / "share/bash-completion/completions" / tool_name
    assert sorted(_complete(tool, completion, [tool_name, ""])) == sorted(
        COMMANDS[tool_name]
    )
    for sub in COMMANDS[tool_name]:
        offered = set(_complete(tool, completion, [tool_name, sub, "-"]))
        missing = _help_options(tool, sub) - offered
        assert not missing, (
            f"{tool_name} {sub}: --help lists {sorted(missing)}, completion does not"
        )


def test_deb_package(build_dir, tmp_path):
    if shutil.which("dpkg-deb") is None or shutil.which("cpack") is None:
        pytest.fail("cpack and dpkg-deb are needed (scripts/setup.sh installs them)")
    done = subprocess.run(
        ["cpack", "-G", "DEB", "-B", str(tmp_path)],
        cwd=build_dir, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    (deb,) = tmp_path.glob("kvtier_*.deb")
    files = subprocess.run(
        ["dpkg-deb", "-c", str(deb)], capture_output=True, text=True, check=True
    ).stdout
    for want in ("./usr/bin/overlay", "./usr/bin/kvstore", "./usr/share/kvtier/docker/gate.sh",
                 "./usr/share/bash-completion/completions/kvstore"):  # fmt: skip
        assert re.search(rf" {re.escape(want)}$", files, re.MULTILINE), want
    assert re.search(r"\./usr/share/kvtier/anchors/[^/]+/ORDER$", files, re.MULTILINE)
    depends = subprocess.run(
        ["dpkg-deb", "-f", str(deb), "Depends"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "libc6" in depends and "python3" in depends
