"""The man pages and the zsh and fish completion (packaging/{man,zsh,fish})
are what packaging/gen-cli-docs.py makes from the built tools' --help, so
they name every option `--help` names and nothing else; groff reads the man
pages without a warning; zsh and fish parse the completion where installed."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT as REPO

GEN = REPO / "packaging/gen-cli-docs.py"
COMMANDS = {"overlay": ["status", "plan", "apply", "check", "revert", "recover"],
            "kvstore": ["verify", "gc", "stat", "inspect"]}  # fmt: skip


def _tool(build_dir: Path, name: str) -> Path:
    return build_dir / ("patcher/overlay" if name == "overlay" else "kvstore/kvstore")


def _options(build_dir: Path, name: str, *sub: str) -> set[str]:
    done = subprocess.run([str(_tool(build_dir, name)), *sub, "--help"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    text = done.stdout.split("\nExit codes")[0]
    return set(re.findall(r"^  (?:-\w,)?(--[\w-]+)", text, re.M))


def test_generated_files_are_current(build_dir):
    done = subprocess.run([sys.executable, str(GEN), "--bin-dir", str(build_dir), "--check"],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_option_of_every_command_is_in_each_file(build_dir, name):
    man = (REPO / f"packaging/man/{name}.1").read_text()
    zsh = (REPO / f"packaging/zsh/_{name}").read_text()
    fish = (REPO / f"packaging/fish/{name}.fish").read_text()
    for sub in COMMANDS[name]:
        assert f'.SS "{name} {sub}"' in man
        zline = next(ln for ln in zsh.splitlines() if ln.strip().startswith(f"{sub}) "))
        flines = [
            ln
            for ln in fish.splitlines()
            if f"__fish_seen_subcommand_from {sub}'" in ln
        ]
        flines += [ln for ln in fish.splitlines() if " -n " not in ln]  # global options
        for opt in _options(build_dir, name, sub) - {"--help"}:
            assert opt.replace("-", "\\-") in man, (name, sub, opt)
            assert f"'{opt}[" in zline or f",{opt}}}" in zline or (f"'{opt}[" in zsh), (
                name,
                sub,
                opt,
            )
            assert any(f"-l {opt[2:]} " in ln for ln in flines), (name, sub, opt)


def test_man_pages_read_without_warnings():
    if shutil.which("groff") is None:
        pytest.skip("groff is not installed")
    for name in COMMANDS:
        done = subprocess.run(["groff", "-man", "-ww", "-z", str(REPO / f"packaging/man/{name}.1")],
                              capture_output=True, text=True, check=False)  # fmt: skip
        assert done.returncode == 0 and done.stderr == "", done.stderr


@pytest.mark.parametrize(
    ("shell", "path"), [("zsh", "zsh/_{}"), ("fish", "fish/{}.fish")]
)
def test_completion_parses(shell, path):
    if shutil.which(shell) is None:
        pytest.skip(f"{shell} is not installed")
    for name in COMMANDS:
        done = subprocess.run([shell, "-n", str(REPO / "packaging" / path.format(name))],
                              capture_output=True, text=True, check=False)  # fmt: skip
        assert done.returncode == 0, done.stderr
