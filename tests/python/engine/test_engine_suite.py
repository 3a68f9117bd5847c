"""The GPU suite's judge (engine/suite.py and its suite_*.py modules) on hand-made stage
results: every check it makes on the H200 must be able to fail. No GPU or vLLM needed."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "engine"))

import suite  # noqa: E402
import suite_compare  # noqa: E402
import suite_models  # noqa: E402
import suite_pressure  # noqa: E402
import suite_realsize  # noqa: E402
import suite_restore  # noqa: E402

STEP = [[5, -0.25], [9, -1.5]]


def stage(logprobs=None, **extra) -> dict:
    rounds = [{"logprobs": logprobs or [[STEP, STEP]], "tokens_per_s": 100.0,
               "seconds": 1.0, "tokens": [[1] * 32]}]  # fmt: skip
    return {"rc": 0, "rounds": rounds, **extra}


def writer_stage(tp: int = 1, **over) -> dict:
    workers = []
    for rank in range(tp):
        workers.append(
            {
                "active": True,
                "rank": rank,
                "base": f"/s/ns_r{rank}",
                "tp_group": [rank, tp],
                "compare": {
                    "keys": 5,
                    "equal": 4,
                    "different": 0,
                    "no_file": 1,
                    "shape": 0,
                },
                "stats": {"state_files_removed": 1, "keys_dropped_budget": 3},
            }
        )
    res = stage(
        workers=workers,
        install=[{"writer_groups": [0, 1], "offloaded_groups": [0, 1]}] * tp,
        eligible_lines=[
            "KV offloading eligible groups: [0, 1] of 2 (draft-model groups [])"
        ],
        kvstore_verify={"rc": 0},
    )
    res.update(over)
    return res


def test_identical_logprobs_pass_and_any_difference_fails():
    same = suite_compare.same_logprobs
    assert same(stage(), stage())["ok"]
    other = [[[[5, -0.25], [9, -1.5000001]], STEP]]
    verdict = same(stage(), stage(other))
    assert not verdict["ok"] and verdict["max_abs_logprob_diff"] > 0
    swapped = [[[[5, -0.25], [8, -1.5]], STEP]]
    assert same(stage(), stage(swapped))["top20_token_sets_differ"] == 1
    assert not same(stage(), stage([[STEP]]))["ok"]  # a step missing
    assert not same({"rounds": []}, {"rounds": []})["ok"]  # nothing compared


def test_writer_check_passes_a_good_stage():
    assert suite.check_writer(writer_stage(), 1)["ok"]
    assert suite.check_writer(writer_stage(tp=2), 2)["ok"]


@pytest.mark.parametrize(
    "breakage",
    [
        lambda r: r["workers"][0]["compare"].update(different=1),
        lambda r: r["workers"][0]["compare"].update(equal=0),
        lambda r: r["workers"][0]["compare"].update(
            no_file=2
        ),  # more than retention removed
        lambda r: r["workers"][0].update(active=False),
        lambda r: r["install"][0].update(writer_groups=[0]),
        lambda r: r.update(eligible_lines=[]),
        lambda r: r.update(kvstore_verify={"rc": 1}),
        lambda r: r["workers"][0].update(tp_group=[0, 2]),
        lambda r: r.update(rc=1),
    ],
)
def test_writer_check_fails_on_each_defect(breakage):
    res = copy.deepcopy(writer_stage())
    breakage(res)
    assert not suite.check_writer(res, 1)["ok"]


def test_tp2_needs_two_ranks_with_their_own_folders():
    res = writer_stage(tp=2)
    res["workers"][1]["base"] = res["workers"][0]["base"]
    assert not suite.check_writer(res, 2)["ok"]
    assert not suite.check_writer(writer_stage(tp=1), 2)["ok"]


def test_pressure_needs_counted_drops_full_outputs_and_a_clean_store():
    results = {"pressure.off": stage(), "pressure.on": writer_stage()}
    verdicts = suite.judge(results)
    assert verdicts["pressure.on: all requests served, drops counted, store clean"][
        "ok"
    ]
    ratio = verdicts[
        "throughput tier on / off (round 0, tokens/s; median of the pairs)"
    ]
    assert ratio["ratio"] == 1.0
    results["pressure.on"]["workers"][0]["stats"]["keys_dropped_budget"] = 0
    assert not suite.judge(results)[
        "pressure.on: all requests served, drops counted, store clean"
    ]["ok"]
    results = {"pressure.off": stage(), "pressure.on": writer_stage()}
    results["pressure.on"]["rounds"][0]["tokens"] = [[1] * 31]
    assert not suite.judge(results)[
        "pressure.on: all requests served, drops counted, store clean"
    ]["ok"]


def test_stage_table_covers_every_claim():
    names = {s.name for s in suite.stages()}
    for model in ("llama", "lfm2", "nemotronh", "eagle"):
        assert {f"{model}.pristine", f"{model}.knob0", f"{model}.knob1"} <= names
    assert {"llama.mp", "llama.tp2", "lfm2.tp2", "pressure.turns.on"} <= names
    assert {"pressure.turns.off", "pressure.turns.ref", "ttft.llama8b.slow"} <= names
    assert all(s.gpus == 2 for s in suite.stages() if s.name.endswith("tp2"))


def test_diagnosis_stages_run_only_when_named_exactly():
    every = suite.stages()
    diagnosis = {s.name for s in every if s.diagnosis}
    prefixes = ("ttft.", "burst8b.", *(m + "." for m in suite_models.NEW_MODELS))
    real_size = {s.name for s in every if s.name.startswith(prefixes)}
    one_by_one = {"pressure.off", "pressure.on", "pressure.on2", "pressure.off2",
                  "pressure.off3", "pressure.on3"}  # fmt: skip
    assert diagnosis - real_size == {
        "pressure.capture",
        "pressure.hooks",
        "pressure.sampled",
        "pressure.off.sampled",
        *one_by_one,
    }
    assert real_size <= diagnosis
    by_default = {s.name for s in suite.selected(every, [], gpus=2)}
    assert not by_default & diagnosis
    turns = {"pressure.turns.off", "pressure.turns.on", "pressure.turns.ref"}
    assert turns | {"llama.tp2"} <= by_default
    by_prefix = {s.name for s in suite.selected(every, ["pressure"], gpus=1)}
    assert by_prefix == turns
    # The three engines of the interleaved judge boot together, in one wave.
    assert len({s.wave for s in every if s.name in turns}) == 1
    # The real-size stages (minutes each) run when their prefix is named, never by default.
    llama = {"ttft.llama8b.cold", "ttft.llama8b.write", "ttft.llama8b.disk",
             "ttft.llama8b.cache", "ttft.llama8b.slow"}  # fmt: skip
    wide = {"ttft.glm5wide.cold", "ttft.glm5wide.write", "ttft.glm5wide.disk",
            "ttft.glm5wide.cache", "ttft.glm5wide.stall"}  # fmt: skip
    assert {s.name for s in suite.selected(every, ["ttft.llama8b"], gpus=1)} == llama
    assert {s.name for s in suite.selected(every, ["ttft.glm5wide"], gpus=1)} == wide
    assert {s.name for s in suite.selected(every, ["ttft"], gpus=1)} == llama | wide
    assert {s.name for s in suite.selected(every, ["burst8b"], gpus=1)} == {
        "burst8b.off",
        "burst8b.on",
    }
    named = suite.selected(every, ["pressure.off", "pressure.hooks"], gpus=1)
    assert {s.name for s in named} == {"pressure.off", "pressure.hooks"}
    assert all(s.gpus == 1 for s in suite.selected(every, [], gpus=1))


# -- restore stages -------------------------------------------------------------------------

DIGESTS = [[["a0", "a1"]], [["b0", "b1", "b2", "b3"]]]  # per request, group, position


def seq_stage(cached0, cached1, **extra) -> dict:
    """A sequential restore-suite stage: two requests, two rounds."""
    rounds = []
    for cached in (cached0, cached1):
        rounds.append({"logprobs": [[STEP, STEP], [STEP]], "num_cached_tokens": list(cached),
                       "kv_digests": copy.deepcopy(DIGESTS), "tokens": [[1, 1], [1]]})  # fmt: skip
    return {"rc": 0, "rounds": rounds, **extra}


def restore_results() -> dict:
    """cold: request 1 hits 32 GPU tokens in round 0 and both hit in round 1;
    hit: both restored in round 0; bad: request 0's restore refused (recomputes)."""
    chunk = {
        "key": "k0",
        "group": 0,
        "path": "/s/c",
        "header_length": 64,
        "payload_length": 8,
    }
    hit_workers = [{"stats": {"keys_restored": 6, "jobs_failed": 0, "manifests_marked_bad": 0},
                    "promotions": [{"ok": True, "keys": [chunk]}], "failures": [],
                    "manifests_bad": []}]  # fmt: skip
    bad_workers = [{"stats": {"keys_restored": 4, "jobs_failed": 1, "manifests_marked_bad": 2},
                    "promotions": [{"ok": False, "keys": [chunk]},
                                   {"ok": True, "keys": [dict(chunk, key="k9")]}],
                    "failures": [{"reason": "payload_checksum_mismatch", "key": "k0"}],
                    "manifests_bad": ["m0.json", "m1.json"],
                    "writer_stats": {"keys_distrusted": 1, "keys_written": 1}}]  # fmt: skip
    return {
        "restore.llama.cold": seq_stage([0, 32], [32, 64]),
        "restore.llama.write": seq_stage([0, 32], [32, 64]),
        "restore.llama.hit": seq_stage(
            [32, 64],
            [32, 64],
            restore_workers=hit_workers,
            restore_scheduler={
                "keys_promoted": 6,
                "promotions_ok": 2,
                "promotions_failed": 0,
            },
        ),
        "restore.llama.bad": seq_stage(
            [0, 32],
            [32, 64],
            restore_workers=bad_workers,
            restore_scheduler={
                "keys_promoted": 0,
                "promotions_ok": 0,
                "promotions_failed": 1,
            },
        ),
        "restore.llama.healed": seq_stage(
            [32, 64],
            [32, 64],
            restore_workers=copy.deepcopy(hit_workers),
            restore_scheduler={
                "keys_promoted": 6,
                "promotions_ok": 2,
                "promotions_failed": 0,
            },
            kvstore_verify={"rc": 0, "out": "no problems"},
        ),
    }


