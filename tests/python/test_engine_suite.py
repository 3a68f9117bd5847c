"""The GPU suite's judge (engine/suite.py) on hand-made stage results: every check it makes
on the H200 must be able to fail. No GPU or vLLM needed."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "engine"))

import suite  # noqa: E402

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
                "compare": {"keys": 5, "equal": 4, "different": 0, "no_file": 1, "shape": 0},
                "stats": {"state_files_removed": 1, "keys_dropped_budget": 3},
            }
        )
    res = stage(
        workers=workers,
        install=[{"writer_groups": [0, 1], "offloaded_groups": [0, 1]}] * tp,
        eligible_lines=["KV offloading eligible groups: [0, 1] of 2 (draft-model groups [])"],
        kvstore_verify={"rc": 0},
    )
    res.update(over)
    return res


def test_identical_logprobs_pass_and_any_difference_fails():
    assert suite.same_logprobs(stage(), stage())["ok"]
    other = [[[[5, -0.25], [9, -1.5000001]], STEP]]
    verdict = suite.same_logprobs(stage(), stage(other))
    assert not verdict["ok"] and verdict["max_abs_logprob_diff"] > 0
    swapped = [[[[5, -0.25], [8, -1.5]], STEP]]
    assert suite.same_logprobs(stage(), stage(swapped))["top20_token_sets_differ"] == 1
    assert not suite.same_logprobs(stage(), stage([[STEP]]))["ok"]  # a step missing
    assert not suite.same_logprobs({"rounds": []}, {"rounds": []})["ok"]  # nothing compared


def test_writer_check_passes_a_good_stage():
    assert suite.check_writer(writer_stage(), 1)["ok"]
    assert suite.check_writer(writer_stage(tp=2), 2)["ok"]


@pytest.mark.parametrize(
    "breakage",
    [
        lambda r: r["workers"][0]["compare"].update(different=1),
        lambda r: r["workers"][0]["compare"].update(equal=0),
        lambda r: r["workers"][0]["compare"].update(no_file=2),  # more than retention removed
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
    assert verdicts["pressure.on: all requests served, drops counted, store clean"]["ok"]
    ratio = verdicts["throughput tier on / off (round 0, tokens/s, mean of the runs)"]
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
    assert {"llama.mp", "llama.tp2", "lfm2.tp2", "pressure.off", "pressure.on"} <= names
    assert all(s.gpus == 2 for s in suite.stages() if s.name.endswith("tp2"))
