"""docker/bake.sh: the image's bake step, run here as CI runs it.

First against the stub overlay CLI (exit-code relay, the artifact list, the
installed-version check), then with the real `overlay` on a copy of the
pinned engine tree and the real manifests and overlays: bake succeeds, the
gate then passes, and a drifted tree fails the bake.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from docker_support import DOCKER, ENGINE_DIR, REPO, make_rig, write_exec


@pytest.fixture
def rig(tmp_path):
    return make_rig(tmp_path)


def test_bake_applies_checks_and_records_the_list(rig):
    pyc = rig.prefix / "overlays/kv-offload-scope/__pycache__"
    pyc.mkdir()
    (pyc / "kv_offload_scope.cpython-311.pyc").write_bytes(b"\0")
    res = rig.bake()
    assert res.returncode == 0, res.stderr
    calls = rig.overlay_calls()
    assert [c.split()[1] for c in calls] == ["apply", "check"]
    assert all("--check-injected" in c for c in calls)
    assert "--overlays kv-offload-scope,kv-offload-store-local" in calls[0]
    assert calls[1].endswith("--expect applied")
    listed = [ln.split("  ", 1)[1] for ln in rig.artifacts.read_text().splitlines()]
    assert listed[0] == f"anchors/{ENGINE_DIR}/ORDER"
    assert listed[1] == f"anchors/{ENGINE_DIR}/kv-offload-scope.toml"
    assert "overlays/kv-offload-store-local/kv_store_format.py" in listed
    assert not any("__pycache__" in p for p in listed)
    # Baking an already baked tree converges: same list, exit 0.
    before = rig.artifacts.read_bytes()
    assert rig.bake().returncode == 0
    assert rig.artifacts.read_bytes() == before


@pytest.mark.parametrize("state,code", [("drift", 3), ("tampered", 4)])
def test_bake_relays_overlay_failure_and_records_nothing(rig, state, code):
    rig.set_state(state)
    res = rig.bake()
    assert res.returncode == code
    assert "the tree is not baked" in res.stderr
    assert not rig.artifacts.exists()


def test_bake_fails_when_injected_code_does_not_compile(rig):
    (rig.tree / ".fake-bad-inject").write_text("")
    res = rig.bake()
    assert res.returncode == 5 and not rig.artifacts.exists()


def test_bake_refuses_a_bad_artifact_before_touching_the_tree(rig):
    m = rig.anchors / "kv-offload-store-local.toml"
    m.write_text(
        m.read_text().replace(
            'overlay = "kv-offload-store-local"', 'overlay = "kv-offload-scope"'
        )
    )
    res = rig.bake()
    assert res.returncode == 2 and "ORDER names kv-offload-store-local" in res.stderr
    assert rig.overlay_calls() == [] and not rig.artifacts.exists()


def _fake_install(tmp: Path, version: str) -> Path:
    """A python whose import path holds a `vllm` package of `version`."""
    site = tmp / f"site-{version}"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("raise ImportError('never imported')\n")
    info = site / f"vllm-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
    )
    py = tmp / f"python-{version}"
    write_exec(py, f'#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} "$@"\n')
    return py


def test_bake_finds_the_installed_tree_with_the_image_python(rig, tmp_path):
    py = _fake_install(tmp_path, "9.9.9")
    res = rig.run("bake.sh", "--prefix", str(rig.prefix), "--python", str(py))
    assert res.returncode == 0, res.stderr
    site = tmp_path / "site-9.9.9"
    assert f"--root {site} " in rig.overlay_calls()[0]
    assert f"--python {py}" in rig.overlay_calls()[0]


def test_bake_refuses_an_unsupported_installed_release(rig, tmp_path):
    """The release is the tree's (its dist-info); one without anchors here is
    refused, naming the version found and the supported ones: exit 2."""
    py = _fake_install(tmp_path, "9.9.8")
    res = rig.run("bake.sh", "--prefix", str(rig.prefix), "--python", str(py))
    assert res.returncode == 2
    meta = tmp_path / "site-9.9.8/vllm-9.9.8.dist-info/METADATA"
    assert f"vllm 9.9.8 ({meta}) is not a supported release" in res.stderr
    assert "this kvtier supports vllm 9.9.9" in res.stderr
    assert rig.overlay_calls() == [] and not rig.artifacts.exists()
    # Naming a release does not bake a tree of another one.
    res = rig.run("bake.sh", "--prefix", str(rig.prefix), "--python", str(py),
                  "--engine", ENGINE_DIR)  # fmt: skip
    assert res.returncode == 2
    assert f"holds vllm 9.9.8 ({meta}), but --engine names {ENGINE_DIR}" in res.stderr
    assert rig.overlay_calls() == [] and not rig.artifacts.exists()


def _second_release(rig, version: str) -> Path:
    """Copies the rig's anchors as those of another release of vllm."""
    other = rig.prefix / "anchors" / f"vllm-{version}"
    shutil.copytree(rig.anchors, other)
    for m in other.glob("*.toml"):
        m.write_text(m.read_text().replace('"9.9.9"', f'"{version}"'))
    return other


