"""The GPU suite's stage table and what each ONLY / TOGETHER / GPUS runs, against a recorded
listing (tests/python/engine/engine_stage_table.json): a change to a stage, its order or what a
selection picks shows here as a diff before it costs device minutes. No GPU or vLLM needed.

After a deliberate change to the table: `python3 tests/python/engine/test_engine_stage_table.py`
writes the listing anew; the diff of the JSON is the change to review.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
GOLDEN = Path(__file__).resolve().parent / "engine_stage_table.json"

# (ONLY, TOGETHER, GPUS) as engine/device-b.sh passes them to suite.py.
CASES = [
    ("", "", 1),
    ("", "", 2),
    ("", "1,7", 1),
    ("restore", "", 1),
    ("ttft.llama8b", "", 1),
    ("ttft,burst8b", "", 1),
    ("dsv2lite,qwen3next,glm5next", "", 1),
    ("dsv2lite,qwen3next,glm5next", "21,22", 1),
    ("pressure.sampled", "", 1),
    ("pressure", "", 1),
    ("llama,lfm2", "1,2", 2),
]

# Run in a fresh interpreter: TTFT_TOKENS is read when the suite is imported.
LIST = """
import dataclasses, json, os, sys
sys.path.insert(0, os.path.join(sys.argv[1], "engine"))
import suite
cases = json.loads(sys.argv[2])
def rel(v):
    if isinstance(v, list):
        return [rel(x) for x in v]
    return v.replace(sys.argv[1] + os.sep, "") if isinstance(v, str) else v
table = [{k: rel(v) for k, v in dataclasses.asdict(s).items()} for s in suite.stages()]
runs = []
for only, together, gpus in cases:
    todo = suite.plan(only, together, gpus)
    waves = sorted({s.wave for s in todo})
    runs.append({"only": only, "together": together, "gpus": gpus,
                 "selected": [s.name for s in todo],
                 "waves": [[w, [s.name for s in todo if s.wave == w]] for w in waves]})
print(json.dumps({"table": table, "runs": runs}))
"""


def listing(ttft_tokens: str | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TTFT_TOKENS"}
    if ttft_tokens is not None:
        env["TTFT_TOKENS"] = ttft_tokens
    out = subprocess.run(
        [sys.executable, "-c", LIST, str(REPO), json.dumps(CASES)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out)


def recorded() -> dict:
    short = listing("32768")["table"]  # only the ttft.* stages read it
    return {
        "default": listing(),
        "TTFT_TOKENS=32768": [s for s in short if s["name"].startswith("ttft.")],
    }


def test_stage_table_and_selections_match_the_recorded_listing():
    want = json.loads(GOLDEN.read_text())
    got = recorded()
    table, runs = got["default"]["table"], got["default"]["runs"]
    # Named differences first (the whole-dict diff of 70 stages is long).
    assert [s["name"] for s in table] == [s["name"] for s in want["default"]["table"]]
    for a, b in zip(table, want["default"]["table"], strict=True):
        assert a == b, a["name"]
    for a, b in zip(runs, want["default"]["runs"], strict=True):
        assert a == b, (a["only"], a["together"], a["gpus"])
    assert got == want


def test_ttft_tokens_reaches_the_ttft_stages():
    for tokens, want in ((None, "ttft:32768,126976"), ("32768", "ttft:32768")):
        table = listing(tokens)["table"]
        cold = next(s for s in table if s["name"] == "ttft.llama8b.cold")
        assert cold["args"][cold["args"].index("--workload") + 1] == want


# The KV block (tokens) vLLM 0.34.0 picked for each hybrid model stage in run 28 (its log's
# "kv lcm block sizes"): GLM-5.3 on FlashMLA sparse, Qwen3-Next sized to its state page.
HYBRID_BLOCKS = {"glm5next": 512, "qwen3next": 192}


def test_the_hybrid_model_stages_prompts_fill_their_kv_blocks():
    # Run 28: on the "small" prompts (40-100 tokens) those two stored nothing.
    sys.path.insert(0, str(REPO / "engine"))
    import stage

    table = listing(None)["table"]
    for model, block in HYBRID_BLOCKS.items():
        stages = [s for s in table if s["name"].startswith(model + ".")]
        stages = [s for s in stages if s["name"] != model + ".ops"]
        assert len(stages) == 8, model  # pristine, two knobs, five restores
        for st in stages:
            args = st["args"]
            prompts, _ = stage.workload(args[args.index("--workload") + 1])
            assert all(len(p) >= 2 * block for p in prompts), (st["name"], block)


if __name__ == "__main__":
    GOLDEN.write_text(json.dumps(recorded(), indent=1) + "\n")
    print(f"wrote {GOLDEN}")
