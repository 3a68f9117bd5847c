"""Two vLLM releases on one store: the namespace fence keeps them apart.

The namespace record fences the vLLM version (docs/FORMAT.md, "Namespace"), so
a store written by one release is another namespace to the next: a 0.32.0
engine booted on a 0.33.0 engine's store restores nothing and recomputes. Both
trees are patched by the real `overlay apply` and run by restore_rig.Rig, each
stamping its own tree's version (vllm.version, pinned).
"""

from __future__ import annotations

import os
import shutil
import subprocess

import harness
import pytest
from conftest import REPO_ROOT, fetch_tree
from restore_rig import BLOCK, OFFLOADING, Rig, chain_hashes, env_on

PROMPT_BLOCKS = 8
RESTORED = 6 * BLOCK  # what the same release restores (test_kv_offload_restore)
WRITER, READER = "vllm-0.33.0", "vllm-0.32.0"


def patched(overlay_bin, engine: str, dst) -> str:
    pin_dir = REPO_ROOT / "fixtures" / engine
    if not (pin_dir / "PINS").is_file():
        pytest.skip(f"no pin set {engine}")
    manifests = REPO_ROOT / "anchors" / engine
    order = [
        line.strip()
        for line in (manifests / "ORDER").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    order = [o for o in order if o.startswith("kv-offload")]
    root = dst / "site-packages"
    shutil.copytree(
        fetch_tree(pin_dir), root, ignore=shutil.ignore_patterns("__pycache__")
    )
    done = subprocess.run(
        [str(overlay_bin), "apply", "--check-injected", "--root", str(root)]
        + ["--manifests", str(manifests), "--overlays", ",".join(order)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return str(root)


def lookup_b(rig: Rig, hashes) -> int:
    request = rig.request("b", hashes, PROMPT_BLOCKS * BLOCK)
    rig.scheduler.on_new_request(request)
    hits, _ = rig.lookup(request)
    return hits


def namespaces(store) -> set[str]:
    return {
        entry.name
        for entry in os.scandir(store)
        if entry.is_dir() and not entry.name.startswith(".")
    }


def test_a_0_32_0_engine_never_restores_a_0_33_0_store(
    overlay_bin, tmp_path, monkeypatch
):
    for name in list(os.environ):
        if name.startswith("GLM53_KV_OFFLOAD"):
            monkeypatch.delenv(name)
    store = tmp_path / "store"
    env_on(monkeypatch, store)
    writer_tree = patched(overlay_bin, WRITER, tmp_path / "w")
    reader_tree = patched(overlay_bin, READER, tmp_path / "r")
    hashes = chain_hashes("a", PROMPT_BLOCKS)
    with harness.engine(writer_tree, package="vllm") as ns:
        assert ns.load("vllm").__version__ == "0.33.0"
        rig = Rig(ns, store)
        rig.store_request("a", hashes, PROMPT_BLOCKS, 0)
        rig.shutdown()
        # The control: the writer's own release restores what it wrote.
        again = Rig(ns, store)
        assert lookup_b(again, hashes) == RESTORED
        again.shutdown()
    written = namespaces(store)
    with harness.engine(reader_tree, package="vllm") as ns:
        assert ns.load("vllm").__version__ == "0.32.0"
        rig = Rig(ns, store)
        # Same prompt, same keys, same model: only the fenced version differs.
        assert lookup_b(rig, hashes) == 0
        assert rig.tier.stats.promotions_ok == 0
        for restorer in rig.restorers:
            assert restorer.stats.bytes_restored == 0
        rig.shutdown()
        # The version is the whole difference: stamped with the writer's, the
        # same 0.32.0 engine restores (so the miss above is the fence's).
        worker = ns.load(f"{OFFLOADING}.kv_store_local.vllm_worker")
        monkeypatch.setattr(worker, "vllm_version", lambda: "0.33.0")
        forged = Rig(ns, store)
        assert lookup_b(forged, hashes) == RESTORED
        forged.shutdown()
    # The reader booted its own namespace beside the writer's.
    assert written and written < namespaces(store), (written, namespaces(store))