CORRUPTED = {
    "restore.llama.bad": {"key": "k0", "group": 0, "path": "/s/c", "offset": 68}
}
HIT = "restore.llama.hit: restored after a restart, logprobs and KV bytes == cold"
BAD = "restore.llama.bad: corrupted chunk refused, recomputed, logprobs == cold"
WRITE = "restore.llama.write: logprobs == cold"
HEALED = (
    "restore.llama.healed: the refused chunk written anew and restored, "
    "logprobs and KV bytes == cold"
)


def test_restore_verdicts_pass_a_good_run():
    verdicts = suite.judge(restore_results(), CORRUPTED)
    for name in (WRITE, HIT, BAD, HEALED):
        assert verdicts[name]["ok"], (name, verdicts[name])
    # Each restored request is compared with the cold request of the same prefix hit.
    assert verdicts[HIT]["logprobs"]["cold_round_per_request"] == [[1, 1], [1, 1]]
    assert verdicts[BAD]["logprobs"]["cold_round_per_request"] == [[0, 0], [1, 1]]
    assert verdicts[HIT]["external_hit_tokens"] == 64
    assert verdicts[HIT]["kv"]["compared"] == 6


def _break(results: dict, stage: str, path: tuple, value) -> dict:
    results = copy.deepcopy(results)
    node = results[stage]
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    return results


@pytest.mark.parametrize(
    "stage,path,value",
    [
        # nothing restored: no key promoted, no worker restored a key, no external hit
        ("restore.llama.hit", ("restore_scheduler", "keys_promoted"), 0),
        ("restore.llama.hit", ("restore_workers", 0, "stats", "keys_restored"), 0),
        ("restore.llama.hit", ("rounds", 0, "num_cached_tokens"), [0, 32]),
        ("restore.llama.hit", ("restore_scheduler",), {}),
        # a logprob difference, a different top-20 token, a step missing
        (
            "restore.llama.hit",
            ("rounds", 0, "logprobs", 1, 0),
            [[5, -0.25], [9, -1.4999]],
        ),
        ("restore.llama.hit", ("rounds", 1, "logprobs", 0, 1), [[5, -0.25], [8, -1.5]]),
        ("restore.llama.hit", ("rounds", 0, "logprobs", 0), [STEP]),
        # a byte mismatch in a restored block; a request without digests
        ("restore.llama.hit", ("rounds", 0, "kv_digests", 1, 0, 2), "XX"),
        ("restore.llama.hit", ("rounds", 0, "kv_digests", 0), None),
        ("restore.llama.hit", ("rc",), 124),
    ],
)
def test_restore_hit_fails_on_each_defect(stage, path, value):
    verdict = suite.judge(_break(restore_results(), stage, path, value), CORRUPTED)[HIT]
    assert not verdict["ok"]


def test_restore_compares_only_the_groups_the_engine_offloads():
    """A group the hit engine does not offload (the kpool tail ring, a drafter left out:
    vLLM zeroes its restored blocks) may differ from cold; one it offloads may not, and
    an engine that printed no eligible groups has every group compared."""

    def hit_with(groups_line: str | None, group: int) -> dict:
        results = restore_results()
        hit = results["restore.llama.hit"]
        for rnd in hit["rounds"]:
            for request in rnd["kv_digests"]:
                request.append(["r0"])  # a second group
        hit["rounds"][0]["kv_digests"][1][group][0] = "zeroed"
        for rnd in results["restore.llama.cold"]["rounds"]:
            for request in rnd["kv_digests"]:
                request.append(["r0"])
        if groups_line is not None:
            hit["eligible_lines"] = [groups_line]
        return suite.judge(results, CORRUPTED)[HIT]

    line = (
        "INFO [kv_offload_scope.py:137] KV offloading eligible groups: [0] of 2 (...)"
    )
    outside = hit_with(line, 1)
    assert outside["ok"] and outside["kv"]["groups"] == [0]
    assert not hit_with(line, 0)["ok"]
    assert not hit_with(None, 1)["ok"]


def test_restore_with_no_digests_at_all_fails():
    results = restore_results()
    for rnd in results["restore.llama.hit"]["rounds"]:
        rnd["kv_digests"] = []
    assert not suite.judge(results, CORRUPTED)[HIT]["ok"]


def test_bad_manifests_read_again_after_the_writer_republished_them_pass():
    """The rank marked its manifests bad and told its writer to write the chunk anew;
    the writer published them again and a rescan read the new files before the report,
    so none is listed bad: still a pass. With no rewrite asked for, an empty list fails."""
    healed = _break(restore_results(), "restore.llama.bad",
                    ("restore_workers", 0, "manifests_bad"), [])  # fmt: skip
    assert suite.judge(healed, CORRUPTED)[BAD]["ok"]
    never = _break(healed, "restore.llama.bad",
                   ("restore_workers", 0, "writer_stats", "keys_distrusted"), 0)  # fmt: skip
    assert not suite.judge(never, CORRUPTED)[BAD]["ok"]


@pytest.mark.parametrize(
    "path,value",
    [
        # the corrupted chunk loaded (in a promotion that succeeded)
        (("restore_workers", 0, "promotions", 0, "ok"), True),
        # the corrupted chunk was not refused for its checksum / another key was
        (("restore_workers", 0, "failures"), []),
        (("restore_workers", 0, "failures", 0, "key"), "k1"),
        # no manifest marked bad
        (("restore_workers", 0, "stats", "manifests_marked_bad"), 0),
        # the scheduler saw no failed promotion
        (("restore_scheduler", "promotions_failed"), 0),
        # the request did not recompute (same hit as with the good chunk)
        (("rounds", 0, "num_cached_tokens"), [32, 64]),
        # a logprob difference after the fallback; a byte mismatch (the bad chunk's bytes)
        (("rounds", 0, "logprobs", 0, 0), [[5, -0.2], [9, -1.5]]),
        (("rounds", 0, "kv_digests", 0, 0, 0), "bad"),
        (("rc",), 1),
    ],
)
def test_restore_corruption_fails_on_each_defect(path, value):
    verdict = suite.judge(
        _break(restore_results(), "restore.llama.bad", path, value), CORRUPTED
    )
    assert not verdict[BAD]["ok"]


