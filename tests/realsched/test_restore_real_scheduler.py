"""kv-offload-restore on the real vLLM 0.33.0 scheduler side.

The real Scheduler, HybridKVCacheCoordinator, OffloadingConnector (scheduler role) and the
TieringOffloadingSpec's managers, with our LocalStoreTier created by vLLM's own factory from
the connector config's ``secondary_tiers`` entry (``module_path``), exactly as a deployment
configures it. The workers are played (realsched.Engine acknowledges transfers); on top of
that, ``Workers`` plays what each rank's WorkerRestore reports through the worker metadata:
READY, the keys its manifests prove (taken from the boundary-manifest candidates the real
scheduler attached to A's store jobs), and its answer to each promotion the scheduler sent
in its real connector metadata. The worker side itself (files, checks, rows) is covered by
tests/python/test_kv_offload_restore.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import realsched

OFFLOADING = "vllm.distributed.kv_transfer.kv_connector.v1.offloading"
TIER = {"type": "LocalStoreTier", "module_path": f"{OFFLOADING}.kv_restore_tier"}
PROMPT = list(range(1, 99))  # 98 tokens: 6 full blocks of 16
MAX_TOKENS = 3  # decode steps schedule MAX_TOKENS - 1 more tokens


@pytest.fixture
def restore_on(knobs, monkeypatch, tmp_path):
    knobs(**{"": "1", "DIR": str(tmp_path / "store"), "CPU_GB": "1", "RESTORE": "1"})
    plain = realsched.connector_config

    def with_tier(cpu_bytes):
        config = plain(cpu_bytes)
        config["kv_connector_extra_config"]["secondary_tiers"] = [dict(TIER)]
        return config

    monkeypatch.setattr(realsched, "connector_config", with_tier)
    monkeypatch.setattr(realsched, "_BASE_CONFIGS", {})


class Workers:
    """What the ranks' WorkerRestore objects report, through the real worker metadata."""

    def __init__(self, engine, ranks: int, answer: str = "ok"):
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading import (
            kv_restore_reports as reports,
        )

        self.r = reports
        self.ranks = ranks
        self.answer = answer
        self.queued: list[tuple[int, int]] = [(reports.READY, 0)]
        self.promotions: list[dict] = []
        self._this_step: list[dict] = []
        s = engine.s
        schedule, update = s.schedule, s.update_from_output

        def schedule_and_watch():
            out = schedule()
            sent = list(getattr(out.kv_connector_metadata, "kv_restore", None) or [])
            self.promotions += sent
            self._this_step = sent
            return out

        def update_with_reports(out, mro):
            completed = mro.kv_connector_output.kv_connector_worker_meta.completed_jobs
            items = list(self.queued)
            self.queued.clear()
            kind = reports.PROMOTE_OK if self.answer == "ok" else reports.PROMOTE_FAIL
            items += [(kind, p["job"]) for p in self._this_step]
            self._this_step = []
            for k, value in items:  # every rank reports it: vLLM sums the counts
                completed[reports.encode(k, value)] = self.ranks
            return update(out, mro)

        s.schedule = schedule_and_watch
        s.update_from_output = update_with_reports

    def prove(self, keys) -> None:
        self.queued += [(self.r.KEY_UP, self.r.key_digest(k)) for k in keys]


def proven_keys(engine) -> set[bytes]:
    """Every key a published boundary manifest of A's store jobs would prove."""
    keys = set()
    for step in engine.steps:
        for job in step.store_jobs.values():
            for c in (job.kv_store_meta or {}).get("candidates") or []:
                for chunk in c["chain"]:
                    keys |= {chunk + g.to_bytes(4, "big") for g in c["full"]}
                keys |= {c["chain"][-1] + g.to_bytes(4, "big") for g in c["state"]}
    return keys


def tier_of(booted):
    (tier,) = booted.offload.manager.secondary_tiers
    assert type(tier).__name__ == "LocalStoreTier"
    return tier


