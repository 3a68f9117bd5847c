"""Without --manifests, `overlay` takes anchors/<engine>-<version> of the tree's
own version (vllm/_version.py here; a dist-info where there is one), so one
tool serves every pinned release; another release's manifests drift."""

from __future__ import annotations

import subprocess

from conftest import PIN_DIRS, REPO_ROOT, fetch_tree

OVERLAYS = "kv-offload-scope,kv-offload-store-local,kv-offload-restore"


def plan(overlay_bin, tree, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(overlay_bin), "plan", "--root", str(tree), "--overlays", OVERLAYS]
        + list(extra),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_tree_version_picks_the_manifests(overlay_bin, engine_tree, pin_dir):
    done = plan(overlay_bin, engine_tree)
    assert done.returncode == 0, done.stderr
    for other in PIN_DIRS:
        if other == pin_dir:
            continue
        # The other release's anchors on this tree: pins differ, so drift (3).
        wrong = plan(
            overlay_bin,
            fetch_tree(other),
            "--manifests",
            str(REPO_ROOT / "anchors" / pin_dir.name),
        )
        assert wrong.returncode == 3, wrong.stdout + wrong.stderr
