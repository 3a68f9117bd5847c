"""Lint: shellcheck on every shell script of docker/, scripts/ and .ci/run, and
a structural check of docker/Dockerfile (Debian ships no Dockerfile linter:
`apt-cache search hadolint` finds nothing), so the image build is known to
run the same scripts CI runs."""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from docker_support import REPO

SCRIPTS = sorted(
    [*REPO.glob("docker/*.sh"), *REPO.glob("scripts/*.sh"), REPO / ".ci/run"]
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


def parse_dockerfile(path: Path) -> tuple[dict[str, str], list[dict]]:
    """Global ARG defaults, and the stages: {from, name, args, instrs}."""
    text = re.sub(r"\\\n", " ", path.read_text())
    global_args: dict[str, str] = {}
    stages: list[dict] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        op, _, rest = line.partition(" ")
        op = op.upper()
        rest = re.sub(r"\s+", " ", rest.strip())
        if op == "FROM":
            m = re.fullmatch(r"(\S+)(?: AS (\S+))?", rest, re.IGNORECASE)
            assert m, f"FROM line: {line}"
            stages.append({"from": m[1], "name": m[2], "args": [], "instrs": []})
        elif op == "ARG" and not stages:
            name, _, default = rest.partition("=")
            global_args[name] = default
        elif stages:
            if op == "ARG":
                stages[-1]["args"].append(rest.partition("=")[0])
            stages[-1]["instrs"].append((op, rest))
        else:
            pytest.fail(f"{path}: {op} before the first FROM")
    return global_args, stages


def expand(s: str, env: dict[str, str]) -> str:
    for _ in range(4):  # defaults may refer to earlier ARGs
        s = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: env.get(m[1] or m[2], m[0]), s)
    return s


def anchors_engines() -> list[str]:
    return sorted(p.name for p in (REPO / "anchors").iterdir() if p.is_dir())


@pytest.fixture(scope="module")
def dockerfile():
    return parse_dockerfile(REPO / "docker/Dockerfile")


def test_two_stages_builder_then_serving(dockerfile):
    args, stages = dockerfile
    assert [s["name"] for s in stages] == ["builder", "serving"]
    assert stages[0]["from"] == "debian:bookworm"
    assert stages[1]["from"] == "${SERVING_IMAGE}"
    engine = f"{args['ENGINE']}-{args['ENGINE_VERSION']}"
    assert engine in anchors_engines(), (
        "ENGINE/ENGINE_VERSION defaults name an anchors folder"
    )
    assert expand(args["SERVING_IMAGE"], args) == (
        f"vllm/vllm-openai:v{args['ENGINE_VERSION']}"
    )
    for stage in stages:  # every ${X} a stage uses is declared in it
        for op, rest in stage["instrs"]:
            for name in re.findall(r"\$\{(\w+)\}", rest):
                assert name in stage["args"], f"{op} {rest}: ARG {name} not declared"


def _runs(stage) -> list[str]:
    return [rest for op, rest in stage["instrs"] if op == "RUN"]


def test_builder_uses_setup_sh_package_list(dockerfile):
    _, (builder, _) = dockerfile
    runs = _runs(builder)
    assert runs[0] == "docker/build-tools.sh install-packages"
    assert runs[1].startswith("docker/build-tools.sh build ")
    # build-tools.sh's list is setup.sh's list, read from there.
    listed = subprocess.run(
        [str(REPO / "docker/build-tools.sh"), "packages"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    m = re.search(
        r"^APT_PACKAGES=\((.*?)\)",
        (REPO / "scripts/setup.sh").read_text(),
        re.DOTALL | re.MULTILINE,
    )
    assert m and listed == m[1].split()


def test_serving_stage_copies_under_one_prefix_and_bakes(dockerfile):
    args, (_, serving) = dockerfile
    env = dict(args)
    prefix = args["PREFIX"]
    copies = [rest.split() for op, rest in serving["instrs"] if op == "COPY"]
    dests = {}
    for words in copies:
        src, dst = [expand(w, env) for w in words[-2:]]
        assert dst.startswith(prefix + "/"), f"COPY outside {prefix}: {words}"
        if words[0].startswith("--from="):
            assert words[0] == "--from=builder"
            continue
        assert (REPO / src).exists(), f"COPY source missing in the repo: {src}"
        dests[dst.rstrip("/")] = src.rstrip("/")
    assert any(w[0] == "--from=builder" for w in copies)
    engine = f"{args['ENGINE']}-{args['ENGINE_VERSION']}"
    assert dests[f"{prefix}/anchors/{engine}"] == f"anchors/{engine}"
    assert dests[f"{prefix}/overlays"] == "overlays"
    assert dests[f"{prefix}/docker"] == "docker"

    (bake,) = [expand(r, env) for r in _runs(serving)]
    words = bake.split()
    script = words[0]
    # The image runs the very bake.sh CI runs: it is the copy of docker/.
    rel = Path(script).relative_to(prefix)
    assert dests[f"{prefix}/{rel.parent}"] == "docker" and rel.name == "bake.sh"
    assert words[1:] == [
        "--prefix",
        f'"{prefix}"',
        "--engine",
        f'"{engine}"',
        "--python",
        "python3",
    ]
    # And the last instruction: nothing after the bake can undo it.
    assert serving["instrs"][-1] == ("RUN", re.sub(r"\s+", " ", _runs(serving)[0]))


def test_dockerignore_keeps_what_the_build_copies():
    ignore = (REPO / "docker/Dockerfile.dockerignore").read_text().split()
    needed = [
        "CMakeLists.txt",
        "patcher",
        "format",
        "kvstore",
        "anchors",
        "overlays",
        "docker",
        "scripts/setup.sh",
    ]
    for pattern in ignore:
        if pattern.startswith("#"):
            continue
        for path in needed:
            for pat in {pattern, pattern.removeprefix("**/")}:
                assert not fnmatch.fnmatch(path, pat), (pattern, path)