def test_bake_picks_the_release_the_tree_holds_and_the_gate_follows(rig, tmp_path):
    """Two releases' anchors side by side: no --engine needed, for an
    installed engine (--python) or a tree with its dist-info (--root); the
    gate then checks the release the bake recorded."""
    other = _second_release(rig, "9.9.8")
    py = _fake_install(tmp_path, "9.9.8")
    res = rig.run("bake.sh", "--prefix", str(rig.prefix), "--python", str(py))
    assert res.returncode == 0, res.stderr
    assert f"--manifests {other} " in rig.overlay_calls()[0]
    meta = tmp_path / "site-9.9.8/vllm-9.9.8.dist-info/METADATA"
    assert f"vllm 9.9.8 (from {meta})" in res.stderr
    first = rig.artifacts.read_text().splitlines()[0]
    assert first.endswith("  anchors/vllm-9.9.8/ORDER"), first
    res = rig.run("gate.sh", "--prefix", str(rig.prefix), "--python", str(py))
    assert res.returncode == 0, res.stderr
    assert f"--manifests {other} " in rig.overlay_calls()[-1]

    # The newer release, from a tree's own dist-info.
    info = rig.tree / "vllm-9.9.9.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: vllm\nVersion: 9.9.9\n"
    )
    res = rig.bake()
    assert res.returncode == 0, res.stderr
    assert f"--manifests {rig.anchors} " in rig.overlay_calls()[-2]
    first = rig.artifacts.read_text().splitlines()[0]
    assert first.endswith("  anchors/vllm-9.9.9/ORDER"), first


def test_launch_plans_the_order_of_the_release_baked(rig, tmp_path):
    """launch.sh plan takes ORDER from the release the bake recorded, not the
    newest one beside it (here the older release's ORDER is shorter)."""
    other = _second_release(rig, "9.9.8")
    (other / "ORDER").write_text("kv-offload-scope\n")
    py = _fake_install(tmp_path, "9.9.8")
    res = rig.run("bake.sh", "--prefix", str(rig.prefix), "--python", str(py))
    assert res.returncode == 0, res.stderr
    out = tmp_path / "plan"
    res = rig.run("launch.sh", "plan", "--ranks", "0", "--out", str(out),
                  "--prefix", str(rig.prefix), "--", "vllm", "serve", "m")  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert (out / "rank0/order").read_text() == "kv-offload-scope\n"


