"""packaging/deploy/monitoring/: the Prometheus rules and the Grafana dashboard are
checked, not just shipped (issue 48): `promtool check rules`, `promtool test
rules` (each alert fires on the series that should fire it, and only those),
every dashboard query parses as PromQL, and every metric a rule or a panel
names is one the code exports: the engine's counters from the one table
vLLM's /metrics is fed from (kv_store_local/exported.py), kvstore's from
the textfiles the built kvstore writes."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import REPO_ROOT as REPO
from kvstore_support import Store, age_tree

MON = REPO / "packaging/deploy/monitoring"
RULES = MON / "kvtier-rules.yml"
DASHBOARD = MON / "kvtier-dashboard.json"
# node-exporter's own series the rules compare the store with (not ours).
NODE_EXPORTER = {"node_filesystem_avail_bytes"}
METRIC = re.compile(r"\b(vllm:[A-Za-z0-9_:]+|kvstore_[a-z0-9_]+|node_[a-z0-9_]+)")


def _promtool(*args: str, cwd: Path = MON) -> subprocess.CompletedProcess:
    if shutil.which("promtool") is None:
        pytest.fail(
            "promtool is not installed (scripts/setup.sh installs Debian's prometheus)"
        )
    return subprocess.run(
        ["promtool", *args], cwd=cwd, capture_output=True, text=True, check=False
    )


def _rule_exprs() -> dict[str, str]:
    doc = yaml.safe_load(RULES.read_text())
    return {r["alert"]: r["expr"] for g in doc["groups"] for r in g["rules"]}


def _panel_exprs() -> list[str]:
    doc = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 10
    return exprs


def _exported_engine_metrics() -> set[str]:
    path = REPO / "overlays/kv-offload-store-local/kv_store_local/exported.py"
    spec = importlib.util.spec_from_file_location("exported_for_monitoring", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return {row.name + "_total" for row in mod.COUNTERS}  # vLLM appends _total


@pytest.fixture(scope="module")
def kvstore_metrics(kvstore_bin, tmp_path_factory) -> set[str]:
    """Every series name the three commands' textfiles carry for a store."""
    s = Store(tmp_path_factory.mktemp("mon") / "glm53-kv-offload")
    s.boundary(["a"])
    s.boundary(["a", "b"])
    age_tree(s.tier)
    names: set[str] = set()
    for command in ("verify", "gc", "stat"):
        done = subprocess.run(
            [str(kvstore_bin), command, "--prometheus", "-", str(s.tier)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        names |= {
            re.split(r"[{ ]", ln, maxsplit=1)[0]
            for ln in done.stdout.splitlines()
            if ln and not ln.startswith("#")
        }
    return names


def test_rules_pass_promtool_check():
    done = _promtool("check", "rules", RULES.name)
    assert done.returncode == 0, done.stdout + done.stderr


def test_rules_unit_tests_pass():
    done = _promtool("test", "rules", "kvtier-rules.test.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    tested = set(
        re.findall(r"alertname: (\w+)", (MON / "kvtier-rules.test.yml").read_text())
    )
    assert tested == set(_rule_exprs()), "every alert has a promtool test"


def test_gc_not_running_fires_when_never_reported():
    """Issue 48: a series never written (the unit never ran) is an alert too."""
    assert (
        'absent(kvstore_last_success_timestamp_seconds{command="gc"})'
        in (_rule_exprs()["KvtierGcNotRunning"])
    )


def test_dashboard_queries_parse_as_promql(tmp_path):
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"kvtier:panel_{i}", "expr": e.replace("$__rate_interval", "5m")
         .replace("$instance", ".*")}
        for i, e in enumerate(_panel_exprs())]}]}  # fmt: skip
    (tmp_path / "panels.yml").write_text(yaml.safe_dump(rules))
    done = _promtool("check", "rules", "panels.yml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_metric_named_is_one_the_code_exports(kvstore_metrics):
    engine = _exported_engine_metrics()
    named = {
        m: where
        for where, exprs in (
            ("rules", _rule_exprs().values()),
            ("dashboard", _panel_exprs()),
        )
        for e in exprs
        for m in METRIC.findall(e)
    }
    assert any(m.startswith("vllm:") for m in named) and any(
        m.startswith("kvstore_") for m in named
    )
    unknown = {
        m: where
        for m, where in named.items()
        if m not in engine | kvstore_metrics | NODE_EXPORTER
    }
    assert not unknown, f"not exported by the code: {unknown}"


def test_deploy_md_names_every_alert():
    deploy = (REPO / "docs/DEPLOY.md").read_text()
    assert "packaging/deploy/monitoring/kvtier-rules.yml" in deploy
    for alert in _rule_exprs():
        assert alert in deploy, alert