@pytest.mark.parametrize(
    "stage,path,value",
    [
        # engine 3's store did not write the refused key anew
        ("restore.llama.bad", ("restore_workers", 0, "writer_stats"), {}),
        (
            "restore.llama.bad",
            ("restore_workers", 0, "writer_stats", "keys_written"),
            0,
        ),
        # engine 4 did not restore the corrupted chunk, or restored nothing
        (
            "restore.llama.healed",
            ("restore_workers", 0, "promotions", 0, "keys", 0, "key"),
            "k5",
        ),
        ("restore.llama.healed", ("restore_scheduler", "promotions_failed"), 1),
        ("restore.llama.healed", ("rounds", 0, "num_cached_tokens"), [0, 32]),
        # the store does not verify afterwards; a byte or logprob differs from cold
        ("restore.llama.healed", ("kvstore_verify", "rc"), 1),
        ("restore.llama.healed", ("kvstore_verify",), None),
        ("restore.llama.healed", ("rounds", 0, "kv_digests", 1, 0, 2), "XX"),
        (
            "restore.llama.healed",
            ("rounds", 0, "logprobs", 0, 0),
            [[5, -0.2], [9, -1.5]],
        ),
    ],
)
def test_restore_healing_fails_on_each_defect(stage, path, value):
    verdict = suite.judge(_break(restore_results(), stage, path, value), CORRUPTED)
    assert not verdict[HEALED]["ok"]


def test_restore_corruption_not_done_fails():
    verdicts = suite.judge(
        restore_results(), {"restore.llama.bad": {"error": "nothing"}}
    )
    assert not verdicts[BAD]["ok"]
    assert not suite.judge(restore_results(), {})[BAD]["ok"]


def test_write_stage_logprob_difference_fails():
    results = _break(restore_results(), "restore.llama.write",
                     ("rounds", 0, "logprobs", 0, 0), [[5, -0.3], [9, -1.5]])  # fmt: skip
    assert not suite.judge(results, CORRUPTED)[WRITE]["ok"]


def test_corrupt_chunk_flips_one_payload_byte_of_a_restored_chunk(tmp_path):
    path = tmp_path / "chunk"
    path.write_bytes(bytes(range(64)) + b"\x10" * 8)
    restored = {"restore_workers": [{"promotions": [
        {"ok": False, "keys": [{"key": "kx", "group": 0, "path": "/nope",
                                "header_length": 64, "payload_length": 8}]},
        {"ok": True, "keys": [{"key": "k0", "group": 0, "path": str(path),
                               "header_length": 64, "payload_length": 8}]}]}]}  # fmt: skip
    done = suite_restore.corrupt_chunk(restored)
    assert done["key"] == "k0" and done["offset"] == 68
    data = path.read_bytes()
    assert data[:68] == bytes(range(64)) + b"\x10" * 4 and data[68] == 0xEF
    assert data[69:] == b"\x10" * 3
    assert "error" in suite_restore.corrupt_chunk(
        {"restore_workers": [{"promotions": []}]}
    )


def test_restore_stages_share_one_store_and_run_in_order():
    by_name = {s.name: s for s in suite.stages()}
    for model in ("llama", "lfm2"):
        cold, write, hit, bad, healed = (by_name[f"restore.{model}.{x}"]
                                         for x in ("cold", "write", "hit", "bad", "healed"))  # fmt: skip
        assert cold.tree == "pristine" and cold.knob is None
        assert write.store == hit.store == bad.store == f"restore.{model}"
        assert write.env["GLM53_KV_OFFLOAD_RESTORE"] == "0"
        assert (
            hit.env["GLM53_KV_OFFLOAD_RESTORE"]
            == bad.env["GLM53_KV_OFFLOAD_RESTORE"]
            == "1"
        )
        assert cold.wave == write.wave < hit.wave < bad.wave < healed.wave
        assert bad.corrupt == hit.name and not bad.probe
        assert (
            healed.store == bad.store and healed.probe
        )  # kvstore verify runs after it
        assert healed.env["GLM53_KV_OFFLOAD_RESTORE"] == "1"
        assert all("--sequential" in s.args for s in (cold, write, hit, bad, healed))


# -- throughput pairs, real-size stages -------------------------------------------------------


def rate_stage(tokens_per_s: float, engine_cpu: float, **extra) -> dict:
    res = stage(**extra)
    res["rounds"][0]["tokens_per_s"] = tokens_per_s
    res["rounds"][0]["thread_cpu"] = {"(caller)": engine_cpu}
    return res


def test_throughput_is_the_median_of_three_pairs():
    results = {
        "pressure.off": rate_stage(100.0, 2.0),
        "pressure.on": rate_stage(50.0, 3.0, workers=[]),
        "pressure.off2": rate_stage(100.0, 2.0),
        "pressure.on2": rate_stage(96.0, 2.1, workers=[]),
        "pressure.off3": rate_stage(100.0, 2.0),
        "pressure.on3": rate_stage(98.0, 2.0, workers=[]),
    }
    v = suite_pressure.throughput_judge(results)[
        "throughput tier on / off (round 0, tokens/s; median of the pairs)"
    ]
    assert v["ratios"] == [0.5, 0.96, 0.98]
    assert v["ratio"] == 0.96  # one bad pair does not decide
    assert v["engine_thread_cpu_ratios"] == [1.5, 1.05, 1.0]
    assert v["engine_thread_cpu_ratio"] == 1.05


def turn_rounds(rates: list[float], cpu: float = 2.0, others: float = 0.0) -> dict:
    res = stage()
    res["rounds"] = [
        {
            "tokens_per_s": r,
            "seconds": 300.0 / r,  # every round serves the same 300 tokens
            "thread_cpu": {"(caller)": cpu, "python": cpu + others},
            "tokens": [[1] * 32],
            # Every round's model time grows with its length; the tier-on engine's
            # rounds also time our hooks.
            "in_ms": {"executor.execute_model": 3e5 / r}
            | ({"store.remember": 2.0 + i} if others else {}),
        }
        for i, r in enumerate(rates)
    ]
    return res


