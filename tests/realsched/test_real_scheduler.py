"""Both overlays on the real vLLM 0.33.0 scheduler side: Scheduler, HybridKVCacheCoordinator,
OffloadingConnector (scheduler role) and the TieringOffloadingSpec's real CPU manager, on a
hybrid layout (4 mamba "align" state groups, 2 full-attention groups, an EAGLE drafter),
driven through schedule() / update_from_output(). See realsched.py for what is played.
"""

from __future__ import annotations

import logging
import pickle

import pytest
import realsched

DRAFTER_GROUP = 6
TARGET_GROUPS = [0, 1, 2, 3, 4, 5]


def _manager(booted):
    """The CPU manager that owns the chunks (the tiering spec's primary tier)."""
    manager = booted.offload.manager
    while not hasattr(manager, "_policy"):
        inner = getattr(manager, "primary_tier", None) or getattr(manager, "_m", None)
        assert inner is not None, type(manager).__name__
        manager = inner
    return manager


def _store_jobs(engine):
    return {j: job for st in engine.steps for j, job in st.store_jobs.items()}


def _job_keys(engine):
    return {j: keys for st in engine.steps for j, keys in st.job_keys.items()}


# -- the layout itself ------------------------------------------------------------------------


def test_real_grouping_of_the_hybrid_layout(knobs, installed_tree, pinned_files_intact):
    booted = realsched.boot()
    groups = booted.kv_cache_config.kv_cache_groups
    kinds = [type(g.kv_cache_spec).__name__ for g in groups]
    assert kinds == ["MambaSpec"] * 4 + ["FullAttentionSpec"] * 2 + [
        "SlidingWindowSpec"
    ]
    assert [g.is_eagle_group for g in groups] == [False] * 6 + [True]
    assert type(booted.scheduler.kv_cache_manager.coordinator).__name__ == (
        "HybridKVCacheCoordinator"
    )
    assert type(booted.connector).__name__ == "OffloadingConnector"
    # The patched modules are the ones running; the venv's own files are untouched.
    import vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler as sched_mod

    assert str(installed_tree) not in sched_mod.__file__
    assert pinned_files_intact() == []


# -- kv-offload-scope -------------------------------------------------------------------------


TIER_ON = {"": "1", "CPU_GB": "1"}


def test_drafter_group_left_out_and_boot_line(knobs, caplog, tmp_path):
    knobs(**TIER_ON, DIR=str(tmp_path))
    with caplog.at_level(logging.INFO):
        booted = realsched.boot()
    assert [
        g.group_idx for g in booted.offload.config.kv_group_configs
    ] == TARGET_GROUPS
    lines = [
        r.getMessage() for r in caplog.records if "eligible groups" in r.getMessage()
    ]
    assert any(
        "KV offloading eligible groups: [0, 1, 2, 3, 4, 5] of 7 (draft-model groups [6]"
        in line
        for line in lines
    ), lines
    # A group outside the offload set: no partial tails.
    assert booted.offload.config.supports_partial_tail is False


def test_drafter_group_offloaded_with_the_knob(knobs, tmp_path):
    knobs(**TIER_ON, DIR=str(tmp_path), DRAFTER="1")
    booted = realsched.boot()
    assert [g.group_idx for g in booted.offload.config.kv_group_configs] == [
        *TARGET_GROUPS,
        DRAFTER_GROUP,
    ]


@pytest.mark.parametrize(("keep", "warned"), [("1", True), ("2", False)])
def test_keeping_one_boundary_beside_a_shared_drafter_group_warns(
    knobs, tmp_path, keep, warned
):
    """Drafter layers in the target's attention group without lookahead hashes (0.33.0): a
    chain's newest manifest is the one past its state boundary, so keep-K of 1 leaves
    nothing to restore. With them (0.34.0) the boundary is the newest: no warning."""
    knobs(**TIER_ON, DIR=str(tmp_path), KEEP_BOUNDARIES=keep)
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    # vLLM's loggers need not propagate to caplog's root handler: listen on ours.
    name = "vllm.distributed.kv_transfer.kv_connector.v1.offloading"
    logger = logging.getLogger(f"{name}.kv_store_local.vllm_scheduler")
    logger.addHandler(handler)
    try:
        booted = realsched.boot(drafter="same", eagle=True)
    finally:
        logger.removeHandler(handler)
    lines = [r.getMessage() for r in records if "restores miss" in r.getMessage()]
    lookahead = booted.vllm_config.num_hash_lookahead_tokens
    assert bool(lines) == (warned and not lookahead), (lookahead, lines)


