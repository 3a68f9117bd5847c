"""The tier's counters as the engine exports them, against the probe's numbers.

stage.py --metrics scrapes vLLM's own registry after a stage (``LLM.get_metrics()``, the
in-process reader of what /metrics serves; the offline LLM has no HTTP endpoint) and
suite.py judges it with ``check``: each exported counter against the sum over ranks of the
field the probe read from the workers (StoreStats, RestoreStats) and the scheduler's tier
(TierStats), through the one table in kv_store_local/exported.py.

Exact where the count is final when vLLM takes it: the tier's counters (taken in the same
step as they change). A worker's counters reach the engine with the next step's output, and
the writer keeps writing after the last step, so the export is at most the probe's count
(and more than 0 for the headline counters the probe saw move).
"""

from __future__ import annotations

import importlib.util
import os
from types import SimpleNamespace
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TABLE = os.path.join(
    REPO, "overlays", "kv-offload-store-local", "kv_store_local", "exported.py"
)
PREFIX = "vllm:kv_offload_"
# Counters the probe saw move that must have reached the export by the stage's end.
HEADLINE = (
    "vllm:kv_offload_store_keys_written",
    "vllm:kv_offload_restore_keys",
    "vllm:kv_offload_restore_promotions",
)


def table() -> Any:
    spec = importlib.util.spec_from_file_location("kvtier_exported", TABLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def scrape(llm: Any) -> list[dict]:
    """The tier's counters in the engine's registry, summed over engines (stage side)."""
    from vllm.v1.metrics.reader import Counter

    summed: dict[tuple, float] = {}
    for m in llm.get_metrics():
        if isinstance(m, Counter) and m.name.startswith(PREFIX):
            labels = tuple(
                sorted(
                    (k, v)
                    for k, v in m.labels.items()
                    if k not in ("engine", "model_name")
                )
            )
            summed[(m.name, labels)] = summed.get((m.name, labels), 0) + m.value
    return [
        {"name": n, "labels": dict(lb), "value": v}
        for (n, lb), v in sorted(summed.items())
    ]


def _summed(records: list[dict]) -> SimpleNamespace | None:
    if not records:
        return None
    out: dict[str, Any] = {}
    for r in records:
        for k, v in r.items():
            if isinstance(v, dict):
                acc = out.setdefault(k, {})
                for kk, vv in v.items():
                    acc[kk] = acc.get(kk, 0) + vv
            elif isinstance(v, (int, float)) and not isinstance(v, bool):
                out[k] = out.get(k, 0) + v
    return SimpleNamespace(**out)


def probed(res: dict) -> dict[tuple, tuple[float, bool]]:
    """(metric, labels) -> (the probe's count summed over ranks, exact?)."""
    t = table()
    writers = [w.get("stats") for w in res.get("workers") or [] if w.get("stats")]
    if not writers:  # a restore stage: the writer's counters come with its report
        writers = [
            w.get("writer_stats")
            for w in res.get("restore_workers") or []
            if w.get("writer_stats")
        ]
    restores = [
        w.get("stats") for w in res.get("restore_workers") or [] if w.get("stats")
    ]
    tier = res.get("restore_scheduler") or {}
    sources = [
        (t.STORE, _summed(writers), False),
        (t.RESTORE, _summed(restores), False),
        (t.TIER, SimpleNamespace(**tier) if tier.get("restore") else None, True),
    ]
    out: dict[tuple, tuple[float, bool]] = {}
    for source, stats, exact in sources:
        if stats is None:
            continue
        for row in t.COUNTERS:
            if row.source == source and not hasattr(stats, row.field):
                setattr(stats, row.field, 0)  # a field this probe did not record
        for name, labels, value in t.samples(source, stats):
            label_name = (
                next(r.label[0] for r in t.COUNTERS if r.name == name and r.label)
                if labels
                else None
            )
            key = (name, ((label_name, labels[0]),) if labels else ())
            before, _ = out.get(key, (0, exact))
            out[key] = (before + value, exact)
    return out


def check(res: dict) -> dict:
    """The suite's verdict: every counter the probe counted, as exported."""
    if res.get("metrics") is None:
        return {"ok": False, "error": "no metrics scraped (stage.py --metrics)"}
    exported = {
        (m["name"], tuple(sorted(m["labels"].items()))): m["value"]
        for m in res["metrics"]
    }
    rows, ok = [], True
    for key, (want, exact) in sorted(probed(res).items()):
        got = exported.get(key, 0)
        if exact:
            good = abs(got - want) <= 1e-6
        else:
            good = got <= want + 1e-6 and not (
                key[0] in HEADLINE and want > 0 and got <= 0
            )
        ok = ok and good
        if want or got or not good:
            rows.append(
                {
                    "metric": key[0],
                    "labels": dict(key[1]),
                    "exported": got,
                    "probe": want,
                    "exact": exact,
                    "ok": good,
                }  # fmt: skip
            )
    unknown = sorted({k[0] for k in exported} - {k[0] for k in probed(res)})
    return {"ok": ok and bool(rows), "counters": rows, "exported_only": unknown}