def test_interleaved_turns_judge_prints_median_spread_worst_and_the_machines_own():
    off = [100.0] * 8
    on = [97.0, 96.0, 99.0, 80.0, 98.0, 95.0, 100.0, 97.0]
    ref = [101.0, 99.0, 100.0, 98.0, 102.0, 100.0, 97.0, 100.0]
    results = {
        "pressure.turns.off": turn_rounds(off),
        "pressure.turns.on": turn_rounds(on, cpu=3.0, others=1.25),
        "pressure.turns.ref": turn_rounds(ref),
    }
    results["pressure.turns.on"]["workers"] = [{"stats": {"keys_dropped_budget": 5}}]
    v = suite_pressure.turns_judge(results)[
        "throughput tier on / off, interleaved turns (tokens/s; benchmark)"
    ]
    assert v["pairs"] == 8 and v["ratios"][3] == 0.8
    assert v["median"] == 0.97 and v["worst"] == 0.8 and v["best"] == 1.0
    assert v["spread"] == 0.2 and v["worst_pair"]["round"] == 3
    assert v["ref"]["median"] == 1.0 and v["ref"]["worst"] == 0.97
    # Round 3 against both tier-off engines: 80 / mean(100, 98).
    assert v["ratios_vs_both_off"][3] == 0.808 and v["vs_both_off"]["worst"] == 0.808
    assert v["engine_thread_cpu_ratios"] == [1.5] * 8
    assert v["on_other_threads_cpu_s"] == [1.25] * 8 and v["ref_is"] == "tier off"
    # The whole run: 2,400 tokens in 8 x 3 s off, in 300 x sum(1 / rate) s on.
    assert v["total_on_vs_off"] == round(8 / sum(100.0 / r for r in on), 3) == 0.948
    assert v["total_ref_vs_off"] == 0.996
    assert v["keys"] == {
        "on": {
            "keys_captured": 0,
            "keys_recaptured": 0,
            "keys_written": 0,
            "keys_dropped_budget": 5,
        }
    }
    # Where the rounds went: medians of the rounds, by engine (3e5 / rate ms).
    assert v["in_ms"]["off"] == {"executor.execute_model": 3000.0}
    assert v["in_ms"]["on"] == {
        "executor.execute_model": 3092.8,  # 3e5 / 97, the median round
        "store.remember": 5.5,
    }
    results["pressure.turns.ref"]["ablate"] = [{"ablated": "capture"}]
    v = suite_pressure.turns_judge(results)[
        "throughput tier on / off, interleaved turns (tokens/s; benchmark)"
    ]
    assert v["keys"]["ref"] is None  # no counts saved: unknown, not zero
    results["pressure.turns.ref"]["ablate_stats"] = [{"keys_captured": 7}]
    v = suite_pressure.turns_judge(results)[
        "throughput tier on / off, interleaved turns (tokens/s; benchmark)"
    ]
    assert v["ref_is"] == [{"ablated": "capture"}]
    # A tier-on ref is no second tier-off engine; its keys are printed beside on's.
    assert v["ratios_vs_both_off"] is None and v["vs_both_off"] is None
    assert v["keys"]["ref"]["keys_captured"] == 7
    assert not v["goal_met"] and v["ok"]  # a benchmark: the worst pair misses 0.85
    results["pressure.turns.on"]["rounds"][3]["tokens_per_s"] = 90.0
    v = suite_pressure.turns_judge(results)[
        "throughput tier on / off, interleaved turns (tokens/s; benchmark)"
    ]
    assert v["goal_met"]
    results["pressure.turns.ref"]["rc"] = 1
    assert not suite_pressure.turns_judge(results)[
        "throughput tier on / off, interleaved turns (tokens/s; benchmark)"
    ]["ok"]
    # The tier-on engine is the pressure run: every round's every request in full.
    verdict = "pressure.turns.on: all requests served, drops counted, store clean"
    results["pressure.turns.on"]["kvstore_verify"] = {"rc": 0}
    assert suite.judge(results)[verdict]["ok"]
    results["pressure.turns.on"]["rounds"][5]["tokens"] = [[1] * 31]
    assert not suite.judge(results)[verdict]["ok"]


def test_turns_ref_ablate_makes_ref_a_tier_on_engine_with_its_writer_ablated(
    monkeypatch,
):
    def ref() -> object:
        (got,) = [s for s in suite_pressure.pressure_stages() if s.name.endswith("ref")]
        return got

    assert ref().knob == "0" and "--ablate" not in ref().args
    monkeypatch.setenv("TURNS_REF_ABLATE", "capture")
    got = ref()
    assert got.knob == "1"
    i = got.args.index("--ablate")
    assert got.args[i + 1] == "capture" and "--probe" not in got.args
    monkeypatch.setenv("TURNS_REF_ABLATE", "writer")
    with pytest.raises(ValueError, match="TURNS_REF_ABLATE"):
        ref()


def slow_results() -> dict:
    results = ttft_results()
    sched = {"restores_declined": 2, "last_estimate": {"restore": False}}
    slow = ttft_stage([4.2, 61.0], [suite_realsize.LEARN_PREFIX, 0], DIGESTS,
                      restore_scheduler=sched, restore_workers=[])  # fmt: skip
    results["ttft.llama8b.slow"] = slow
    return results


@pytest.mark.parametrize("breakage", [None, "not_declined", "restored", "slow", "rc"])
def test_slow_store_must_be_declined_and_serve_near_cold(breakage):
    results = slow_results()
    slow = results["ttft.llama8b.slow"]
    if breakage == "not_declined":
        slow["restore_scheduler"]["restores_declined"] = 1
    elif breakage == "restored":  # the second prompt came from the store after all
        slow["rounds"][0]["num_cached_tokens"][1] = 126960
    elif breakage == "slow":  # 4.0 s cold, 4.5 s: over 1.1x
        slow["rounds"][0]["request_seconds"][0] = 4.5
    elif breakage == "rc":
        slow["rc"] = 1
    v = suite_realsize.slow_store_judge(results)[
        "ttft.llama8b.slow: a slow store declined, time to first token near cold"
    ]
    assert v["ok"] == (breakage is None)
    assert v["rows"][0]["vs_cold"] == (1.125 if breakage == "slow" else 1.05)


def ttft_stage(seconds, cached, digests, **extra) -> dict:
    rounds = [{"request_seconds": list(seconds), "num_cached_tokens": list(cached),
               "kv_digests": copy.deepcopy(digests), "logprobs": [[STEP], [STEP]],
               "tokens": [[1], [1]]}]  # fmt: skip
    return {"rc": 0, "rounds": rounds, **extra}


def ttft_results() -> dict:
    restored = [{"stats": {"keys_restored": 10, "read_seconds": 2.0,
                           "bytes_restored": 4_000_000_000}}]  # fmt: skip
    plain = {"plain_read": {"best_gb_per_s": 2.5}}
    return {
        "ttft.llama8b.cold": ttft_stage([4.0, 60.0], [0, 0], DIGESTS),
        "ttft.llama8b.write": ttft_stage([4.1, 61.0], [0, 0], DIGESTS),
        "ttft.llama8b.disk": ttft_stage(
            [2.0, 12.0],
            [32752, 126960],
            DIGESTS,
            restore_workers=restored,
            before=plain,
        ),
        "ttft.llama8b.cache": ttft_stage(
            [0.5, 2.0], [32752, 126960], DIGESTS, restore_workers=restored, before=plain
        ),
    }


def test_ttft_rows_and_read_phase_against_the_plain_read():
    verdicts = suite_realsize.ttft_judge(ttft_results())
    assert verdicts["ttft.llama8b: each prompt restored up to its last chunk"]["ok"]
    rows = verdicts[
        "ttft.llama8b: time to first token (s), cold vs restore (benchmark)"
    ]["rows"]
    assert [r["tokens"] for r in rows] == list(suite_realsize.TTFT_TOKENS)
    assert rows[0]["disk_speedup"] == 2.0 and rows[1]["cache_speedup"] == 30.0
    disk = verdicts["ttft.llama8b.disk: restored, logprobs and KV bytes == cold"]
    assert disk["ok"]
    assert disk["read_phase_gb_per_s"] == 2.0 and disk["read_vs_plain"] == 0.8
    assert disk["estimate"] is None  # the guard weighed nothing


def test_a_set_split_over_two_calls_that_keep_the_stores_is_judged_whole(
    tmp_path, monkeypatch
):
    """Call 1 runs cold and write, call 2 (KVTIER_KEEP_STORES=1) disk and cache: call 2's
    verdicts read call 1's stages; without the kept stores they are not there."""
    results = ttft_results()
    results["ttft.llama8b.write"]["kvstore_verify"] = {"rc": 0}
    monkeypatch.setattr(suite, "prepare", lambda st, opts: results[st.name]["before"])
    monkeypatch.setattr(
        suite, "run_wave", lambda batch, *a: {s.name: results[s.name] for s in batch}
    )

    def call(only: str, keep: bool) -> dict:
        out = tmp_path / f"out-{only.count(',')}-{keep}"
        monkeypatch.setenv(suite.ENV_KEEP, "1" if keep else "0")
        argv = ["suite.py", "--pristine", "p", "--patched", "q", "--site", "s",
                "--kvstore", "k", "--out", str(out), "--stores", str(tmp_path / "kv"),
                "--only", only]  # fmt: skip
        monkeypatch.setattr(sys, "argv", argv)
        rc = suite.main()
        with open(out / "results.json") as f:
            return {"rc": rc, **json.load(f)}

    first = call("ttft.llama8b.cold,ttft.llama8b.write", keep=False)
    assert set(first["results"]) == {"ttft.llama8b.cold", "ttft.llama8b.write"}
    second = call("ttft.llama8b.disk,ttft.llama8b.cache", keep=True)
    assert second["results"]["ttft.llama8b.cold"]["earlier_call"] is True
    assert "earlier_call" not in second["results"]["ttft.llama8b.disk"]
    name = "ttft.llama8b: time to first token (s), cold vs restore (benchmark)"
    rows = second["verdicts"][name]["rows"]
    assert rows[0]["disk_speedup"] == 2.0 and rows[1]["cache_speedup"] == 30.0
    assert second["rc"] == 0
    # The stores not kept: the earlier call's stages are not judged (cold is missing).
    third = call("ttft.llama8b.disk,ttft.llama8b.cache", keep=False)
    assert "ttft.llama8b.cold" not in third["results"] and third["rc"] == 1


