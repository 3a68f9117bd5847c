"""engine/pyspy.py (KVTIER_SUITE_PYSPY=1): py-spy's raw collapsed lines summarized, and a
process that starts py-spy on itself, as engine/stage.py does, seen holding the GIL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "engine"))

import pyspy  # noqa: E402

RAW = [
    "thread (0x7f01): MainThread;main (stage.py:400);generate (llm.py:10) 7\n",
    "thread (0x7f02): restore;run (restore.py:5);read_files (native.py:90) 12\n",
    "thread (0x7f01): MainThread;main (stage.py:400);listdir (inventory.py:31) 30\n",
    "thread (0x7f02): restore;run (restore.py:5);read_files (native.py:90) 3\n",
    "not a sample line\n",
    "\n",
]


def test_the_summary_counts_samples_threads_and_ranks_stacks_and_leaves():
    got = pyspy.summarize(RAW, top=2)
    assert got["samples"] == 52 and got["distinct_stacks"] == 3
    assert got["threads"] == {
        "thread (0x7f01): MainThread": 37,
        "thread (0x7f02): restore": 15,
    }
    assert got["top"] == [
        [
            "thread (0x7f01): MainThread;main (stage.py:400);listdir (inventory.py:31)",
            30,
        ],
        ["thread (0x7f02): restore;run (restore.py:5);read_files (native.py:90)", 15],
    ]
    assert got["top_leaves"] == [
        ["listdir (inventory.py:31)", 30],
        ["read_files (native.py:90)", 15],
    ]


def test_a_deep_stack_keeps_its_thread_and_innermost_frames():
    stack = "thread (1): MainThread;" + ";".join(f"f{i} (a.py:{i})" for i in range(100))
    (top,) = pyspy.summarize([stack + " 4\n"])["top"]
    frames = top[0].split(";")
    assert frames[0] == "thread (1): MainThread" and frames[1] == "...40 frames"
    assert frames[-1] == "f99 (a.py:99)" and len(frames) == 2 + pyspy.FRAMES_KEPT


def test_no_binary_is_a_reason_not_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv("KVTIER_PYSPY_BIN", str(tmp_path / "none"))
    handle = pyspy.start(str(tmp_path / "o.txt"))
    got = pyspy.stop(handle)
    assert "py-spy not found" in got["error"] and got["samples"] == 0


def test_bin_py_spy_beside_a_site_folder_is_found(tmp_path, monkeypatch):
    monkeypatch.delenv("KVTIER_PYSPY_BIN", raising=False)
    (tmp_path / "bin").mkdir()
    exe = tmp_path / "bin" / "py-spy"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/nonexistent", str(tmp_path)]))
    assert pyspy.find_binary() == str(exe)


CHILD = textwrap.dedent(
    """
    import json, sys, time
    sys.path.insert(0, sys.argv[2])
    import pyspy

    def hold_the_gil():
        t = time.time()
        while time.time() - t < 1.5:
            sum(range(10**6))

    handle = pyspy.start(sys.argv[1], settle_s=1.0)
    hold_the_gil()
    print(json.dumps(pyspy.stop(handle, timeout_s=20)))
    """
)


def test_a_process_sampling_itself_shows_the_call_holding_the_gil(tmp_path):
    binary = pyspy.find_binary()
    if binary is None:
        pytest.skip("py-spy is not installed here (pip install py-spy==0.4.1)")
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    out = tmp_path / "child.pyspy.txt"
    run = subprocess.run(
        [sys.executable, str(script), str(out), str(REPO_ROOT / "engine")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout.strip().splitlines()[-1])
    if got.get("error") or got.get("rc") != 0 or not got["samples"]:
        pytest.skip(
            f"py-spy could not sample here (ptrace refused? prctl {got.get('prctl')}, "
            f"ptrace_scope {got.get('ptrace_scope')}): {got.get('error')} "
            f"{got.get('stderr_tail', '')[-300:]}"
        )
    assert got["argv"][:2] == [binary, "record"] and "--gil" in got["argv"]
    assert out.exists() and got["file"] == out.name
    assert any("hold_the_gil (child.py" in stack for stack, _ in got["top"]), got
    assert any(label.endswith("MainThread") for label in got["threads"]), got
    assert got["pyspy_samples"] >= got["samples"] > 10
