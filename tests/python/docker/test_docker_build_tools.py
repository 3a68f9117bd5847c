"""docker/build-tools.sh, the image's builder stage, for real: it builds and
installs both tools into a prefix laid out exactly as the image holds it
(/opt/kvtier), and the tools run from there. The portable build goes into
<build dir>-image (incremental on later runs); the prefix is moved before use,
as `COPY --from=builder` does.

The bug this guards (issue 19): the old layout ran the tools through a
bundled ld.so, so /proc/self/exe was the loader and `overlay` could not find
its anchors."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from docker_support import DOCKER, REPO

# The oldest glibc the image's tools may need: Ubuntu 22.04's, the base of
# the vLLM serving images.
GLIBC_FLOOR = (2, 35)


@pytest.fixture(scope="module")
def image_prefix(build_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("builder") / "opt" / "kvtier"
    res = subprocess.run(
        [str(DOCKER / "build-tools.sh"), "build", "--src", str(REPO),
         "--build", f"{build_dir}-image", "--out", str(out)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    # COPY --from=builder /opt/kvtier/ /opt/kvtier/: same layout, elsewhere.
    moved = tmp_path_factory.mktemp("serving") / "opt" / "kvtier"
    moved.parent.mkdir(parents=True)
    shutil.copytree(out, moved, symlinks=True)
    shutil.rmtree(out)
    return moved


def test_layout(image_prefix):
    for tool in ("overlay", "kvstore"):
        assert os.access(image_prefix / "bin" / tool, os.X_OK)
    data = image_prefix / "share/kvtier"
    assert sorted(p.name for p in (data / "anchors").iterdir()) == sorted(
        p.name
        for p in (REPO / "anchors").iterdir()
        if not p.name.startswith("example-")
    )
    assert os.access(data / "docker/bake.sh", os.X_OK)
    assert not (image_prefix / "libexec").exists()
    # No C or C++ runtime of the builder's travels into the image.
    bundled = sorted(p.name for p in (image_prefix / "lib/kvtier").iterdir())
    assert not [
        n
        for n in bundled
        if re.match(r"(ld-linux|libc\.|libm\.|libstdc\+\+|libgcc_s)", n)
    ]


@pytest.mark.parametrize("tool", ["overlay", "kvstore"])
def test_tools_load_only_glibc_from_the_system(image_prefix, tool):
    ldd = subprocess.run(
        ["ldd", str(image_prefix / "bin" / tool)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "not found" not in ldd
    assert (
        "libstdc++" not in ldd and "libfmt" not in ldd and "libtomlplusplus" not in ldd
    )
    for line in ldd.splitlines():
        m = re.search(r"=> (\S+)", line)
        if m and "/lib/kvtier/" not in m[1]:
            assert re.search(r"/(libc|libm|libpthread|libdl|librt)\.so", m[1]), line


def test_glibc_requirement_recorded_and_old_enough(image_prefix):
    need = (image_prefix / "share/kvtier/GLIBC_REQUIRED").read_text().strip()
    assert tuple(int(x) for x in need.split(".")) <= GLIBC_FLOOR, need


def test_overlay_finds_its_anchors_in_the_image_layout(
    image_prefix, tree_copy, tmp_path
):
    """`/opt/kvtier/bin/overlay check --root TREE`, no --manifests, through a
    link and with an empty environment, as the README's container example."""
    link = tmp_path / "overlay"
    link.symlink_to(image_prefix / "bin/overlay")
    for exe in (image_prefix / "bin/overlay", link):
        res = subprocess.run(
            [str(exe), "check", "--root", str(tree_copy), "--expect", "pristine"],
            capture_output=True, text=True, check=False, env={},
        )  # fmt: skip
        assert res.returncode == 0, res.stderr
        assert "ok: pristine" in res.stdout


def test_bake_and_gate_run_from_the_image_layout(
    image_prefix, tree_copy, engine_name, engine_version
):
    """The Dockerfile's bake step, then the gate, with the image's own paths."""
    docker = image_prefix / "share/kvtier/docker"
    env = {"PATH": "/usr/bin:/bin"}
    # The release is named: with two pin sets installed, both default to the newest.
    release = ["--engine", f"{engine_name}-{engine_version}"]
    res = subprocess.run(
        [str(docker / "bake.sh"), "--prefix", str(image_prefix), "--root", str(tree_copy),
         *release],
        capture_output=True, text=True, check=False, env=env,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert (image_prefix / "share/kvtier/ARTIFACTS.sha256").is_file()
    # The overlays' store library: beside native.py (its default path) with
    # the ISA-L it needs, loadable there, and pinned in the artifact list.
    (native,) = tree_copy.rglob("kv_store_format/native.py")
    baked = native.parent / "libkvtier_store.so"
    assert (
        baked.read_bytes()
        == (image_prefix / "lib/kvtier/libkvtier_store.so").read_bytes()
    )
    ldd = subprocess.run(["ldd", str(baked)], capture_output=True, text=True).stdout
    assert "not found" not in ldd and "libstdc++" not in ldd, ldd
    listed = (image_prefix / "share/kvtier/ARTIFACTS.sha256").read_text()
    assert "  ../../lib/kvtier/libkvtier_store.so\n" in listed
    knob1 = dict(
        env,
        GLM53_KV_OFFLOAD="1",
        GLM53_KV_OFFLOAD_DIR="/data/kv",
        GLM53_KV_OFFLOAD_CPU_GB="8",
    )
    res = subprocess.run(
        [str(docker / "gate.sh"), "--prefix", str(image_prefix), "--root", str(tree_copy),
         *release],
        capture_output=True, text=True, check=False, env=knob1,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr


def test_bake_refuses_a_system_glibc_older_than_the_tools(
    image_prefix, tree_copy, tmp_path
):
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    (stubs / "getconf").write_text("#!/bin/sh\necho 'glibc 2.17'\n")
    (stubs / "getconf").chmod(0o755)
    res = subprocess.run(
        [str(image_prefix / "share/kvtier/docker/bake.sh"), "--prefix", str(image_prefix),
         "--root", str(tree_copy), "--artifacts", str(tmp_path / "A")],
        capture_output=True, text=True, check=False, env={"PATH": f"{stubs}:/usr/bin:/bin"},
    )  # fmt: skip
    assert (
        res.returncode == 2
        and "need glibc >= " in res.stderr
        and "has 2.17" in res.stderr
    )
    assert not (tmp_path / "A").exists()
    assert "vllm" in os.listdir(tree_copy) and not list(
        tree_copy.rglob("*.kvtier-journal")
    )


def test_builder_packages_are_a_trimmed_subset_of_setup(tmp_path):
    res = subprocess.run(
        [str(DOCKER / "build-tools.sh"), "packages"],
        capture_output=True,
        text=True,
        check=True,
    )
    pkgs = res.stdout.split()
    setup = (REPO / "scripts/setup.sh").read_text()
    listed = re.search(r"APT_PACKAGES=\((.*?)\)", setup, re.S)[1].split()
    assert set(pkgs) - {"g++"} <= set(listed)
    for not_needed in ("clang", "shellcheck", "python3", "python3-pip", "unzip"):
        assert not_needed not in pkgs


def test_usage_errors_and_help():
    res = subprocess.run(
        [str(DOCKER / "build-tools.sh"), "build", "--src", "/x"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert res.returncode == 2 and "needs --src, --build and --out" in res.stderr
    res = subprocess.run(
        [str(DOCKER / "build-tools.sh"), "--help"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 0 and res.stdout.startswith(
        "The Dockerfile's builder stage"
    )