def test_ttft_table_is_unsound_when_the_two_computing_engines_disagree():
    name = "ttft.llama8b: time to first token (s), cold vs restore (benchmark)"
    results = ttft_results()
    v = suite_realsize.ttft_judge(results)[name]
    assert v["ok"] and [r["cold_vs_write_engine"] for r in v["rows"]] == [0.98, 0.98]
    # Run 50: the pristine engine compiled kernels in its timed request.
    results["ttft.llama8b.cold"]["rounds"][0]["request_seconds"][1] = 21.2 * 61.0 / 1.59
    v = suite_realsize.ttft_judge(results)[name]
    assert not v["ok"] and v["rows"][1]["cold_vs_write_engine"] == 13.33


def test_glm5wide_warms_up_at_the_timed_length():
    by_name = {s.name: s for s in suite_realsize.real_size_stages()}
    for name, warm in (("ttft.glm5wide.cold", max(suite_realsize.TTFT_TOKENS)),
                       ("ttft.glm5wide.stall", max(suite_realsize.TTFT_TOKENS)),
                       ("ttft.llama8b.cold", suite_realsize.WARMUP_PREFILL)):  # fmt: skip
        args = by_name[name].args
        assert args.count("--warmup-prefill") == 1
        assert int(args[args.index("--warmup-prefill") + 1]) == warm, name


def test_ttft_times_the_timed_requests_reads_apart_from_the_warm_up():
    results = ttft_results()
    # Two jobs before the timed rounds (the warm-up's, one of them slow), two in them.
    jobs = [(4, 8_000_000, 1.5), (4, 8_000_000, 0.001), (100, 2_000_000_000, 0.2),
            (100, 2_000_000_000, 0.2)]  # fmt: skip
    cache = results["ttft.llama8b.cache"]
    cache["restore_workers"] = [{"stats": {"keys_restored": 208, "jobs_ok": 4,
                                           "read_seconds": 1.901, "job_reads": jobs,
                                           "bytes_restored": 4_016_000_000}}]  # fmt: skip
    cache["restore_before"] = [{"jobs_ok": 2, "job_reads": jobs[:2]}]
    v = suite_realsize.ttft_judge(results)[
        "ttft.llama8b.cache: restored, logprobs and KV bytes == cold"
    ]
    assert v["timed_read"]["jobs"] == jobs[2:]
    assert v["timed_read"]["gb_per_s"] == 10.0 and v["timed_read_vs_plain"] == 4.0
    assert v["read_phase_gb_per_s"] == round(4.016 / 1.901, 3)  # the sum, warm-up in


def test_ttft_puts_the_guards_estimate_beside_the_cold_prefill():
    results = ttft_results()
    estimate = {"tokens": 126975, "recompute_s": 10569.6, "read_s": 3.1,
                "restore": True, "prefill_steps": 1, "prefill_trimmed": 0,
                "prefill_fit": [0.029, 0.0], "prefill_points": [[4800, 600, 0.029]]}  # fmt: skip
    results["ttft.llama8b.disk"]["restore_scheduler"] = {"last_estimate": estimate}
    verdicts = suite_realsize.ttft_judge(results)
    row = verdicts["ttft.llama8b.disk: restored, logprobs and KV bytes == cold"][
        "estimate"
    ]
    # The longest prompt's cold TTFT (60 s) against its predicted recompute.
    assert row["cold_s"] == 60.0 and row["recompute_vs_cold"] == 176.16
    assert row["prefill_steps"] == 1 and row["prefill_fit"] == [0.029, 0.0]
    assert "prefill_points" not in row  # results.json has them; the summary does not


@pytest.mark.parametrize(
    "breakage",
    ["kv", "nothing_restored", "rc"],
)
def test_ttft_restore_verdict_fails_on_each_defect(breakage):
    results = ttft_results()
    disk = results["ttft.llama8b.disk"]
    if breakage == "kv":
        disk["rounds"][0]["kv_digests"][1][0][2] = "other"
    elif breakage == "nothing_restored":
        disk["restore_workers"] = [{"stats": {"keys_restored": 0}}]
    else:
        disk["rc"] = 1
    verdicts = suite_realsize.ttft_judge(results)
    assert not verdicts["ttft.llama8b.disk: restored, logprobs and KV bytes == cold"][
        "ok"
    ]
    assert verdicts["ttft.llama8b.cache: restored, logprobs and KV bytes == cold"]["ok"]


def test_ttft_restore_must_equal_the_writer_engines_blocks():
    # The store holds the writer engine's bytes: a restore that equals the cold engine
    # but not the blocks it was written from is a failure too (and the other way round).
    results = ttft_results()
    results["ttft.llama8b.write"]["rounds"][0]["kv_digests"][0][0][1] = "other"
    verdicts = suite_realsize.ttft_judge(results)
    for kind in ("disk", "cache"):
        v = verdicts[f"ttft.llama8b.{kind}: restored, logprobs and KV bytes == cold"]
        assert v["kv"]["ok"] and not v["kv_vs_write"]["ok"] and not v["ok"]
    written = verdicts["ttft.llama8b.write: store written, kvstore verify clean"]
    assert written["kv_vs_cold"]["different"] == 1


def test_burst_writer_rate_is_judged_against_the_disk():
    on = rate_stage(95.0, 2.0)
    on["workers"] = [{"stats": {"bytes_written": 8_000_000_000, "write_seconds": 10.0}}]
    on["before"] = {"disk_write": {"gb_per_s": 1.0}}
    v = suite_realsize.burst_judge(
        {"burst8b.off": rate_stage(100.0, 2.0), "burst8b.on": on}
    )["burst8b: tier on / off, writer vs disk (benchmark)"]
    assert v["ratio"] == 0.95 and v["writer_gb_per_s"] == 0.8
    assert v["writer_vs_disk"] == 0.8 and v["ok"]


def test_disk_speeds_read_every_byte_and_write_what_they_say(tmp_path):
    import diskspeed

    store = tmp_path / "store"
    (store / "a").mkdir(parents=True)
    sizes = {"a/x.bin": 3 << 20, "y.bin": 12345, "a/z.bin": 0}
    for name, size in sizes.items():
        (store / name).write_bytes(os.urandom(size))
    (store / "link").symlink_to(store / "y.bin")
    files = diskspeed.store_files(str(store))
    assert len(files) == 3 and files[0].endswith("x.bin")  # largest first, no links
    for from_disk in (True, False):
        speeds = diskspeed.read_speeds(str(store), from_disk=from_disk, threads=(1, 3))
        assert [p["bytes"] for p in speeds["passes"]] == [sum(sizes.values())] * 2
    w = diskspeed.write_speed(str(tmp_path / "w"), size=4 << 20, block=1 << 20)
    assert w["bytes"] == 4 << 20 and not os.listdir(tmp_path / "w")


def test_ttft_a_tail_left_out_of_the_store_fails():
    results = ttft_results()
    results["ttft.llama8b.cache"]["rounds"][0]["num_cached_tokens"][1] = 126976 - 8192
    verdicts = suite_realsize.ttft_judge(results)
    assert not verdicts["ttft.llama8b: each prompt restored up to its last chunk"]["ok"]


def test_ttft_write_stage_needs_a_clean_verify():
    results = ttft_results()
    results["ttft.llama8b.write"]["kvstore_verify"] = {"rc": 0}
    key = "ttft.llama8b.write: store written, kvstore verify clean"
    assert suite_realsize.ttft_judge(results)[key]["ok"]
    results["ttft.llama8b.write"]["kvstore_verify"] = {"rc": 1}
    assert not suite_realsize.ttft_judge(results)[key]["ok"]


# -- knob-1 stages boot with launch.sh plan's connector JSON ------------------------------

REPO = REPO_ROOT
RESTORE_TIER = {
    "type": "LocalStoreTier",
    "module_path": "vllm.distributed.kv_transfer.kv_connector.v1.offloading.kv_restore_tier",
}

