"""engine/stage.py's main loop on a stand-in LLM (no GPU, no vLLM): what it asks the
workers through collective_rpc and what it saves, for the paths only a GPU run took so far
(issue 47: the ablated engine's writer drained between turns, its key counts saved)."""

from __future__ import annotations

import json
import sys
import types
from types import SimpleNamespace

import pytest
from conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "engine"))
import stage  # noqa: E402

# What each probe function sent to the workers answers (one worker), by name.
REPLIES = {
    "ablate_writer": lambda mode: {"ablated": mode},
    "thread_cpu": lambda: {"(caller)": 1.0},
    "wait_writer_idle": lambda: True,
    "install_recorder": lambda: {"writer_groups": [0]},
    "inspect_worker": lambda compare=True: {
        "stats": {"keys_dropped_budget": 7},
        "compared": compare,
    },
}


class _Output:
    def __init__(self, ids: list[int]):
        self.prompt_token_ids, self.num_cached_tokens = ids, 0
        self.outputs = [SimpleNamespace(token_ids=[1, 2], logprobs=None)]


class _LLM:
    """vLLM's LLM as stage.py uses it: boot, collective_rpc, generate."""

    made: list[_LLM] = []

    def __init__(self, **kwargs):
        self.kwargs, self.rpc = kwargs, []
        self.llm_engine = SimpleNamespace(vllm_config=SimpleNamespace())
        _LLM.made.append(self)

    def collective_rpc(self, fn, args=(), kwargs=None):
        self.rpc.append((fn.__name__, kwargs or {}))
        return [REPLIES[fn.__name__](*args, **(kwargs or {}))]

    def generate(self, requests, params, use_tqdm=False):
        return [_Output(r["prompt_token_ids"]) for r in requests]


@pytest.fixture
def run_stage(tmp_path, monkeypatch):
    fake = types.ModuleType("vllm")
    fake.LLM, fake.SamplingParams = _LLM, lambda **kw: SimpleNamespace(**kw)
    monkeypatch.setitem(sys.modules, "vllm", fake)
    _LLM.made.clear()

    def run(*extra: str) -> tuple[int, dict | None, list]:
        out = tmp_path / "stage.json"
        argv = ["stage.py", "--model", "m", "--out", str(out), "--rounds", "2",
                "--logprobs", "0", *extra]  # fmt: skip
        monkeypatch.setattr(sys, "argv", argv)
        rc = stage.main()
        saved = json.loads(out.read_text()) if out.exists() else None
        return rc, saved, _LLM.made[-1].rpc

    return run


def names(rpc: list) -> list[str]:
    return [n for n, _ in rpc]


def test_an_ablated_engine_in_turns_drains_its_writer_each_round_and_saves_its_counts(
    run_stage, tmp_path
):
    turns = f"{tmp_path.name}:ref:ref"
    rc, saved, rpc = run_stage("--ablate", "capture", "--turns", turns)
    assert rc == 0
    assert names(rpc).count("wait_writer_idle") == 2  # after each of the two rounds
    assert ("inspect_worker", {"compare": False}) in rpc
    assert saved["ablate_stats"] == [{"keys_dropped_budget": 7}]
    assert "workers" not in saved  # an ablated engine is not judged as the probed one
    assert [r["turn_wait_s"] >= 0 for r in saved["rounds"]] == [True, True]


def test_an_engine_out_of_turns_or_tier_off_does_not_wait_for_a_writer(
    run_stage, tmp_path
):
    _, _, rpc = run_stage("--ablate", "capture")
    assert "wait_writer_idle" not in names(rpc)
    _, saved, rpc = run_stage("--turns", f"{tmp_path.name}:off:off")
    assert "wait_writer_idle" not in names(rpc) and "ablate_stats" not in saved


def test_the_probed_engine_in_turns_drains_and_is_inspected_with_its_compare(
    run_stage, tmp_path
):
    rc, saved, rpc = run_stage(
        "--probe", "--compare", "--turns", f"{tmp_path.name}:on:on"
    )
    assert rc == 0 and names(rpc).count("wait_writer_idle") == 2
    assert ("inspect_worker", {"compare": True}) in rpc
    assert saved["workers"][0]["compared"] is True and "ablate_stats" not in saved


def test_an_ablation_no_worker_took_stops_the_stage_before_any_round(
    run_stage, monkeypatch
):
    monkeypatch.setitem(REPLIES, "ablate_writer", lambda mode: {"ablated": None})
    rc, saved, rpc = run_stage("--ablate", "capture")
    assert rc == 1 and saved is None and names(rpc) == ["ablate_writer"]
