"""The README's main job (scripts/demo.sh) runs end to end and says so.

It runs the same command a newcomer runs, with its scratch folder and TMPDIR
pointed into tmp_path, and checks the exit code, the summary lines, and that
nothing was written outside the scratch folder.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STEPS = (
    "fetch pinned sources",
    "apply the overlays",
    "pre-stop gate",
    "write a store",
    "kvstore",
    "restore",
    "revert",
    "C++ overlay",
)


def git_status() -> str:
    return subprocess.run(
        ["git", "status", "--porcelain", "--ignored"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def test_main_job_runs_end_to_end(build_dir, overlay_bin, kvstore_bin, tmp_path):
    scratch = tmp_path / "scratch"
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GLM53_")}
    env.update(BUILD_DIR=str(build_dir), TMPDIR=str(tmpdir), NO_COLOR="1")
    before = git_status()
    done = subprocess.run(
        [str(REPO / "scripts" / "demo.sh"), "--scratch", str(scratch)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    summary = out[out.index("== 9. summary") :]
    for step in STEPS:
        line = next(ln for ln in summary.splitlines() if ln.strip().startswith(step))
        assert "FAILED" not in line, line
    assert "verify clean, corruption caught, swept, verify clean" in summary
    assert "evicted, under budget, verify clean" in summary  # the disk budget
    assert "RESTORE=1 go, RESTORE=2 refused (2)" in summary
    assert "files equal their pins" in summary
    assert "tokens on 2 ranks, bytes equal; corrupted chunk -> recompute" in summary
    # The counters vLLM's /metrics would show, after the restore row.
    after_restore = summary[summary.index("corrupted chunk -> recompute") :]
    assert "write engine: vllm:kv_offload_store_keys_written_total " in after_restore
    assert "restart engine: vllm:kv_offload_restore_keys_total " in after_restore
    assert (
        'corrupted engine: vllm:kv_offload_restore_jobs_refused_total{reason="'
        in after_restore
    )
    assert "vllm-fs-durable applied, compile-checked, reverted" in summary
    assert summary.rstrip().splitlines()[-1].startswith("demo: ok in ")
    # Nothing outside the scratch folder: no temp files, no repo changes.
    assert list(tmpdir.iterdir()) == []
    assert git_status() == before
    assert (scratch / "store").is_dir() and (scratch / "kvstore.prom").is_file()
    assert "\033[" not in out  # no colour when not on a terminal
