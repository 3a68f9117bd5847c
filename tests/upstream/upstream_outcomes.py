"""A pytest plugin: writes each test's outcome, by node id, to a JSON file.

    UPSTREAM_OUTCOMES=out.json [UPSTREAM_SHARD=i/N] python -m pytest -p upstream_outcomes ...

One outcome a test: "failed" when any phase failed (a setup failure is
"error"), else "skipped" when it was skipped, else "passed". The file maps
node id -> [outcome, the failure's last line]. tests/upstream/run.py
compares two such files (pristine and patched tree). With UPSTREAM_SHARD=i/N
only every N-th collected test from the i-th on runs (collection order is
the same in every process, so N shards cover each test once).
"""

from __future__ import annotations

import json
import os

_outcomes: dict[str, list[str]] = {}
_seconds: dict[str, float] = {}
_RANK = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}


def _last_line(report) -> str:
    text = str(report.longrepr or "")
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def pytest_collection_modifyitems(session, config, items) -> None:
    shard = os.environ.get("UPSTREAM_SHARD")
    if not shard:
        return
    index, count = (int(x) for x in shard.split("/"))
    config.hook.pytest_deselected(
        items=[item for i, item in enumerate(items) if i % count != index]
    )
    items[:] = [item for i, item in enumerate(items) if i % count == index]


def pytest_runtest_logreport(report) -> None:
    if report.failed:
        outcome = "failed" if report.when == "call" else "error"
    elif report.skipped:
        outcome = "skipped"
    else:
        outcome = "passed"
    _seconds[report.nodeid] = _seconds.get(report.nodeid, 0.0) + report.duration
    old = _outcomes.get(report.nodeid)
    if old is None or _RANK[outcome] > _RANK[old[0]]:
        detail = _last_line(report) if outcome != "passed" else ""
        _outcomes[report.nodeid] = [outcome, detail]


def pytest_sessionfinish(session, exitstatus) -> None:
    path = os.environ.get("UPSTREAM_OUTCOMES")
    if path:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(_outcomes, f, indent=0, sort_keys=True)
        with open(path + ".seconds", "w", encoding="utf-8") as f:
            json.dump(_seconds, f, indent=0, sort_keys=True)
