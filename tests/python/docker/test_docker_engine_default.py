"""docker/lib.sh resolve_engine with two releases' anchors side by side."""

from __future__ import annotations

import subprocess

from conftest import REPO_ROOT


def resolve(prefix, engine: str = "") -> subprocess.CompletedProcess:
    script = 'source "$1"; resolve_engine "$2" "$3"; echo "$KVTIER_ENGINE_DIR"'
    return subprocess.run(
        ["bash", "-c", script, "-", str(REPO_ROOT / "docker/lib.sh"), str(prefix)]
        + [engine],
        capture_output=True,
        text=True,
    )


def releases(tmp_path, *names: str):
    for name in names:
        (tmp_path / "anchors" / name).mkdir(parents=True)
        (tmp_path / "anchors" / name / "ORDER").write_text("kv-offload-scope\n")
    return tmp_path


def test_the_newest_release_is_the_default_and_engine_picks_another(tmp_path):
    root = releases(tmp_path, "example-1.0", "vllm-0.32.0", "vllm-0.33.0", "vllm-0.9.0")
    done = resolve(root)
    # Version order, not text order (which would pick vllm-0.9.0).
    assert (done.returncode, done.stdout.strip()) == (0, "vllm-0.33.0"), done.stderr
    done = resolve(root, "vllm-0.32.0")
    assert (done.returncode, done.stdout.strip()) == (0, "vllm-0.32.0"), done.stderr


def test_two_engines_need_engine(tmp_path):
    root = releases(tmp_path, "vllm-0.33.0", "sglang-0.5.0")
    done = resolve(root)
    assert done.returncode != 0
    assert "pass --engine" in done.stderr


def test_the_repository_defaults_to_0_34_0():
    done = resolve(REPO_ROOT)
    assert (done.returncode, done.stdout.strip()) == (0, "vllm-0.34.0"), done.stderr
