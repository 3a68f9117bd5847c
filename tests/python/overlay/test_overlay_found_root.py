"""`overlay` without ROOT, as the wheel's shim runs it: KVTIER_PIP_ENV names
what the shim found on its Python's path (packaging/wheel/kvtier/found.py);
the tool acts on the one tree, or refuses (exit 2) and writes nothing
(patcher/found_root.cpp). tests/python/packaging/test_wheel.py runs the same through
an installed wheel."""

from __future__ import annotations

import json
import os
import subprocess


def _status(overlay_bin, pip_env, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "KVTIER_PIP_ENV"}
    if pip_env is not None:
        env["KVTIER_PIP_ENV"] = (
            pip_env if isinstance(pip_env, str) else json.dumps(pip_env)
        )
    return subprocess.run(
        [str(overlay_bin), "status", *args],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip


def _found(root, version="0.33.0"):
    return {
        "root": str(root),
        "version": version,
        "dist_info": f"{root}/vllm-0.33.0.dist-info",
    }


def test_one_found_tree_is_used_and_named(overlay_bin, tree_copy):
    env = {
        "python": "/venv/bin/python",
        "engine": "vllm",
        "found": [_found(tree_copy)],
        "skipped": [],
    }
    done = _status(overlay_bin, env)
    assert done.returncode == 0, done.stderr
    assert "pristine" in done.stdout
    assert (
        f"overlay: no ROOT given: using {tree_copy} (vllm 0.33.0, {tree_copy}/vllm-0.33.0.dist-info, "
        "installed for /venv/bin/python)" in done.stderr
    )
    # -q: nothing on success, the choice included.
    assert _status(overlay_bin, env, "-q").stderr == ""


def test_none_found_is_refused_with_the_skipped_ones(overlay_bin, tree_copy):
    env = {"python": "/venv/bin/python", "engine": "vllm", "found": [],
           "skipped": ["/x/vllm-0.33.0.dist-info: its RECORD lists no vllm/__init__.py"]}  # fmt: skip
    done = _status(overlay_bin, env)
    assert done.returncode == 2
    assert (
        "no ROOT given and no vllm distribution is installed for /venv/bin/python"
        in done.stderr
    )
    assert "  skipped /x/vllm-0.33.0.dist-info: its RECORD lists no" in done.stderr


def test_several_found_are_refused_each_named(overlay_bin, tree_copy, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    env = {
        "python": "/p",
        "engine": "vllm",
        "found": [_found(tree_copy), _found(other, "0.34.0")],
    }
    done = _status(overlay_bin, env, "--json")
    assert done.returncode == 2
    assert "2 vllm distributions are installed for /p" in done.stderr
    assert json.loads(done.stdout)["ok"] is False
    done = _status(overlay_bin, env)
    assert f"  {tree_copy} (vllm 0.33.0)\n" in done.stderr
    assert f"  {other} (vllm 0.34.0)\n" in done.stderr


def test_root_given_wins_and_other_engines_or_garbage_mean_no_search(
    overlay_bin, tree_copy
):
    several = {"python": "/p", "engine": "vllm", "found": [_found("/a"), _found("/b")]}
    for args in (["--root", str(tree_copy)], [str(tree_copy)]):
        done = _status(overlay_bin, several, *args)
        assert done.returncode == 0, done.stderr
        assert "no ROOT given" not in done.stderr
    for env in ({"python": "/p"}, {"python": "/p", "engine": "sglang", "found": [_found(tree_copy)]},
                "not json", None):  # fmt: skip
        done = _status(overlay_bin, env)
        assert done.returncode == 2
        assert "ROOT is required" in done.stderr, done.stderr


def test_check_injected_compiles_with_the_shims_python(overlay_bin, tree_copy):
    """The interpreter the shim runs under is --python's default (the one
    whose vllm is patched); an explicit --python still wins."""
    env = {k: v for k, v in os.environ.items() if k != "KVTIER_PIP_ENV"}
    env["KVTIER_PIP_ENV"] = json.dumps({"python": "/nonexistent/py"})
    args = [str(overlay_bin), "apply", "--root", str(tree_copy), "--check-injected",
            "--overlays", "kv-offload-scope"]  # fmt: skip
    done = subprocess.run(args, capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 2
    assert "/nonexistent/py: cannot run the interpreter" in done.stderr
    done = subprocess.run(
        [*args, "--python", "python3"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
