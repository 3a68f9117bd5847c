"""docs/DEPLOY.md and the deployment examples it points at are real: the knob
table is the knob module's, the systemd units pass `systemd-analyze verify`
and their commands run against a real store and leave metrics promtool
accepts, and the Kubernetes CronJob's script does the same."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from kvstore_support import Store, age_tree

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "packaging/deploy"
KNOBS = REPO / "overlays/kv-offload-scope/kv_offload_knobs.py"


def test_knob_table_is_the_modules():
    table = subprocess.run(
        [sys.executable, str(KNOBS), "table"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert table.strip() in (REPO / "docs/DEPLOY.md").read_text(), (
        "docs/DEPLOY.md: paste `python3 overlays/kv-offload-scope/kv_offload_knobs.py table`"
    )
    names = subprocess.run(
        [sys.executable, str(KNOBS), "names"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for name in names.split():
        assert f"`{name}`" in table


def test_readme_has_a_deploying_section():
    readme = (REPO / "README.md").read_text()
    section = readme.split("\n## Deploying\n", 1)[1].split("\n## ", 1)[0]
    for needle in (
        "docs/DEPLOY.md",
        "refresh-digests.sh",
        "launch-example.sh",
        "kvstore gc --sweep",
        "--prometheus",
    ):
        assert needle in section, needle


@pytest.fixture
def store(tmp_path) -> Path:
    s = Store(tmp_path / "glm53-kv-offload")
    for names in (["a"], ["a", "b"]):
        s.boundary(names)
    age_tree(s.tier)
    return s.tier


def _units(kvstore_bin: Path, tmp_path: Path) -> dict[str, Path]:
    out = {}
    for unit in sorted((DEPLOY / "systemd").iterdir()):
        dst = tmp_path / unit.name
        dst.write_text(unit.read_text().replace("/usr/bin/kvstore", str(kvstore_bin)))
        out[unit.name] = dst
    return out


def test_systemd_units_verify(kvstore_bin, tmp_path):
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    units = _units(kvstore_bin, tmp_path)
    assert set(units) >= {
        "kvtier-gc.service",
        "kvtier-gc.timer",
        "kvtier-verify.service",
        "kvtier-verify.timer",
    }
    res = subprocess.run(
        ["systemd-analyze", "verify", *map(str, units.values())],
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 0 and res.stderr == "", res.stderr


def test_the_sweep_runs_as_the_serving_user_not_root():
    """Issue 45, 5: run as root, a sweep made .lock root's and the engine's
    writer could not open it at its next boot. The unit names its user."""
    unit = (DEPLOY / "systemd" / "kvtier-gc.service").read_text()
    users = re.findall(r"^User=(\S+)$", unit, re.M)
    assert users and users[0] not in ("root", "0"), users


def _run_unit_commands(unit: Path, env: dict[str, str]) -> None:
    for line in unit.read_text().splitlines():
        if not line.startswith("ExecStart="):
            continue
        cmd = re.sub(
            r"\$\{(\w+)\}", lambda m: env[m[1]], line.removeprefix("ExecStart=")
        )
        res = subprocess.run(cmd.split(), capture_output=True, text=True, check=False)
        assert res.returncode == 0, (cmd, res.stdout, res.stderr)


def _promtool(path: Path) -> None:
    if shutil.which("promtool") is None:
        pytest.fail(
            "promtool is not installed (scripts/setup.sh installs Debian's prometheus)"
        )
    res = subprocess.run(
        ["promtool", "check", "metrics"],
        input=path.read_text(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_systemd_commands_sweep_and_export(kvstore_bin, tmp_path, store):
    units = _units(kvstore_bin, tmp_path)
    textfile = tmp_path / "node-exporter"
    textfile.mkdir()
    env = {"KVTIER_STORE": str(store), "TEXTFILE_DIR": str(textfile)}
    _run_unit_commands(units["kvtier-gc.service"], env)
    _run_unit_commands(units["kvtier-verify.service"], env)
    proms = sorted(p.name for p in textfile.iterdir())
    assert proms == ["kvtier_gc.prom", "kvtier_stat.prom", "kvtier_verify.prom"]
    for p in textfile.iterdir():
        _promtool(p)
    assert (
        'kvstore_last_exit_code{command="gc"} 0'
        in (textfile / "kvtier_gc.prom").read_text()
    )


def _container_script(doc: dict) -> str:
    spec = doc["spec"]
    if doc["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]["template"]["spec"]
    (c,) = [c for c in spec["containers"] if c["name"] == "kvstore-gc"]
    assert c["command"] == ["/bin/sh", "-c"]
    return c["args"][0]


def test_kubernetes_cronjob_runs(kvstore_bin, tmp_path, store):
    (doc,) = yaml.safe_load_all(
        (DEPLOY / "kubernetes/kvtier-gc-cronjob.yaml").read_text()
    )
    assert doc["spec"]["concurrencyPolicy"] == "Forbid"
    script = _container_script(doc)
    textfile = tmp_path / "textfile"
    textfile.mkdir()
    script = (
        script.replace("/opt/kvtier/bin/kvstore", str(kvstore_bin))
        .replace("/data/glm53-kv-offload", str(store))
        .replace("/textfile", str(textfile))
    )
    res = subprocess.run(
        ["sh", "-c", script], capture_output=True, text=True, check=False
    )
    assert res.returncode == 0, res.stdout + res.stderr
    for name in ("kvtier_gc.prom", "kvtier_stat.prom"):
        _promtool(textfile / name)


def test_kubernetes_sidecar_runs_the_same_commands():
    (cron,) = yaml.safe_load_all(
        (DEPLOY / "kubernetes/kvtier-gc-cronjob.yaml").read_text()
    )
    (pod,) = yaml.safe_load_all(
        (DEPLOY / "kubernetes/kvtier-gc-sidecar.yaml").read_text()
    )

    def commands(script: str) -> list[str]:
        joined = re.sub(r"\\\n\s*", "", script)
        return [
            re.sub(r"\s+\|\|.*$", "", ln.strip())
            for ln in joined.splitlines()
            if "kvstore " in ln
        ]

    assert commands(_container_script(pod)) == commands(_container_script(cron))
    mounts = {v["name"]: v["hostPath"]["path"] for v in pod["spec"]["volumes"]}
    assert mounts["kv-tier"] == "/data/glm53-kv-offload"
