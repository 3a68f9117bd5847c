"""kv_store_local/exported.py: the one table that puts the tier's counters on /metrics.

Every field of StoreStats, RestoreStats and TierStats is either a row of the table or an
entry of EXCLUDED with a reason, so a field the writer gains (the disk budget's evictions)
fails here until it joins with one line. The end-to-end path (the real scheduler, vLLM's
Prometheus logger) is tests/realsched/test_exported_metrics_real_scheduler.py.
"""

from __future__ import annotations

import ast
import importlib.util
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

from conftest import REPO_ROOT as REPO

STORE_LOCAL = REPO / "overlays" / "kv-offload-store-local" / "kv_store_local"
RESTORE = REPO / "overlays" / "kv-offload-restore"


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(f"exported_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


exported = _load(STORE_LOCAL / "exported.py")


def dataclass_fields(path: Path, name: str) -> list[str]:
    """Field names of one dataclass, read from its source (no vLLM needed)."""
    tree = ast.parse(path.read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name]
    return [
        s.target.id
        for s in cls.body
        if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
    ]


RECORDS = {
    exported.STORE: dataclass_fields(STORE_LOCAL / "stats.py", "StoreStats"),
    exported.RESTORE: dataclass_fields(
        RESTORE / "kv_restore_worker.py", "RestoreStats"
    ),
    exported.TIER: dataclass_fields(RESTORE / "kv_restore_tier.py", "TierStats"),
}


def test_every_stats_field_is_exported_or_excluded_with_a_reason():
    rows = {(r.source, r.field) for r in exported.COUNTERS}
    excluded = set(exported.EXCLUDED)
    assert all(exported.EXCLUDED.values())
    assert not rows & excluded
    for source, names in RECORDS.items():
        assert names, source
        missing = [n for n in names if (source, n) not in rows | excluded]
        assert missing == [], f"{source} fields neither exported nor excluded"
    # and no row names a field that does not exist (a rename would export nothing)
    known = {(s, n) for s, names in RECORDS.items() for n in names}
    assert rows | excluded <= known


def test_names_and_help_follow_vllms_conventions():
    by_name: dict[str, set] = {}
    for row in exported.COUNTERS:
        assert row.name.startswith("vllm:kv_offload_"), row.name
        assert not row.name.endswith("_total"), "vLLM's Counter adds _total"
        assert row.help.endswith(".") and row.help[0].isupper(), row.help
        by_name.setdefault(row.name, set()).add(
            (row.help, row.label[0] if row.label else None)
        )
        if row.label and row.label[1]:
            assert (row.source, row.name, row.label[1]) not in {
                (o.source, o.name, o.label[1] if o.label else None)
                for o in exported.COUNTERS
                if o is not row
            }
    # One metric shared by several fields: one help text and one label name.
    assert all(len(v) == 1 for v in by_name.values())
    defs = exported.definitions(lambda **kw: kw)
    assert set(defs) == set(by_name)
    assert defs["vllm:kv_offload_store_keys_lost"]["labelnames"] == ("reason",)
    assert defs["vllm:kv_offload_store_keys_written"]["labelnames"] == ()


class Payload:
    """Stands in for vLLM's OffloadingConnectorStats (increase_counter only)."""

    def __init__(self):
        self.counters: dict = {}

    def increase_counter(self, name, value, labelvalues=()):
        key = (name, labelvalues)
        self.counters[key] = self.counters.get(key, 0) + value


def test_the_exporter_sends_each_increase_once():
    stats = SimpleNamespace(**{n: 0 for n in RECORDS[exported.STORE]})
    out = exported.Exporter()
    assert out.take([(exported.STORE, stats)], Payload()) is None
    stats.keys_written, stats.keys_lost, stats.keys_dropped_paused = 5, 2, 1
    first = out.take([(exported.STORE, stats)], Payload()).counters
    assert first == {
        ("vllm:kv_offload_store_keys_written", ()): 5,
        ("vllm:kv_offload_store_keys_lost", ("staging_reused",)): 2,
        ("vllm:kv_offload_store_keys_dropped", ("paused",)): 1,
    }
    assert out.take([(exported.STORE, stats)], Payload()) is None
    stats.keys_written = 7
    again = out.take([(exported.STORE, stats), (exported.RESTORE, None)], Payload())
    assert again.counters == {("vllm:kv_offload_store_keys_written", ()): 2}


def test_a_per_reason_counter_uses_its_reasons_as_label_values():
    restore = SimpleNamespace(**{n: 0 for n in RECORDS[exported.RESTORE]})
    restore.failures = Counter(checksum=2, lock_busy=1)
    got = exported.Exporter().take([(exported.RESTORE, restore)], Payload()).counters
    assert got == {
        ("vllm:kv_offload_restore_jobs_refused", ("checksum",)): 2,
        ("vllm:kv_offload_restore_jobs_refused", ("lock_busy",)): 1,
    }


def test_deploy_md_tables_every_exported_series():
    deploy = (REPO / "docs" / "DEPLOY.md").read_text()
    missing = [
        row.name
        for row in exported.COUNTERS
        if f"`{row.name}_total`" not in deploy or f"`{row.field}`" not in deploy
    ]
    assert missing == [], "docs/DEPLOY.md: add these series (or fields) to the table"
