"""engine/probe.py's writer ablations (pressure.turns with TURNS_REF_ABLATE) on the
real WorkerStore: what the GPU stage turns off must be off, and the capture memory must
come back, or the ablated engine measures a stalled writer instead of a cheap one."""

from __future__ import annotations

import sys

import pytest
import store_local_support as sls
from conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "engine"))

import probe  # noqa: E402


@pytest.fixture
def ablated(tmp_path, monkeypatch):
    booted = []

    def boot(mode):
        store, staging = sls.make_store(tmp_path)
        booted.append(store)
        assert store.active, store.disabled_reason
        # ablate_writer's own path: the worker's store, found through vLLM.
        monkeypatch.setattr(probe, "_store", lambda worker: (None, store))
        assert probe.ablate_writer(None, mode) == {"ablated": mode}
        return store, sls.JobMaker(staging)

    yield boot
    for store in booted:
        store.shutdown()


def test_capture_ablation_captures_every_key_and_writes_none(ablated, tmp_path):
    store, maker = ablated("capture")
    jobs = [maker.full_chunks(2 * i, 2) for i in range(4)]
    for job in jobs:
        sls.run_job(store, job)  # no writer thread: processed in place
    assert store.stats.keys_captured == 8
    assert store.stats.keys_written == 0 and sls.chunk_files(tmp_path) == []
    assert store.writer.pool.used == 0  # every job's memory back


def test_hooks_ablation_captures_nothing_and_forgets_each_job(ablated, tmp_path):
    store, maker = ablated("hooks")
    for i in range(3):
        sls.run_job(store, maker.full_chunks(2 * i, 2))
    assert store.stats.keys_captured == 0 and store._remembered == {}
    assert sls.chunk_files(tmp_path) == [] and store.writer.pool.used == 0


def test_an_unknown_ablation_is_refused(ablated):
    with pytest.raises(ValueError, match="unknown ablation"):
        ablated("writes")