def write_then_restart(answer: str, drafter: str, eagle: bool):
    """A is served and stored; the engine restarts; B (A's prompt) arrives.

    After the restart neither the GPU prefix cache nor the CPU tier holds anything
    (a reset alone would leave A in the CPU tier), so only the store can serve B.
    """
    first = realsched.boot(drafter=drafter, eagle=eagle)
    engine = realsched.Engine(first)
    Workers(engine, first.vllm_config.parallel_config.world_size)
    engine.add("a", PROMPT, MAX_TOKENS)
    engine.run()
    keys = proven_keys(engine)
    assert keys, "A's store jobs named no boundary manifest"
    realsched.shut_down_booted()  # engine 1 exits before engine 2 boots

    booted = realsched.boot(drafter=drafter, eagle=eagle)
    engine = realsched.Engine(booted)
    workers = Workers(engine, booted.vllm_config.parallel_config.world_size, answer)
    workers.prove(keys)  # the boot scan of every rank: READY and its keys
    engine.add("b", PROMPT, MAX_TOKENS)
    engine.run()
    scheduled = sum(st.scheduled.get("b", 0) for st in engine.steps)
    return (
        booted,
        engine,
        workers,
        scheduled - (MAX_TOKENS - 1),
    )  # prompt tokens computed


def test_a_restart_restores_the_prefix_through_the_real_scheduler(restore_on):
    booted, engine, workers, computed = write_then_restart("ok", "same", eagle=False)
    tier = tier_of(booted)
    assert tier.num_workers == booted.vllm_config.parallel_config.world_size
    assert tier.stats.promotions_ok >= 1 and tier.stats.promotions_failed == 0
    assert workers.promotions and all(p["keys"] for p in workers.promotions)
    (load,) = [j for j in engine.load_jobs if j["req"] == "b"]
    promoted = {k.hex() for p in workers.promotions for k in p["keys"]}
    assert set(load["keys"]) <= promoted  # every loaded key came from the store
    restored = len(PROMPT) - computed
    assert restored > 0 and restored % realsched.BLOCK == 0
    assert "b" in engine.finished


def test_a_failed_promotion_recomputes_and_loads_nothing(restore_on):
    booted, engine, workers, computed = write_then_restart("fail", "same", eagle=False)
    tier = tier_of(booted)
    assert workers.promotions and tier.stats.promotions_failed >= 1
    assert tier.stats.promotions_ok == 0
    assert [j for j in engine.load_jobs if j["req"] == "b"] == []
    assert computed == len(PROMPT)  # every prompt token recomputed
    assert "b" in engine.finished


def test_a_drafter_left_out_of_offload_is_never_marked_loaded(restore_on):
    """EAGLE drafter in its own sliding-window group, not offloaded (DRAFTER=0): the
    restore loads the target groups only, and the connector says so, so vLLM zeroes the
    drafter's new blocks instead of keeping whatever they held (its default, every
    prefix-cacheable group, would mark them loaded)."""
    booted, engine, workers, computed = write_then_restart("ok", "swa", eagle=True)
    groups = booted.kv_cache_config.kv_cache_groups
    drafter = [i for i, g in enumerate(groups) if g.is_eagle_group]
    assert drafter and set(drafter) <= set(
        booted.kv_cache_config.prefix_cacheable_group_ids
    )
    offloaded = [g.group_idx for g in booted.offload.config.kv_group_configs]
    assert not set(drafter) & set(offloaded)
    request = engine.s.requests.get("b") or SimpleNamespace(request_id="b")
    loaded = booted.connector.get_loaded_kv_cache_group_ids(request)
    assert tuple(loaded) == tuple(offloaded)
    (load,) = [j for j in engine.load_jobs if j["req"] == "b"]
    assert computed < len(PROMPT) and "b" in engine.finished


def test_an_eagle_attention_group_needs_a_state_one_chunk_earlier(restore_on):
    """Drafter layers in the target's attention group (an EAGLE group): vLLM drops the
    group's last hit chunk, so the state must be proven one chunk before the manifest's
    boundary, which no manifest proves: a safe miss, B recomputes, nothing is loaded."""
    booted, engine, workers, computed = write_then_restart("ok", "same", eagle=True)
    assert [j for j in engine.load_jobs if j["req"] == "b"] == []
    assert computed == len(PROMPT)
    assert "b" in engine.finished


def test_a_refused_restore_boot_leaves_no_cpu_region(knobs, tmp_path):
    # RESTORE=1 without the LocalStoreTier entry: refused after vLLM made the CPU tier's
    # region in /dev/shm; the refusal shuts the manager down, so the file goes too (the
    # autouse guard in conftest.py fails the test if it stays).
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.kv_restore_worker import (  # noqa: E501
        RestoreRefused,
    )

    knobs(**{"": "1", "CPU_GB": "1", "RESTORE": "1", "DIR": str(tmp_path / "store")})
    before = realsched.offload_regions()
    with pytest.raises(RestoreRefused, match="LocalStoreTier"):
        realsched.boot()
    assert realsched.offload_regions() == before
