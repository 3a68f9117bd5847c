"""docs/DEPLOY.md and the deployment examples it points at are real: the knob
table is the knob module's, the systemd units pass `systemd-analyze verify`
and their commands run against a real store and leave metrics promtool
accepts (an empty store folder fails them; repair removes what verify
found), and the Kubernetes examples' scripts do the same: the sidecar ends on
a refused sweep, and its vLLM container gets the connector config
`launch.sh plan` writes for its knobs."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO_ROOT as REPO
from kvstore_support import FULL_GROUP, Store, age_tree, flip_bit

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


EXEC_KEYS = ("ExecStart=", "ExecStartPre=", "ExecStopPost=")


def _units(kvstore_bin: Path, tmp_path: Path) -> dict[str, Path]:
    """The units, `kvstore` (found by systemd in /usr/local/bin or /usr/bin)
    replaced by this build's."""
    out = {}
    for unit in sorted((DEPLOY / "systemd").glob("kvtier-*.*")):
        text = unit.read_text()
        for key in EXEC_KEYS:
            text = text.replace(f"\n{key}kvstore ", f"\n{key}{kvstore_bin} ")
        dst = tmp_path / unit.name
        dst.write_text(text)
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
        "kvtier-repair.service",
    }
    res = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", *map(str, units.values())],
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


def _unit_lines(unit: Path) -> list[tuple[str, str]]:
    out = []
    for line in unit.read_text().splitlines():
        if line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            out.append((key, value))
    return out


def _unit_env(unit: Path, env_file: Path | None = None) -> dict[str, str]:
    """Environment= lines, then the EnvironmentFile= the unit names (read
    from `env_file` instead, as systemd would read /etc/default/kvtier)."""
    env: dict[str, str] = {}
    for key, value in _unit_lines(unit):
        if key == "Environment":
            k, _, v = value.partition("=")
            env[k] = v
        if key == "EnvironmentFile" and env_file is not None:
            for line in env_file.read_text().splitlines():
                if line.strip() and not line.startswith("#"):
                    k, _, v = line.partition("=")
                    env[k] = v
    return env


def test_systemd_units_name_no_folder_but_in_their_environment():
    """Issue 48: the store folder moves with /etc/default/kvtier or a drop-in;
    no Condition or sandbox line names it, and `kvstore` is found by name in
    the prefix the docs install to (/usr/local/bin) or the .deb's (/usr/bin)."""
    services = sorted((DEPLOY / "systemd").glob("kvtier-*.service"))
    assert len(services) == 3
    for unit in services:
        lines = _unit_lines(unit)
        for key, value in lines:
            if key not in ("Environment", "EnvironmentFile", "Documentation"):
                assert "/data/" not in value and "/var/lib/" not in value, (unit, key)
            assert not key.startswith(
                ("Condition", "ReadWritePaths", "ReadOnlyPaths")
            ), (
                unit,
                key,
            )
            if key in ("ExecStart", "ExecStopPost"):
                assert value.startswith("kvstore ") and value.endswith(
                    "${KVTIER_STORE}"
                ), (unit, value)
        assert ("EnvironmentFile", "-/etc/default/kvtier") in lines, unit
    example = (DEPLOY / "systemd/kvtier.default").read_text()
    assert "#KVTIER_STORE=" in example and "#TEXTFILE_DIR=" in example
    deploy = (REPO / "docs/DEPLOY.md").read_text()
    assert "/etc/default/kvtier" in deploy and "--prefix /usr/local" in deploy


def _run_unit_commands(
    unit: Path, env: dict[str, str], codes: tuple[int, ...] = (0,)
) -> list[int]:
    """Runs the unit's commands in systemd's order: ExecStart= lines until one
    fails, then every ExecStopPost= line whatever happened. Their codes."""
    done: list[int] = []
    lines = _unit_lines(unit)
    for key in ("ExecStart", "ExecStopPost"):
        for k, value in lines:
            if k != key or (key == "ExecStart" and any(done)):
                continue
            cmd = re.sub(r"\$\{(\w+)\}", lambda m: env[m[1]], value)
            res = subprocess.run(
                cmd.split(), capture_output=True, text=True, check=False
            )
            assert res.returncode in codes, (cmd, res.stdout, res.stderr)
            done.append(res.returncode)
    return done


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
    env_file = tmp_path / "kvtier.default"
    env_file.write_text(f"KVTIER_STORE={store}\nTEXTFILE_DIR={textfile}\n")
    env = _unit_env(units["kvtier-gc.service"], env_file)
    assert env == {"KVTIER_STORE": str(store), "TEXTFILE_DIR": str(textfile)}
    assert _run_unit_commands(units["kvtier-gc.service"], env) == [0, 0]
    assert _run_unit_commands(units["kvtier-verify.service"], env) == [0]
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