def test_pristine_offloads_the_drafter(pristine_traces):
    trace = pristine_traces("prefix")["prefix"]
    assert trace["offloaded_groups"] == [*TARGET_GROUPS, DRAFTER_GROUP]


@pytest.mark.parametrize("target", ["hybrid", "attention"])
def test_drafter_sharing_the_target_spec_keeps_the_target_group(
    knobs, target, tmp_path
):
    """vLLM puts a drafter whose spec equals the target's attention spec into the target's
    group and flags that whole group as EAGLE. It holds target KV, so it stays eligible.

    Found on the H200 (docs/ENGINE-RUNS.md): a plain Llama with an EAGLE head has one such group,
    and the scope overlay left it out, so the patched engine did not boot at all ("KV
    offloading found no eligible cache groups"), whatever GLM53_KV_OFFLOAD said. With
    the disk tier on it is offloaded too (an MTP head sharing a group: the same)."""
    knobs(**TIER_ON, DIR=str(tmp_path))
    booted = realsched.boot(drafter="same", target=target)
    groups = booted.kv_cache_config.kv_cache_groups
    mixed = [i for i, g in enumerate(groups) if g.is_eagle_group]
    assert len(mixed) == 1
    names = groups[mixed[0]].layer_names
    draft = (
        "model.layers.6.self_attn.attn"
        if target == "hybrid"
        else ("model.layers.2.self_attn.attn")
    )
    assert draft in names and len(names) > 1
    offloaded = [g.group_idx for g in booted.offload.config.kv_group_configs]
    assert offloaded == list(range(len(groups)))


# -- kv-offload-store-local, with the real CPU manager --------------------------------------


def test_every_store_job_carries_its_keys_in_chunk_order(knobs, tmp_path):
    knobs(**{"": "1", "DIR": str(tmp_path), "CPU_GB": "1"})
    booted, engine, _ = realsched.run_scenario("prefix")
    jobs = _store_jobs(engine)
    assert jobs, "the real scheduler made no store job"
    manager = _manager(booted)
    slots = {
        g.group_idx: s for s, g in enumerate(booted.offload.config.kv_group_configs)
    }
    seen_groups = set()
    for job_id, job in jobs.items():
        meta = job.kv_store_meta
        assert meta["version"] == 1
        keys = meta["keys"]
        # 1:1 with the scheduler's record of the job and with its CPU chunks ...
        assert len(keys) == len(set(keys))
        assert set(keys) == _job_keys(engine)[job_id]
        assert len(keys) == len(job.dst_spec.block_ids) == len(job.src_spec.block_ids)
        # ... and in the order the real manager allocated the chunks (CPU row = key).
        chunk_ids = [int(c) for c in job.dst_spec.block_ids]
        assert [manager._policy.get(k).chunk_id for k in keys] == chunk_ids
        # Block order: slot, then end token.
        order = [
            (slots[g], t) for g, t in zip(meta["groups"], meta["tokens"], strict=True)
        ]
        assert order == sorted(order)
        assert all(
            int.from_bytes(k[-4:], "big") == g for k, g in zip(keys, meta["groups"])
        )
        seen_groups.update(meta["groups"])
        pickle.loads(
            pickle.dumps(job)
        )  # travels to the workers with the scheduler output
    # State groups and attention groups were both stored; the drafter was not.
    assert {0, 1, 2, 3} & seen_groups and {4, 5} & seen_groups
    assert DRAFTER_GROUP not in seen_groups


def test_candidates_name_stored_state_and_chains(knobs, tmp_path):
    knobs(**{"": "1", "DIR": str(tmp_path), "CPU_GB": "1"})
    booted, engine, _ = realsched.run_scenario("prefix")
    stored = {
        k for job in _store_jobs(engine).values() for k in job.kv_store_meta["keys"]
    }
    candidates = [
        c
        for job in _store_jobs(engine).values()
        for c in job.kv_store_meta["candidates"]
    ]
    assert candidates
    for c in candidates:
        assert c["boundary"] % realsched.BLOCK == 0
        assert len(c["chain"]) == c["boundary"] // c["chunk_tokens"]
        assert set(c["state"]) <= {0, 1, 2, 3} and set(c["full"]) <= {4, 5}
    # Every state key the manager stored at a boundary names that boundary's last hash.
    for job in _store_jobs(engine).values():
        meta = job.kv_store_meta
        for key, group, token in zip(meta["keys"], meta["groups"], meta["tokens"]):
            if group in (0, 1, 2, 3):
                assert token % realsched.BLOCK == 0
    assert stored


