"""Crash safety: SIGKILL the writer at random points, many times.

After every kill the store must hold no live manifest naming a missing or bad
file; `kvstore verify` (when built) must agree. Temp files and orphan chunks
may be left: they are kvstore gc's business, never a manifest's.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import store_local_support as sls
from conftest import REPO_ROOT, TESTS_PYTHON
from kv_store_format import native

HERE = Path(__file__).resolve().parent
KILLS = 24


@pytest.mark.parametrize("writer", ["native", "budget"])
def test_sigkill_at_random_points_never_leaves_a_bad_manifest(
    tmp_path, build_dir, writer
):
    if not os.path.isfile(native.library_path()):
        pytest.skip(f"{native.library_path()} is not built")
    rng = random.Random(20261129)
    env = dict(os.environ, PYTHONPATH=f"{TESTS_PYTHON}{os.pathsep}{REPO_ROOT / 'sim'}")
    if writer == "budget":  # the store in a folder of its own: the marker beside it
        tmp_path = tmp_path / "store"
        tmp_path.mkdir(mode=0o700)
    published = 0
    for run in range(KILLS):
        proc = subprocess.Popen(
            [
                sys.executable,
                str(HERE / "store_local_crash_writer.py"),
                str(tmp_path),
                str(run),
                writer,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        try:
            assert proc.stdout.readline().strip() == b"ready", proc.stderr.read()
            time.sleep(rng.uniform(0.0, 0.25))
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
        assert proc.returncode == -signal.SIGKILL
        assert sls.verify_store(tmp_path) == [], f"after kill {run}"
        (base,) = sls.rank_bases(tmp_path)
        published = max(published, len(sls.manifests(base)))
    assert published > 0  # the kills did land while manifests were being written
    if writer == "budget":  # SIGKILL during evictions: orphans at most (above)
        assert (tmp_path.parent / "evicted").exists()
    kvstore = build_dir / "kvstore" / "kvstore"
    if kvstore.is_file() and os.access(kvstore, os.X_OK):
        # Killed writers leave their pending records (and maybe temps) for
        # the sweep to remove; after it, the store verifies clean.
        swept = subprocess.run(
            [str(kvstore), "gc", str(tmp_path), "--sweep"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert swept.returncode == 0, swept.stdout + swept.stderr
        assert sls.verify_store(tmp_path) == []
        done = subprocess.run(
            [str(kvstore), "verify", str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr
