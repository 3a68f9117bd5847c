"""engine/metrics_check.py: the suite's judge of the exported counters against the probe.

Fabricated stage results (the shapes stage.py writes: probe.inspect_worker's "stats",
probe.restore_report's "stats" and "writer_stats", stage.scheduler_restore, and the
"metrics" stage.py --metrics scrapes); the GPU run is the lead's (docs/ENGINE.md).
"""

from __future__ import annotations

import sys

from conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "engine"))

import metrics_check  # noqa: E402


def metric(name, value, **labels):
    return {"name": "vllm:kv_offload_" + name, "labels": labels, "value": value}


def two_ranks(written=(4, 5), lost=(0, 1)):
    return {
        "argv": ["--metrics"],
        "workers": [
            {"stats": {"keys_written": w, "bytes_written": w * 10, "keys_lost": x}}
            for w, x in zip(written, lost, strict=True)
        ],
    }


def test_worker_counters_at_most_the_probes_and_the_headline_moved():
    res = two_ranks()
    res["metrics"] = [
        metric("store_keys_written", 8),  # one write after the last step: 8 <= 9
        metric("store_written_bytes", 90),
        metric("store_keys_lost", 1, reason="staging_reused"),
    ]
    verdict = metrics_check.check(res)
    assert verdict["ok"], verdict
    (row,) = [r for r in verdict["counters"] if r["metric"].endswith("keys_written")]
    assert (row["exported"], row["probe"]) == (8, 9)


def test_more_than_the_probe_counted_fails():
    res = two_ranks()
    res["metrics"] = [metric("store_keys_written", 10)]
    assert not metrics_check.check(res)["ok"]


def test_a_headline_counter_that_never_reached_the_export_fails():
    res = two_ranks()
    res["metrics"] = [metric("store_written_bytes", 90)]
    assert not metrics_check.check(res)["ok"]


def test_the_schedulers_counters_must_match_exactly():
    res = {
        "argv": ["--metrics"],
        "restore_workers": [
            {
                "stats": {"keys_restored": 7, "failures": {"checksum": 1}},
                "writer_stats": {"keys_written": 2},
            }  # fmt: skip
        ],
        "restore_scheduler": {
            "restore": True,
            "lookups": {"hit": 3, "miss": 1},
            "promotions_ok": 1,
            "keys_promoted": 7,
        },
    }
    res["metrics"] = [
        metric("store_keys_written", 2),
        metric("restore_keys", 7),
        metric("restore_jobs_refused", 1, reason="checksum"),
        metric("restore_lookups", 3, result="hit"),
        metric("restore_lookups", 1, result="miss"),
        metric("restore_promotions", 1, result="ok"),
        metric("restore_keys_promoted", 7),
    ]
    assert metrics_check.check(res)["ok"]
    res["metrics"][3] = metric("restore_lookups", 2, result="hit")
    verdict = metrics_check.check(res)
    assert not verdict["ok"]
    (bad,) = [r for r in verdict["counters"] if not r["ok"]]
    assert bad["labels"] == {"result": "hit"} and bad["exact"]


def test_no_scrape_is_a_failed_check():
    assert not metrics_check.check(two_ranks())["ok"]