def test_real_manager_deduplicates_the_shared_prefix(knobs, tmp_path):
    knobs(**{"": "1", "DIR": str(tmp_path), "CPU_GB": "1"})
    _, engine, _ = realsched.run_scenario("prefix")
    keys_by_req: dict[str, list[bytes]] = {}
    for job in _store_jobs(engine).values():
        keys_by_req.setdefault(job.req_id, []).extend(job.kv_store_meta["keys"])
    for keys in keys_by_req.values():
        assert len(keys) == len(set(keys))
    # b shares its first 48 tokens (3 blocks) with a: no key is stored twice.
    assert not set(keys_by_req["a"]) & set(keys_by_req["b"])


def test_store_only_still_loads_what_the_cpu_tier_holds(
    knobs, tmp_path, pristine_traces
):
    """Knob 1 (the writer on, no restore from disk) keeps vLLM's own CPU-tier hits: c's
    prefix loads from CPU memory as upstream loads it (issue 48: it used to be recomputed,
    a slower engine than the tier off)."""
    pristine = pristine_traces("reload")["reload"]
    assert pristine["load_jobs"], "upstream should load c's prefix from the CPU tier"
    # The drafter's group offloaded as upstream offloads it, so the loads compare whole.
    knobs(**{"": "1", "DIR": str(tmp_path), "CPU_GB": "1", "DRAFTER": "1"})
    booted, engine, trace = realsched.run_scenario("reload")
    loads = realsched.canonical(trace)["load_jobs"]
    assert loads and loads == realsched.canonical(pristine)["load_jobs"]
    assert engine.s.requests.get("c") is None and "c" in engine.finished


@pytest.mark.parametrize("drafter", [None, "0", "1"])
def test_tier_off_loads_like_upstream(knobs, pristine_traces, drafter):
    """Tier off (upstream's offload set, the drafter's group included, whatever the drafter
    knob says): the patched tree schedules and loads what upstream does (issue 39)."""
    knobs(DRAFTER=drafter)
    _, _, trace = realsched.run_scenario("reload")
    pristine = pristine_traces("reload")["reload"]
    assert realsched.canonical(trace) == realsched.canonical(pristine)
    assert trace["load_jobs"]


def test_knob_zero_schedules_exactly_like_the_scoped_tree(knobs):
    knobs(**{"": "0"})
    _, _, zero = realsched.run_scenario("reload")
    knobs()
    _, _, unset = realsched.run_scenario("reload")
    assert realsched.canonical(zero) == realsched.canonical(unset)


def test_store_jobs_identical_with_the_writer_on(knobs, tmp_path):
    """The store-only writer changes no store job: same jobs, same GPU blocks, same CPU
    chunks (the drafter offloaded on both sides, as the tier-off scope does)."""
    knobs()
    _, _, off = realsched.run_scenario("prefix")
    knobs(**{"": "1", "DIR": str(tmp_path), "CPU_GB": "1", "DRAFTER": "1"})
    _, _, on = realsched.run_scenario("prefix")
    assert realsched.canonical(on)["steps"] == realsched.canonical(off)["steps"]


def test_eviction_by_the_real_manager_keeps_the_side_channel_exact(knobs, tmp_path):
    knobs(**{"": "1", "DIR": str(tmp_path), "CPU_GB": "1"})
    booted, engine, trace = realsched.run_scenario("evict")
    manager = _manager(booted)
    jobs = _store_jobs(engine)
    offered = sum(len(job.kv_store_meta["keys"]) for job in jobs.values())
    assert manager._num_chunks == 12
    assert offered > manager._num_chunks  # the tier turned over
    for job in jobs.values():
        meta = job.kv_store_meta
        assert len(meta["keys"]) == len(job.dst_spec.block_ids)
        assert all(0 <= int(c) < 12 for c in job.dst_spec.block_ids)
    # Keys of the early requests were evicted to make room for later ones.
    first = [
        k for j in jobs.values() if j.req_id == "e0" for k in j.kv_store_meta["keys"]
    ]
    assert any(manager._policy.get(k) is None for k in first)
    assert sorted(trace["finished"]) == [f"e{r}" for r in range(6)]


def test_bad_knob_fails_the_scheduler_boot(knobs, tmp_path):
    knobs(**{"": "1", "DIR": str(tmp_path), "CPU_GB": "1", "KEEP_BOUNDARIES": "two"})
    with pytest.raises(ValueError, match="GLM53_KV_OFFLOAD_KEEP_BOUNDARIES"):
        realsched.boot()