def test_a_tree_that_says_no_release_needs_engine_when_several_are_supported(rig):
    _second_release(rig, "9.9.8")
    res = rig.bake()  # the rig's tree has no dist-info and no _version.py
    assert res.returncode == 2
    assert (
        "says which vllm release it is; pass --engine vllm-VERSION (supported: 9.9.8 9.9.9)"
        in res.stderr
    )
    assert rig.overlay_calls() == [] and not rig.artifacts.exists()
    res = rig.run("bake.sh", "--prefix", str(rig.prefix), "--root", str(rig.tree),
                  "--engine", "vllm-9.9.8")  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "says no release; vllm-9.9.8, named by --engine" in res.stderr


def test_bake_usage_errors(rig):
    res = rig.run("bake.sh", "--prefix", str(rig.prefix))
    assert res.returncode == 2 and "--root TREE or --python PY" in res.stderr
    res = rig.run("bake.sh", "--bogus")
    assert res.returncode == 2 and "unknown argument" in res.stderr


# --------------------------------------- real overlay CLI, real pinned tree


@pytest.fixture
def real_prefix(tmp_path, manifests_dir, order, overlay_bin) -> Path:
    """A snapshot of the real anchors and overlays of the pinned order (the
    shared checkout keeps changing), laid out like /opt/kvtier. While an
    overlay of ORDER has no manifest yet, the snapshot's ORDER is the leading
    run of those that do (stacking only builds on earlier ones)."""
    present = []
    for name in order:
        if not (manifests_dir / f"{name}.toml").is_file():
            break
        present.append(name)
    if not present:
        pytest.skip(f"no overlay of {manifests_dir}/ORDER has a manifest yet")
    prefix = tmp_path / "kvtier"
    anchors = prefix / "anchors" / manifests_dir.name
    anchors.mkdir(parents=True)
    (anchors / "ORDER").write_text("".join(f"{n}\n" for n in present))
    for name in present:
        shutil.copy(manifests_dir / f"{name}.toml", anchors)
        shutil.copytree(
            REPO / "overlays" / name,
            prefix / "overlays" / name,
            ignore=shutil.ignore_patterns("__pycache__"),
        )
    (prefix / "bin").mkdir()
    (prefix / "bin" / "overlay").symlink_to(overlay_bin)
    _add_store_library(prefix, overlay_bin)
    return prefix


def _add_store_library(prefix: Path, overlay_bin: Path) -> None:
    """lib/kvtier/libkvtier_store.so of a flat prefix: this build's."""
    built = overlay_bin.parents[1] / "storeio" / "libkvtier_store.so"
    (prefix / "lib/kvtier").mkdir(parents=True)
    shutil.copy(built, prefix / "lib/kvtier")


def _script(name: str, prefix: Path, root: Path, *extra: str, env=None):
    return subprocess.run(
        [
            str(DOCKER / name),
            "--prefix",
            str(prefix),
            "--root",
            str(root),
            "--python",
            sys.executable,
            *extra,
        ],
        capture_output=True,
        text=True,
        check=False,
        env=env,
        timeout=300,
    )


def _knob1_env(tmp: Path) -> dict[str, str]:
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "GLM53_KV_OFFLOAD": "1",
        "GLM53_KV_OFFLOAD_DIR": str(tmp / "store"),
        "GLM53_KV_OFFLOAD_CPU_GB": "4",
    }


def test_bake_on_the_pinned_tree_then_gate_passes(real_prefix, tree_copy, tmp_path):
    res = _script("bake.sh", real_prefix, tree_copy)
    assert res.returncode == 0, res.stderr
    assert (real_prefix / "ARTIFACTS.sha256").is_file()
    res = _script("gate.sh", real_prefix, tree_copy, env=_knob1_env(tmp_path))
    assert res.returncode == 0, res.stderr
    # Idempotent: a second bake converges on the same applied tree.
    res = _script("bake.sh", real_prefix, tree_copy)
    assert res.returncode == 0, res.stderr