def test_systemd_units_fail_on_an_empty_store_folder(kvstore_bin, tmp_path):
    """An unmounted disk (the store folder empty) is exit 8, no store here: the
    units fail and the last-success timestamp stays 0 (never), which the "gc
    not running" rule catches; nothing says "no problems"."""
    units = _units(kvstore_bin, tmp_path)
    empty = tmp_path / "mnt"
    empty.mkdir()
    textfile = tmp_path / "textfile"
    textfile.mkdir()
    env = {"KVTIER_STORE": str(empty), "TEXTFILE_DIR": str(textfile)}
    assert _run_unit_commands(units["kvtier-gc.service"], env, (8,)) == [8, 8]
    assert _run_unit_commands(units["kvtier-verify.service"], env, (8,)) == [8]
    for name in ("kvtier_gc.prom", "kvtier_stat.prom", "kvtier_verify.prom"):
        text = (textfile / name).read_text()
        assert re.search(r"^kvstore_last_exit_code\{[^}]*\} 8$", text, re.M), text
        assert re.search(
            r"^kvstore_last_success_timestamp_seconds\{[^}]*\} 0$", text, re.M
        ), text


def test_repair_unit_removes_what_verify_found(kvstore_bin, tmp_path):
    """The "payload corruption" runbook as the units run it: verify fails on a
    flipped payload byte, kvtier-repair's sweep removes the damage and exits
    0, its verify and the next daily one are clean."""
    s = Store(tmp_path / "glm53-kv-offload")
    for names in (["a"], ["a", "b"], ["c"], ["c", "d"]):
        s.boundary(names)
    age_tree(s.tier)
    chunk = s.tier / s.chunk_rel("b", FULL_GROUP)
    flip_bit(chunk, chunk.stat().st_size - 1)
    units = _units(kvstore_bin, tmp_path)
    textfile = tmp_path / "textfile"
    textfile.mkdir()
    env = {"KVTIER_STORE": str(s.tier), "TEXTFILE_DIR": str(textfile)}
    assert _run_unit_commands(units["kvtier-verify.service"], env, (1,)) == [1]
    assert _run_unit_commands(units["kvtier-repair.service"], env) == [0, 0]
    assert not chunk.exists()
    assert _run_unit_commands(units["kvtier-verify.service"], env) == [0]
    gc = (textfile / "kvtier_gc.prom").read_text()
    assert re.search(r"^kvstore_gc_damage [1-9]", gc, re.M), gc
    assert 'kvstore_last_exit_code{command="gc"} 0' in gc


def _sidecar(kvstore_bin: Path, store: Path, textfile: Path) -> str:
    (pod,) = yaml.safe_load_all(
        (DEPLOY / "kubernetes/kvtier-gc-sidecar.yaml").read_text()
    )
    return (
        _container_script(pod)
        .replace("/opt/kvtier/bin/kvstore", str(kvstore_bin))
        .replace("/data/glm53-kv-offload", str(store))
        .replace("/textfile", str(textfile))
    )


def test_kubernetes_sidecar_ends_when_a_sweep_is_refused(kvstore_bin, tmp_path, store):
    """DEPLOY.md: the sidecar exits non-zero when a sweep is refused (here: a
    store folder others could write, exit 4); on a sound store it keeps
    sweeping."""
    textfile = tmp_path / "textfile"
    textfile.mkdir()
    script = _sidecar(kvstore_bin, store, textfile)
    env = {"PATH": "/usr/bin:/bin", "KVTIER_GC_INTERVAL": "0.2"}
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run(["sh", "-c", script], env=env, capture_output=True, timeout=3)
    for name in ("kvtier_gc.prom", "kvtier_stat.prom"):
        _promtool(textfile / name)
    store.chmod(0o777)
    try:
        res = subprocess.run(
            ["sh", "-c", script], env=env, capture_output=True, text=True, timeout=30
        )
    finally:
        store.chmod(0o700)
    assert res.returncode == 4, res.stdout + res.stderr
    assert "sweep refused" in res.stderr


def test_kubernetes_serving_container_gets_the_connector_config(tmp_path):
    """Knob 1 in the pod means the tier is on: the vLLM container's arguments
    carry the --kv-transfer-config `launch.sh plan` writes for the knobs in its
    env (the boot guard's spec_module_path among them), after the model."""
    (pod,) = yaml.safe_load_all(
        (DEPLOY / "kubernetes/kvtier-gc-sidecar.yaml").read_text()
    )
    (vllm,) = [c for c in pod["spec"]["containers"] if c["name"] == "vllm"]
    knobs = {e["name"]: e["value"] for e in vllm["env"]}
    assert knobs["GLM53_KV_OFFLOAD"] == "1"
    model = vllm["args"][0]
    env = {
        "PATH": "/usr/bin:/bin",
        **knobs,
        "GLM53_KV_OFFLOAD_BUILD_ID": "kvtier-0000000000000000",
    }
    res = subprocess.run(
        [str(REPO / "docker/launch.sh"), "plan", "--ranks", "0", "--out",
         str(tmp_path / "plan"), "--", model],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    argv = (tmp_path / "plan/rank0/argv").read_text().splitlines()
    assert vllm["args"] == argv
    assert "kv_store_local" in argv[argv.index("--kv-transfer-config") + 1]