# Stands in for engine/stage.py: records what it was started with, as the real one does
# (connector_json: the text it read; kv_transfer_config: the engine's view after boot).
FAKE_STAGE = """import json, os, sys
args = sys.argv[1:]
out = args[args.index("--out") + 1]
res = {"argv": args, "env": {k: v for k, v in os.environ.items() if k.startswith("GLM53")}}
if "--connector-json" in args:
    with open(args[args.index("--connector-json") + 1]) as f:
        res["connector_json"] = f.read()
    cfg = json.loads(res["connector_json"])
    if os.environ.get("FAKE_ENGINE_DROPS"):
        cfg["kv_connector_extra_config"]["secondary_tiers"] = []
    res["kv_transfer_config"] = cfg
with open(out, "w") as f:
    json.dump(res, f)
"""


def fake_wave(tmp_path, monkeypatch, names, launcher=REPO, key_file=""):
    here = tmp_path / "engine"
    here.mkdir()
    (here / "stage.py").write_text(FAKE_STAGE)
    monkeypatch.setattr(suite, "HERE", str(here))
    opts = argparse.Namespace(pristine="/p", patched="/q", site="/s", kvstore="/bin/true",
                              stores=str(tmp_path / "stores"), launcher=str(launcher),
                              key_file=key_file)  # fmt: skip
    logs = tmp_path / "logs"
    logs.mkdir()
    by_name = {s.name: s for s in suite.stages()}
    batch = [dataclasses.replace(by_name[n], verify=False) for n in names]
    return suite.run_wave(batch, opts, str(logs))