def test_bake_installs_the_store_library_and_records_it(real_prefix, tree_copy):
    """Beside the tree's native.py only, recorded for `overlay revert`, which
    then removes it with the folder the overlay made."""
    assert _script("bake.sh", real_prefix, tree_copy).returncode == 0
    (native,) = (tree_copy / "vllm").rglob("kv_store_format/native.py")
    record = (native.parent / ".overlay-installed").read_text()
    assert record.endswith("  libkvtier_store.so\n"), record
    assert not [p for p in real_prefix.rglob("*.so") if "lib/kvtier" not in str(p)]
    done = subprocess.run(
        [str(real_prefix / "bin/overlay"), "revert", "--root", str(tree_copy),
         "--manifests", str(next((real_prefix / "anchors").iterdir()))],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert not native.parent.exists()


def test_a_bake_without_the_store_library_says_so_and_knob_1_is_refused(
    real_prefix, tree_copy, tmp_path
):
    """Issue 48: a bake from the repository (no lib/kvtier) copied nothing and
    said nothing, and the gate then answered `ok: knob 1` for a writer that
    cannot start."""
    shutil.rmtree(real_prefix / "lib")
    res = _script("bake.sh", real_prefix, tree_copy)
    assert res.returncode == 0, res.stderr
    assert "no store library under" in res.stderr
    assert "the gate refuses knob 1" in res.stderr
    res = _script("gate.sh", real_prefix, tree_copy, env=_knob1_env(tmp_path))
    assert res.returncode == 2
    assert "libkvtier_store.so: missing, and the bake had none to install" in res.stderr
    res = _script("gate.sh", real_prefix, tree_copy, env={"PATH": "/usr/bin:/bin"})
    assert res.returncode == 0, res.stderr  # knob 0 loads no library
    # An engine environment naming the library (the writer loads it first).
    lib = str(real_prefix.parent / "nowhere.so")
    env = {**_knob1_env(tmp_path), "KVTIER_STORE_LIB": lib}
    res = _script("gate.sh", real_prefix, tree_copy, env=env)
    assert res.returncode == 2 and f"KVTIER_STORE_LIB={lib}: no such file" in res.stderr
    env["KVTIER_STORE_LIB"] = os.environ["KVTIER_STORE_LIB"]  # this build's (conftest)
    assert _script("gate.sh", real_prefix, tree_copy, env=env).returncode == 0


def test_the_gate_refuses_a_store_library_that_is_not_the_baked_one(
    real_prefix, tree_copy, tmp_path
):
    assert _script("bake.sh", real_prefix, tree_copy).returncode == 0
    (lib,) = (tree_copy / "vllm").rglob("kv_store_format/libkvtier_store.so")
    lib.write_bytes(lib.read_bytes() + b"\0")
    res = _script("gate.sh", real_prefix, tree_copy, env=_knob1_env(tmp_path))
    assert res.returncode == 2 and "differs from the baked" in res.stderr


def test_bake_fails_on_a_drifted_tree(
    real_prefix, tree_copy, manifests_dir, order, tmp_path
):
    import tomllib

    # A good bake elsewhere records the artifact list the gate needs below.
    scratch = tmp_path / "baked"
    shutil.copytree(tree_copy, scratch)
    assert _script("bake.sh", real_prefix, scratch).returncode == 0
    listed = (real_prefix / "ARTIFACTS.sha256").read_bytes()

    manifest = tomllib.loads((manifests_dir / f"{order[0]}.toml").read_text())
    target = tree_copy / manifest["files"][0]["path"]
    target.write_text(target.read_text() + "\n# a local edit nobody pinned\n")
    before = target.read_bytes()
    res = _script("bake.sh", real_prefix, tree_copy)
    assert res.returncode == 3, res.stderr
    assert target.read_bytes() == before, "a failed bake leaves the tree alone"
    assert (real_prefix / "ARTIFACTS.sha256").read_bytes() == listed
    # The gate refuses such a tree whatever the knob.
    res = _script("gate.sh", real_prefix, tree_copy, env={"PATH": "/usr/bin:/bin"})
    assert res.returncode == 2 and "neither applied nor pristine: drift" in res.stderr
    res = _script("gate.sh", real_prefix, tree_copy, env=_knob1_env(tmp_path))
    assert res.returncode == 2 and "needs every overlay applied: drift" in res.stderr


def test_gate_refuses_a_pristine_tree_for_knob_1(real_prefix, tree_copy, tmp_path):
    scratch = tmp_path / "baked"
    shutil.copytree(tree_copy, scratch)
    assert _script("bake.sh", real_prefix, scratch).returncode == 0
    # Same artifacts, but the tree the launcher points at was never baked.
    res = _script("gate.sh", real_prefix, tree_copy, env=_knob1_env(tmp_path))
    assert res.returncode == 2 and "needs every overlay applied" in res.stderr
    res = _script("gate.sh", real_prefix, tree_copy, env={"PATH": "/usr/bin:/bin"})
    assert res.returncode == 0, res.stderr  # knob 0: pristine is fine


# ------------------------------- the full wheel layout, as in the serving image


def _cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvtier"


@pytest.fixture(scope="module")
def wheel_install(tmp_path_factory, engine_name, engine_version, pin_dir) -> Path:
    """The pinned wheel unpacked whole, every compiled file in place
    (vllm/fs_io_C.abi3.so among them): what `pip install` leaves in the serving
    image's site-packages."""
    wheel_name = (pin_dir / "WHEEL").read_text().split()[1]
    wheel = _cache_root() / "wheels" / wheel_name
    if not wheel.is_file():
        pytest.skip(f"{wheel}: not cached (run scripts/setup.sh)")
    root = tmp_path_factory.mktemp("wheel-install") / "site-packages"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(root)
    return root


def _so_sha(root: Path) -> str:
    return hashlib.sha256((root / "vllm/fs_io_C.abi3.so").read_bytes()).hexdigest()


def test_bake_on_the_full_wheel_layout_without_a_fetch_cache(
    real_prefix, wheel_install, manifests_dir, tmp_path
):
    """The image's build stage: a wheel install with every .so and no fetch
    cache. The default bake applies every overlay but the one that rebuilds a
    binary, leaves vLLM's own extension alone, and the gate passes both knobs;
    --rebuild-binaries without the sources is a clear refusal that writes
    nothing; with the pinned sources it rebuilds the extension."""
    order = (real_prefix / f"anchors/{manifests_dir.name}/ORDER").read_text().split()
    if "vllm-fs-durable" not in order:
        pytest.skip("vllm-fs-durable is not in ORDER")
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin",
           "XDG_CACHE_HOME": str(tmp_path / "empty-cache")}  # fmt: skip
    (tmp_path / "empty-cache").mkdir()
    pinned = _so_sha(wheel_install)
    res = _script("bake.sh", real_prefix, wheel_install, env=env)
    assert res.returncode == 0, res.stderr
    assert "leaving out vllm-fs-durable" in res.stderr
    baked = (real_prefix / "ARTIFACTS.baked").read_text().split()
    assert baked == [n for n in order if n != "vllm-fs-durable"]
    assert _so_sha(wheel_install) == pinned
    assert not (wheel_install / "vllm/.fs_io_C.abi3.so.overlay-orig").exists()
    for knobs in (_knob1_env(tmp_path), env):
        res = _script("gate.sh", real_prefix, wheel_install, env={**env, **knobs})
        assert res.returncode == 0, res.stderr

    res = _script("bake.sh", real_prefix, wheel_install, "--rebuild-binaries", env=env)
    assert res.returncode == 2 and "pass --sources DIR" in res.stderr
    assert _so_sha(wheel_install) == pinned
    assert (real_prefix / "ARTIFACTS.baked").read_text().split() == baked

    sources = _cache_root() / "sources" / manifests_dir.name
    if not (sources / "csrc/fs_io.cpp").is_file() or not shutil.which("c++"):
        pytest.skip(f"{sources}: no pinned C/C++ sources (or no c++) to rebuild from")
    res = _script("bake.sh", real_prefix, wheel_install, "--rebuild-binaries",
                  "--sources", str(sources), env=env)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert (real_prefix / "ARTIFACTS.baked").read_text().split() == order
    assert _so_sha(wheel_install) != pinned
    assert (wheel_install / "vllm/.fs_io_C.abi3.so.overlay-orig").is_file()
    res = _script(
        "gate.sh", real_prefix, wheel_install, env={**env, **_knob1_env(tmp_path)}
    )
    assert res.returncode == 0, res.stderr


