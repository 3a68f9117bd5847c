"""Issue 48, the docker/ scripts as an operator meets them: `doctor.sh` runs
every check on a baked tree and says ok, and on a broken node names every
problem (not only the first) with exit 2; the scripts suggest the nearest
subcommand or option; `launch.sh plan` writes only the baked overlays into
each rank's order file and, before a bake, says to bake."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from docker_support import DOCKER, baked_rig, make_rig
from kvstore_support import FULL_GROUP, Store, age_tree, flip_bit


def _prefix(tmp: Path, manifests_dir: Path, order: list[str], build_dir: Path) -> Path:
    """A flat prefix as an install lays it out: the release's anchors, the
    overlays, bin/overlay and bin/kvstore, lib/kvtier/libkvtier_store.so."""
    prefix = tmp / "kvtier"
    anchors = prefix / "anchors" / manifests_dir.name
    anchors.mkdir(parents=True)
    baked = [n for n in order if n != "vllm-fs-durable"]
    (anchors / "ORDER").write_text("".join(f"{n}\n" for n in baked))
    for name in baked:
        shutil.copy(manifests_dir / f"{name}.toml", anchors)
        shutil.copytree(Path(manifests_dir).parents[1] / "overlays" / name,
                        prefix / "overlays" / name,
                        ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    (prefix / "bin").mkdir()
    (prefix / "bin/overlay").symlink_to(build_dir / "patcher/overlay")
    (prefix / "bin/kvstore").symlink_to(build_dir / "kvstore/kvstore")
    (prefix / "lib/kvtier").mkdir(parents=True)
    shutil.copy(build_dir / "storeio/libkvtier_store.so", prefix / "lib/kvtier")
    return prefix


def _doctor(prefix: Path, tree: Path, *extra: str, **env: str):
    return subprocess.run(
        [str(DOCKER / "doctor.sh"), "--prefix", str(prefix), "--root", str(tree),
         "--python", sys.executable, *extra],
        env={"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root"),
             **env},
        capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip


def _store(tmp: Path) -> Store:
    s = Store(tmp / "glm53-kv-offload")
    for names in (["a"], ["a", "b"], ["c"], ["c", "d"]):
        s.boundary(names)
    age_tree(s.tier)
    return s


@pytest.fixture
def baked(tmp_path, manifests_dir, order, build_dir, tree_copy):
    if not order:
        pytest.skip("no ORDER")
    prefix = _prefix(tmp_path, manifests_dir, order, build_dir)
    done = subprocess.run(
        [str(DOCKER / "bake.sh"), "--prefix", str(prefix), "--root", str(tree_copy),
         "--python", sys.executable],
        capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return prefix, tree_copy


def test_doctor_says_ok_on_a_baked_node(baked, tmp_path, kvstore_bin):
    prefix, tree = baked
    s = _store(tmp_path)
    textfile = tmp_path / "textfile"
    textfile.mkdir()
    gc = subprocess.run(
        [str(kvstore_bin), "gc", "--sweep", "-q", "--prometheus",
         str(textfile / "kvtier_gc.prom"), str(s.tier)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert gc.returncode == 0, gc.stderr
    r = _doctor(prefix, tree, "--textfile-dir", str(textfile),
                GLM53_KV_OFFLOAD="1", GLM53_KV_OFFLOAD_DIR=str(s.tier),
                GLM53_KV_OFFLOAD_CPU_GB="4", GLM53_KV_OFFLOAD_DISK_GB="1M")  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    for check in ("knobs", "gate", "store", "verify", "store library", "store folder",
                  "disk budget", "textfile"):  # fmt: skip
        assert any(ln.startswith(f"ok   {check}: ") for ln in lines), (check, r.stdout)
    assert "library 0.1.0" in r.stdout and "1 rank(s)" in r.stdout
    assert lines[-1] == "doctor: 0 problem(s), 0 warning(s)", r.stdout


def test_doctor_names_every_problem(baked, tmp_path, engine_tree):
    """A bad knob, a tree that is not the baked one, a rotted store whose
    folder others can write, a budget the disk cannot hold: each a FAIL line
    with its cause; the checks after the first failure still ran."""
    prefix, _ = baked
    s = _store(tmp_path)
    chunk = s.tier / s.chunk_rel("b", FULL_GROUP)
    flip_bit(chunk, chunk.stat().st_size - 1)
    pristine = tmp_path / "pristine"
    shutil.copytree(engine_tree, pristine, ignore=shutil.ignore_patterns("__pycache__"))
    s.tier.chmod(0o777)
    try:
        r = _doctor(prefix, pristine, "--textfile-dir", str(tmp_path / "none"),
                    GLM53_KV_OFFLOAD="1", GLM53_KV_OFFLOAD_DIR=str(s.tier),
                    GLM53_KV_OFFLOAD_CPU_GB="65")  # fmt: skip
    finally:
        s.tier.chmod(0o700)
    assert r.returncode == 2, r.stdout + r.stderr
    out = r.stdout
    assert "FAIL knobs: GLM53_KV_OFFLOAD_CPU_GB=65: must be an integer 1..64" in out
    assert "FAIL gate: " in out
    assert "FAIL verify: " in out and "1 corrupt" in out
    assert (
        "FAIL store folder: store folder not safe: " in out and "world-writable" in out
    ), out
    assert "warn disk budget: GLM53_KV_OFFLOAD_DISK_GB unset" in out
    assert "warn textfile: " in out
    assert "skip store library: the tree holds no kv_store_format/native.py" in out
    assert out.splitlines()[-1].startswith("doctor: 4 problem(s), ")


def test_doctor_checks_the_budget_against_the_disk(baked, tmp_path):
    prefix, tree = baked
    s = _store(tmp_path)
    r = _doctor(prefix, tree, "--quick", "--ranks", "8", GLM53_KV_OFFLOAD="1",
                GLM53_KV_OFFLOAD_DIR=str(s.tier), GLM53_KV_OFFLOAD_CPU_GB="4",
                GLM53_KV_OFFLOAD_DISK_GB="1000000T")  # fmt: skip
    assert r.returncode == 2
    assert (
        "FAIL disk budget: 8 rank(s) x 1000000.0 TB = 8000000.0 TB against" in r.stdout
    ), r.stdout
    assert "skip verify: --quick" in r.stdout


@pytest.mark.parametrize(
    ("script", "args", "hint"),
    [
        ("launch.sh", ["plna"], "did you mean 'plan'?"),
        ("launch.sh", ["comapre"], "did you mean 'compare'?"),
        ("gate.sh", ["--prefx", "x"], "did you mean '--prefix'?"),
        ("bake.sh", ["--rebuild"], "did you mean '--rebuild-binaries'?"),
        ("doctor.sh", ["--quik"], "did you mean '--quick'?"),
        ("launch-example.sh", ["--hots", "h"], "did you mean '--hosts'?"),
    ],
)
def test_scripts_suggest_the_nearest_word(script, args, hint):
    r = subprocess.run([str(DOCKER / script), *args], capture_output=True, text=True,
                       check=False)  # fmt: skip
    assert r.returncode == 2 and hint in r.stderr, r.stderr


def test_plan_order_lists_only_what_the_bake_applied(tmp_path):
    """ARTIFACTS.baked leaves out an overlay that rebuilds a binary: the plan's
    order file must not name it (it named ORDER whole before)."""
    rig = make_rig(tmp_path)
    m = rig.anchors / "kv-offload-store-local.toml"
    m.write_text(m.read_text() + '\n[[built_files]]\npath = "vllm/x.so"\n')
    assert rig.bake().returncode == 0
    (rig.prefix / "ARTIFACTS.baked").write_text("kv-offload-scope\n")
    r = rig.run("launch.sh", "plan", "--ranks", "0", "--out", str(tmp_path / "plan"),
                "--prefix", str(rig.prefix), "--", "m")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "plan/rank0/order").read_text() == "kv-offload-scope\n"


def test_plan_before_a_bake_says_to_bake(tmp_path):
    rig = make_rig(tmp_path)
    knobs = {"GLM53_KV_OFFLOAD": "1", "GLM53_KV_OFFLOAD_DIR": "/data/kv",
             "GLM53_KV_OFFLOAD_CPU_GB": "4"}  # fmt: skip
    args = ["plan", "--ranks", "0", "--out", str(tmp_path / "plan"), "--prefix",
            str(rig.prefix), "--", "m"]  # fmt: skip
    r = rig.run("launch.sh", *args, **knobs)
    assert r.returncode == 2 and "ARTIFACTS.sha256: missing; bake first" in r.stderr
    rig.artifacts.write_text("")  # what the wheel ships: not baked yet
    r = rig.run("launch.sh", *args, **knobs)
    assert r.returncode == 2 and "empty (nothing baked yet); bake first" in r.stderr
    assert not (tmp_path / "plan").exists()


def test_gate_says_an_empty_artifact_list_is_not_baked_yet(tmp_path):
    rig = baked_rig(tmp_path)
    rig.artifacts.write_text("")
    r = rig.gate()
    assert r.returncode == 2 and "empty: nothing baked yet; run bake.sh" in r.stderr
