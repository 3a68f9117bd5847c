"""The main job (scripts/demo.py) runs on the newest pinned release by default
and on another with --engine <engine>-<version>."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "scripts"))
import demo  # noqa: E402


def test_the_default_is_the_newest_release():
    assert demo.default_pins() == str(REPO_ROOT / "fixtures/vllm-0.34.0/PINS")
    # Version order, not text order (which would put 0.9.0 last).
    names = ["vllm-0.9.0", "vllm-0.33.0", "vllm-0.32.0"]
    ordered = sorted((Path(n) / "PINS" for n in names), key=demo._release_key)
    assert ordered[-1].parent.name == "vllm-0.33.0"


def test_engine_names_a_pinned_release_or_is_refused(tmp_path):
    done = subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts/demo.py"), "--engine", "vllm-9.9.9"]
        + ["--scratch", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert "--engine vllm-9.9.9: no " in done.stderr
    assert not any(tmp_path.iterdir())