@pytest.fixture
def every_release_prefix(tmp_path, overlay_bin) -> Path:
    """A snapshot of every supported release's anchors and the overlays, laid
    out like /opt/kvtier (what the image and the wheel carry)."""
    prefix = tmp_path / "every"
    for d in sorted((REPO / "anchors").glob("*/ORDER")):
        if not d.parent.name.startswith("example-"):
            shutil.copytree(d.parent, prefix / "anchors" / d.parent.name)
    shutil.copytree(REPO / "overlays", prefix / "overlays",
                    ignore=shutil.ignore_patterns("__pycache__", "example-*"))  # fmt: skip
    (prefix / "bin").mkdir()
    (prefix / "bin" / "overlay").symlink_to(overlay_bin)
    _add_store_library(prefix, overlay_bin)
    return prefix


def test_bake_and_gate_find_the_release_of_a_pinned_tree(
    every_release_prefix, tree_copy, pin_dir, engine_name, engine_version, tmp_path
):
    """No --engine: the bake takes the release from the tree's dist-info (the
    pinned wheel's METADATA), the gate from what the bake recorded."""
    wheel = _cache_root() / "wheels" / (pin_dir / "WHEEL").read_text().split()[1]
    if not wheel.is_file():
        pytest.skip(f"{wheel}: not cached (run scripts/setup.sh)")
    info = f"{engine_name}-{engine_version}.dist-info"
    with zipfile.ZipFile(wheel) as z:
        (tree_copy / info).mkdir()
        (tree_copy / info / "METADATA").write_bytes(z.read(f"{info}/METADATA"))
    res = _script("bake.sh", every_release_prefix, tree_copy)
    assert res.returncode == 0, res.stderr
    meta = tree_copy / info / "METADATA"
    assert f"{engine_name} {engine_version} (from {meta})" in res.stderr
    listed = (every_release_prefix / "ARTIFACTS.sha256").read_text().splitlines()
    assert listed[0].endswith(f"  anchors/{engine_name}-{engine_version}/ORDER")
    res = _script("gate.sh", every_release_prefix, tree_copy, env=_knob1_env(tmp_path))
    assert res.returncode == 0, res.stderr


def test_the_gate_checks_what_was_baked(real_prefix, tree_copy, tmp_path):
    """ARTIFACTS.baked may leave out only overlays that rebuild a binary."""
    res = _script("bake.sh", real_prefix, tree_copy)
    assert res.returncode == 0, res.stderr
    baked = real_prefix / "ARTIFACTS.baked"
    names = baked.read_text().split()
    env = _knob1_env(tmp_path)
    baked.write_text("".join(f"{n}\n" for n in names[1:]))
    res = _script("gate.sh", real_prefix, tree_copy, env=env)
    assert res.returncode == 2 and f"lacks {names[0]}" in res.stderr
    baked.write_text("".join(f"{n}\n" for n in names + ["kv-offload-other"]))
    res = _script("gate.sh", real_prefix, tree_copy, env=env)
    assert res.returncode == 2 and "kv-offload-other is not in ORDER" in res.stderr
    baked.write_text("".join(f"{n}\n" for n in names))
    assert _script("gate.sh", real_prefix, tree_copy, env=env).returncode == 0