def planned_json(env: dict, tmp_path, model: str) -> str:
    """What docker/launch.sh plan itself writes for these knobs (the operator's command)."""
    tmp_path.mkdir()
    out = tmp_path / "operator-plan"
    run = subprocess.run(
        [str(REPO / "docker/launch.sh"), "plan", "--ranks", "0", "--out", str(out),
         "--", "vllm", "serve", model],
        env={"PATH": os.environ["PATH"], **env}, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert run.returncode == 0
    argv = (out / "rank0" / "argv").read_text().splitlines()
    return argv[argv.index("--kv-transfer-config") + 1]


def test_knob1_and_restore_stages_boot_with_launch_sh_plans_json(tmp_path, monkeypatch):
    names = ["restore.llama.write", "restore.llama.hit", "llama.knob1", "llama.knob0"]
    results = fake_wave(tmp_path, monkeypatch, names)
    for name in names[:3]:
        res = results[name]
        assert res["rc"] == 0, res
        argv = res["argv"]
        assert "--connector" not in argv and "--cpu-bytes" not in argv
        knobs = res["env"]
        # Byte for byte the JSON an operator's `launch.sh plan` gives for the same knobs.
        assert res["connector_json"] == planned_json(knobs, tmp_path / name, argv[1])
        extra = json.loads(res["connector_json"])["kv_connector_extra_config"]
        restore = name == "restore.llama.hit"
        assert knobs.get("GLM53_KV_OFFLOAD_RESTORE", "0") == ("1" if restore else "0")
        assert extra["secondary_tiers"] == ([RESTORE_TIER] if restore else [])
        assert extra["cpu_bytes_to_use"] == suite.CPU_GB << 30
        assert knobs["GLM53_KV_OFFLOAD_BUILD_ID"] == "kvtier-engine-suite"
    # The stock stage keeps vLLM's own connector, built by stage.py.
    assert "--connector" in results["llama.knob0"]["argv"]
    assert "launch_plan" not in results["llama.knob0"]
    verdicts = suite.judge(results)
    for name in names[:3]:
        assert verdicts[f"{name}: booted with launch.sh plan's connector JSON"]["ok"]
    assert not any(k.startswith("llama.knob0: booted") for k in verdicts)


def test_launcher_verdict_fails_when_the_engine_holds_another_config(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("FAKE_ENGINE_DROPS", "1")
    results = fake_wave(tmp_path, monkeypatch, ["restore.llama.hit"])
    verdict = suite.check_launcher(results["restore.llama.hit"])
    assert verdict["passed_verbatim"] and not verdict["engine_holds_it"]
    assert not verdict["ok"]
    res = dict(results["restore.llama.hit"], connector_json="{}")
    assert not suite.check_launcher(res)["passed_verbatim"]


def test_a_refused_plan_is_a_failed_stage(tmp_path, monkeypatch):
    """A launcher whose ORDER does not bake kv-offload-restore refuses RESTORE=1: the stage
    never boots (no JSON of its own to fall back on) and its verdict fails."""
    launcher = tmp_path / "launcher"
    for part in ("docker", "anchors", "overlays/kv-offload-scope"):
        shutil.copytree(REPO / part, launcher / part)
    (launcher / f"anchors/{suite.ENGINE}/ORDER").write_text(
        "kv-offload-scope\nkv-offload-store-local\n"
    )
    results = fake_wave(tmp_path, monkeypatch, ["restore.llama.hit"], launcher)
    res = results["restore.llama.hit"]
    assert res["rc"] is None and "not baked" in res["launch_plan"]["stderr"]
    assert not (tmp_path / "logs" / "restore.llama.hit.json").exists()
    verdict = suite.judge(results)[
        "restore.llama.hit: booted with launch.sh plan's connector JSON"
    ]
    assert not verdict["ok"]


def test_prepare_packs_the_launcher_and_device_b_passes_it():
    prepare = (REPO / "engine/prepare.sh").read_text()
    assert re.search(
        r"git archive \"\$rev\" docker anchors overlays/kv-offload-scope", prepare
    )
    assert '--launcher "$B/launcher"' in (REPO / "engine/device-b.sh").read_text()


def test_stage_refuses_to_build_a_knob1_connector(monkeypatch, tmp_path):
    import stage

    monkeypatch.setenv("GLM53_KV_OFFLOAD", "1")
    args = argparse.Namespace(model="m", max_num_seqs=1, kv_cache_gb=1, tp=1, hybrid=False,
                              eagle="", connector=True, connector_json="", cpu_bytes=1,
                              max_model_len=4096)  # fmt: skip
    with pytest.raises(SystemExit, match="launch.sh plan"):
        stage.engine_kwargs(args)
    text = '{"kv_connector": "X", "kv_connector_extra_config": {"a": [1]}}'
    (tmp_path / "c.json").write_text(text)
    args.connector_json = str(tmp_path / "c.json")
    assert stage.engine_kwargs(args)["kv_transfer_config"] == json.loads(text)


def test_an_ablation_that_found_no_writer_fails_the_stage():
    import stage

    assert stage.took_ablation([{"ablated": "capture"}], "capture")
    assert not stage.took_ablation([{"ablated": None}], "capture")  # no writer
    assert not stage.took_ablation([{"ablated": "hooks"}], "capture")
    assert not stage.took_ablation([], "capture")


def test_model_stages_run_by_prefix_and_stop_on_a_failed_import_probe():
    every = suite.stages()
    assert not {s.name for s in suite.selected(every, [], gpus=2)} & {
        s.name for s in every if s.name.startswith("glm5next.")
    }
    mine = suite.selected(every, ["glm5next"], gpus=1)
    assert mine[0].name == "glm5next.ops" and mine[0].wave < min(
        s.wave for s in mine[1:]
    )
    assert all(s.needs == "glm5next.ops" and s.models_site for s in mine[1:])
    knob1 = next(s for s in mine if s.name == "glm5next.knob1")
    # Sparse MLA (the kpool indexer): TRITON_MLA refuses it (tests/realsched/test_model_layouts.py).
    assert "FLASHMLA_SPARSE" in knob1.args and "--hybrid" in knob1.args
    failed = {
        "glm5next.ops": {
            "rc": 1,
            "failed": ["vllm.third_party.deep_gemm: RuntimeError: no nvcc"],
        }
    }
    why = suite_models.ops_failed(failed, knob1)
    assert why and "vllm.third_party.deep_gemm" in why
    assert suite_models.ops_failed({"glm5next.ops": {"rc": 0}}, knob1) is None
    assert (
        suite_models.ops_failed({}, knob1) is None
    )  # ONLY named the stage without its probe
    # A skipped stage and the failed probe are failed verdicts that name the import.
    results = failed | {"glm5next.knob1": {"rc": None, "skipped": why, "errors": [why]}}
    v = suite.judge(results)
    assert not v["glm5next.ops: imports and kernels load"]["ok"]
    assert "deep_gemm" in str(v["glm5next.knob1: started"]["failed"])
    assert "glm5next.restore" in suite_restore.RESTORE_SETS


def test_ops_probe_names_a_failed_import_and_skips_optional_ones(tmp_path, monkeypatch):
    import importlib
    import sys as _sys

    _sys.path.insert(0, str(REPO / "engine"))
    opsprobe = importlib.import_module("opsprobe")
    monkeypatch.setitem(
        opsprobe.NEEDS, "dsv2lite", ["json", "no_such_mod_31", "?no_such_opt_31"]
    )
    out = tmp_path / "ops.json"
    monkeypatch.setattr(
        _sys, "argv", ["opsprobe", "--model", "dsv2lite", "--out", str(out)]
    )
    rc = opsprobe.main()
    res = json.loads(out.read_text())
    assert rc == 1
    assert [f["ok"] for f in res["imports"]] == [True, False, False]
    assert len(res["failed"]) == 1 and res["failed"][0].startswith(
        "no_such_mod_31: ModuleNotFoundError"
    )


# -- KVTIER_SUITE_KEY=1: the restore sets on a keyed store (issue 38) ----------------------


def test_suite_key_makes_a_private_key_beside_the_stores(tmp_path):
    stores = tmp_path / "stores"
    assert suite.suite_key_file(str(stores), {}) == ""  # off unless asked
    path = Path(suite.suite_key_file(str(stores), {"KVTIER_SUITE_KEY": "1"}))
    assert path.parent == tmp_path and not path.is_relative_to(stores)
    assert path.stat().st_mode & 0o777 == 0o600 and path.stat().st_size == 32


def test_suite_key_goes_to_every_restore_set_stage_and_nothing_else(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("KVTIER_SUITE_KEY", "1")
    key = suite.suite_key_file(str(tmp_path / "stores"))
    by_name = {s.name: s for s in suite.stages()}
    for name in ("restore.llama.write", "restore.llama.hit", "restore.llama.bad",
                 "restore.llama.healed", "glm5next.restore.hit"):  # fmt: skip
        assert suite.keyed(by_name[name], key), name
    for name in ("restore.llama.cold", "llama.knob1", "llama.knob0"):
        assert not suite.keyed(by_name[name], key), name
    assert not suite.keyed(by_name["restore.llama.hit"], "")
    names = ["restore.llama.write", "restore.llama.hit", "llama.knob1"]
    results = fake_wave(tmp_path, monkeypatch, names, key_file=key)
    for name in names:
        want = None if name == "llama.knob1" else key
        assert results[name]["env"].get("GLM53_KV_OFFLOAD_KEY_FILE") == want, name


def test_a_keyed_run_expects_the_flipped_chunk_refused_by_its_mac(monkeypatch):
    keyed = copy.deepcopy(restore_results())
    keyed["restore.llama.bad"]["restore_workers"][0]["failures"][0]["reason"] = (
        "mac_mismatch"
    )
    assert not suite.judge(keyed, CORRUPTED)[BAD]["ok"]  # a plain run wants the CRC's
    monkeypatch.setenv("KVTIER_SUITE_KEY", "1")
    assert suite.judge(keyed, CORRUPTED)[BAD]["ok"]
    assert not suite.judge(restore_results(), CORRUPTED)[BAD]["ok"]


def test_the_glm5wide_set_boots_glm_backends_and_the_cold_engine_runs_no_tier():
    every = {s.name: s for s in suite.stages()}
    cold, cache = every["ttft.glm5wide.cold"], every["ttft.glm5wide.cache"]
    for st in (cold, cache):
        assert st.model.endswith("engine/models/glm5wide") and st.models_site
        glm = st.args.index(suite_models.GLM5[0])
        assert st.args[glm : glm + len(suite_models.GLM5)] == suite_models.GLM5
        assert st.args[st.args.index("--kv-cache-gb") + 1] == "8"
    assert "--connector" not in cold.args and "--cpu-bytes" not in cold.args
    assert cold.tree == "pristine" and cold.knob is None
    assert "--connector" in cache.args and cache.before == "warm"
    assert (
        cache.store == "ttft.glm5wide" and cache.env["GLM53_KV_OFFLOAD_RESTORE"] == "1"
    )
    # The llama set's stages are what they were: the cold engine has no connector.
    assert "--connector" not in every["ttft.llama8b.cold"].args
    assert every["ttft.llama8b.cold"].args[:5] == [
        "--max-model-len", "131072", "--kv-cache-gb", "40", "--warmup"
    ]  # fmt: skip


def test_a_glm5wide_restore_covers_its_4608_token_chunks_not_16():
    results = {
        n.replace("ttft.llama8b", "ttft.glm5wide"): r for n, r in ttft_results().items()
    }
    chunk = suite_realsize.TTFT_SETS["ttft.glm5wide"]
    tokens = suite_realsize.TTFT_TOKENS
    full = [(t - 1) // chunk * chunk for t in tokens]  # 32,256 and 124,416
    for kind in ("disk", "cache"):
        results[f"ttft.glm5wide.{kind}"]["rounds"][0]["num_cached_tokens"] = full
    verdicts = suite_realsize.ttft_judge(results)
    covered = "ttft.glm5wide: each prompt restored up to its last chunk"
    assert verdicts[covered]["ok"]
    assert not any(k.startswith("ttft.llama8b") for k in verdicts)
    # One chunk short of that is a failed restore.
    results["ttft.glm5wide.cache"]["rounds"][0]["num_cached_tokens"] = [
        full[0] - chunk,
        full[1],
    ]
    assert not suite_realsize.ttft_judge(results)[covered]["ok"]


def test_glm5_with_its_mtp_drafter_is_a_stage_set_on_glm5nexts_folder_and_probe():
    every = {s.name: s for s in suite.stages()}
    mtp = {n: s for n, s in every.items() if n.startswith("glm5mtp.")}
    assert set(mtp) == {
        "glm5mtp.pristine", "glm5mtp.knob0", "glm5mtp.knob1", "glm5mtp.restore.cold",
        "glm5mtp.restore.write", "glm5mtp.restore.hit", "glm5mtp.restore.bad",
        "glm5mtp.restore.healed",
    }  # fmt: skip
    for st in mtp.values():
        assert st.model == every["glm5next.pristine"].model and "--mtp" in st.args
        assert st.needs == "glm5next.ops" and st.diagnosis and st.models_site
    assert "--mtp" not in every["glm5next.knob1"].args


def test_the_mtp_folder_wraps_the_text_config_at_one_path_for_every_stage(tmp_path):
    import stage

    model = tmp_path / f"glm5-test-{os.getpid()}"
    model.mkdir()
    text = {"architectures": ["Glm5NextForCausalLM"], "num_nextn_predict_layers": 1}
    (model / "config.json").write_text(json.dumps(text))
    first = stage.mtp_folder(str(model))
    assert stage.mtp_folder(str(model)) == first  # the store folder's name follows it
    assert os.path.basename(first) == model.name
    assert json.loads(Path(first, "config.json").read_text()) == {
        "architectures": ["Glm5NextForCausalLM"],
        "model_type": "glm5_next",
        "text_config": text,
    }
    assert os.listdir(first) == ["config.json"]  # no temporary file left
    shutil.rmtree(first)


class _Out:
    def __init__(self, rid: str, tokens: int, finished: bool = False, cached: int = 0):
        self.request_id, self.finished, self.num_cached_tokens = rid, finished, cached
        self.outputs = [type("C", (), {"token_ids": [0] * tokens})()]


# What vLLM adds to a request's id (tests/realsched/test_probe_digests.py checks it does).
INSIDE_SUFFIX = "0a1b2c3d"


class _SteppedEngine:
    """LLMEngine's add_request / step / abort_request, played: every decoder gains a
    token a step; a step takes ``step_s`` (``slow_s`` while the long prompt waits for its
    restore, ``restore_steps`` steps), and the long prompt finishes the step after."""

    def __init__(self, step_s=0.001, slow_s=0.001, restore_steps=5):
        self.step_s, self.slow_s, self.restore_steps = step_s, slow_s, restore_steps
        self.decoders: dict[str, int] = {}
        self.long_wait: int | None = None
        self.added: list[tuple[str, int]] = []

    def add_request(self, rid, prompt, params):
        self.added.append((rid, len(prompt["prompt_token_ids"])))
        if rid == "stall-long":
            self.long_wait = self.restore_steps
        else:
            self.decoders[rid] = 0
        return f"{rid}-{INSIDE_SUFFIX}"  # as vLLM: the id its scheduler knows it by

    def step(self):
        import time as t

        waiting = self.long_wait is not None and self.long_wait > 0
        t.sleep(self.slow_s if waiting else self.step_s)
        outs = []
        for rid in self.decoders:
            self.decoders[rid] += 1
            outs.append(_Out(rid, self.decoders[rid]))
        if self.long_wait is not None:
            if self.long_wait == 0:
                outs.append(_Out("stall-long", 1, finished=True, cached=4608))
                self.long_wait = None
            else:
                self.long_wait -= 1
        return outs

    def abort_request(self, rids):
        for rid in rids:
            self.decoders.pop(rid)

    def has_unfinished_requests(self):
        return bool(self.decoders)


def test_the_stall_check_times_the_decoders_alone_in_the_restore_window_and_after():
    import stall

    # 20 ms against 1: a loaded machine's late wake-ups stay far below the slow steps.
    engine = _SteppedEngine(step_s=0.001, slow_s=0.02, restore_steps=6)
    llm = type("L", (), {"llm_engine": engine})()
    got = stall.run(llm, [7] * 9000, decoders=3, alone_steps=40, after_steps=10,
                    sampling=dict)  # fmt: skip
    assert [n for n, _ in engine.added] == ["stall-dec0", "stall-dec1", "stall-dec2",
                                            "stall-long"]  # fmt: skip
    assert engine.added[-1][1] == 9000 and not engine.decoders  # aborted at the end
    assert got["long_cached_tokens"] == 4608 and got["decoders"] == 3
    assert got["restore"]["gaps"] == 3 * 6  # the six steps it waited, each decoder
    assert got["restore"]["p50_s"] >= 0.02 > got["alone"]["p99_s"]
    assert got["p99_restore_vs_alone"] > 2
    assert got["restore_window_s"] >= 6 * 0.02 and got["after"]["gaps"] == 3 * 10


class _TracedEngine(_SteppedEngine):
    """An in-process engine, played: step runs EngineCore's step_fn, whose scheduler's
    schedule takes the step's time (20 ms while the long prompt waits, else 1 ms), so
    the trace must put each slow step down to it."""

    def __init__(self, restore_steps):
        super().__init__(step_s=0.0, slow_s=0.0, restore_steps=restore_steps)
        scheduler = type("S", (), {})()
        scheduler.schedule = lambda s: time.sleep(s)
        self.core = type("Core", (), {})()
        self.core.scheduler = scheduler
        self.core.step_fn = self.step_inner
        self.engine_core = type("Client", (), {})()
        self.engine_core.engine_core = self.core

    def step(self):
        return self.core.step_fn()

    def step_inner(self):
        waiting = self.long_wait is not None and self.long_wait > 0
        self.core.scheduler.schedule(0.02 if waiting else 0.001)
        return super().step()


def test_the_stall_check_traces_where_each_step_around_the_window_went():
    import stall

    engine = _TracedEngine(restore_steps=4)
    llm = type("L", (), {"llm_engine": engine, "collective_rpc": lambda s, fn: [[]]})()
    got = stall.run(llm, [7] * 9000, decoders=2, alone_steps=30, after_steps=5,
                    sampling=dict)  # fmt: skip
    assert got["timed"] == ["core.step_fn", "scheduler.schedule"]
    phases = [s["phase"] for s in got["trace"]]
    assert phases == ["alone"] * 3 + ["restore"] * 4 + ["tail"] + ["after"] * 3
    for step in got["trace"]:
        assert step["in_ms"]["core.step_fn"] <= step["step_ms"]
        slow = step["in_ms"]["scheduler.schedule"]
        # Only the waiting steps slept 20 ms in the scheduler.
        assert (slow >= 20.0) == (step["phase"] == "restore"), step
    assert got["alone_step_s"]["gaps"] == 30 - stall.WARM_STEPS


class _AsyncTailEngine(_TracedEngine):
    """0.34.0's async scheduling, played: the step after the restore schedules the long
    prompt's tail (SchedulerOutput.num_scheduled_tokens names it) and is slow, 30 ms of
    compute; its finish is reported a step later. The restore's own steps are fast."""

    def __init__(self, restore_steps):
        super().__init__(restore_steps)
        self.core.scheduler.schedule = self.schedule
        self.tail_ran = False

    @staticmethod
    def schedule(tail):
        time.sleep(0.03 if tail else 0.001)
        inside = f"stall-long-{INSIDE_SUFFIX}"
        return type("Out", (), {"num_scheduled_tokens": {inside: 512} if tail else {}})

    def step_inner(self):
        tail = self.long_wait == 0 and not self.tail_ran
        self.core.scheduler.schedule(tail)
        outs = []
        for rid in self.decoders:
            self.decoders[rid] += 1
            outs.append(_Out(rid, self.decoders[rid]))
        if tail:
            self.tail_ran = True
        elif self.long_wait == 0:
            outs.append(_Out("stall-long", 1, finished=True, cached=4608))
            self.long_wait = None
        elif self.long_wait is not None:
            self.long_wait -= 1
        return outs


def test_the_stall_check_puts_the_tails_compute_outside_the_window_when_reported_late():
    import stall

    engine = _AsyncTailEngine(restore_steps=4)
    llm = type("L", (), {"llm_engine": engine, "collective_rpc": lambda s, fn: [[]]})()
    got = stall.run(llm, [7] * 9000, decoders=2, alone_steps=30, after_steps=5,
                    sampling=dict)  # fmt: skip
    phases = [s["phase"] for s in got["trace"]]
    assert phases == ["alone"] * 3 + ["restore"] * 4 + ["tail"] * 2 + ["after"] * 3
    tails = [s for s in got["trace"] if s["phase"] == "tail"]
    assert tails[0]["long_tokens"] == 512 and "long_tokens" not in tails[1]
    # The 30 ms step is the tail's, not the window's.
    assert got["restore"]["gaps"] == 2 * 4 and got["restore"]["max_s"] < 0.02
    assert got["tail"]["max_s"] >= 0.03 and got["tail_step_s"] >= 0.03
    assert got["long_cached_tokens"] == 4608 and got["restore_window_s"] < 0.03


def test_the_step_timer_installed_twice_times_each_call_once():
    import steptimer

    class Scheduler:
        def schedule(self):
            time.sleep(0.01)

    obj = Scheduler()
    assert steptimer.wrap(obj, ("schedule", "absent"), "twice") == ["twice.schedule"]
    timed = obj.schedule
    # A stage asking for step times beside the stall check's own install.
    assert steptimer.wrap(obj, ("schedule",), "twice") == ["twice.schedule"]
    assert obj.schedule is timed  # not a wrapper of the wrapper
    before = steptimer.snapshot()
    obj.schedule()
    assert steptimer.spent(before, steptimer.snapshot())["twice.schedule"] >= 10.0


def test_the_stall_verdict_needs_a_restored_prompt_and_reports_the_goal():
    st = {
        "long_cached_tokens": 4608,
        "restore": {"gaps": 48},
        "p99_restore_vs_alone": 1.3,
    }
    results = {"ttft.glm5wide.stall": {"rc": 0, "stall": st}}
    name = "ttft.glm5wide.stall: decoders' pace beside a restore (benchmark)"
    v = suite_realsize.stall_judge(results)[name]
    assert v["ok"] and not v["goal_met"] and v["goal"] == suite_realsize.STALL_GOAL
    st["long_cached_tokens"] = 4607  # less than one 4,608-token chunk: recomputed
    assert not suite_realsize.stall_judge(results)[name]["ok"]
