"""The pre-stop gate: every refusal exits 2 before any docker or ssh call.

Runs docker/launch-example.sh (gate -> plan -> compare -> ssh/docker per rank)
with recording stubs for docker and ssh on PATH, so "nothing was stopped" is
an observed fact, not a claim. The overlay CLI is a stub (docker_support);
bake.sh against the real CLI and pinned tree is in test_docker_bake.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from docker_support import ENGINE_DIR, baked_rig

GOOD = {
    "GLM53_KV_OFFLOAD": "1",
    "GLM53_KV_OFFLOAD_DIR": "/data/glm53-kv-offload",
    "GLM53_KV_OFFLOAD_CPU_GB": "8",
}

# Every invalid value of every knob.
INVALID = (
    [
        ("GLM53_KV_OFFLOAD", v)
        for v in ["", "2", "01", "true", "yes", "-1", " 1", "1 ", "1\n", "on"]
    ]
    + [
        ("GLM53_KV_OFFLOAD_DIR", v)
        for v in [
            "",
            "relative/dir",
            "./x",
            "~/kv",
            "/",
            "//",
            "/data/with space",
            "/data/tab\there",
            "/data/new\nline",
            "/data/'quoted'",
            '/data/"quoted"',
            "/data/back`tick`",
            "/data:/etc",
            "/data,ro",
            "/data/../etc",
            "/data/./kv",
            "/data/$HOME",
            "/data/é",
        ]
    ]
    + [
        ("GLM53_KV_OFFLOAD_CPU_GB", v)
        for v in [
            "",
            "0",
            "65",
            "-1",
            "08",
            "1.5",
            "4GB",
            "abc",
            " 4",
            "4 ",
            "+4",
            "1e1",
            "99999999999999999999",
        ]
    ]
    + [("GLM53_KV_OFFLOAD_RESTORE", v) for v in ["1", "2", "", "yes", "00", "true"]]
    + [("GLM53_KV_OFFLOAD_DRAFTER", v) for v in ["", "2", "true", "01", "-0"]]
    + [
        ("GLM53_KV_OFFLOAD_KEEP_BOUNDARIES", v)
        for v in ["", "-1", "1025", "2.0", "02", "x", " 2", "100000"]
    ]
    + [
        ("GLM53_KV_OFFLOAD_BUILD_ID", v)
        for v in [
            "",
            "has space",
            "a/b",
            "-lead",
            ".hidden",
            "x" * 65,
            "a;b",
            "a$b",
            "ä",
        ]
    ]
)


@pytest.fixture
def rig(tmp_path):
    r = baked_rig(tmp_path)
    r.set_state("applied")
    return r


def launch(rig, knobs, *serve):
    """The example launcher on two stub hosts; returns the completed process."""
    argv = serve or ("vllm", "serve", "org/model", "--tensor-parallel-size", "2")
    return rig.run(
        "launch-example.sh",
        "--hosts",
        "h0,h1",
        "--image",
        "img:tag",
        "--tree",
        str(rig.tree),
        "--prefix",
        str(rig.prefix),
        "--",
        *argv,
        **knobs,
    )


def assert_refused(rig, res, needle):
    assert res.returncode == 2, (res.returncode, res.stderr)
    assert needle in res.stderr, res.stderr
    assert rig.calls() == [], "docker/ssh called after a refusal"


@pytest.mark.parametrize(
    "name,value", INVALID, ids=[f"{n[17:] or 'KNOB'}={v!r}" for n, v in INVALID]
)
def test_invalid_knob_refused_before_any_call(rig, name, value):
    knobs = dict(GOOD, **{name: value})
    res = launch(rig, knobs)
    assert_refused(rig, res, name)
    # The gate alone says the same, and never reached the overlay CLI.
    res = rig.gate(**knobs)
    assert res.returncode == 2 and name in res.stderr
    assert rig.overlay_calls() == []


@pytest.mark.parametrize("missing", ["GLM53_KV_OFFLOAD_DIR", "GLM53_KV_OFFLOAD_CPU_GB"])
def test_knob_1_requires_dir_and_cpu_gb(rig, missing):
    knobs = {k: v for k, v in GOOD.items() if k != missing}
    assert_refused(rig, launch(rig, knobs), f"{missing} is required")


def test_unknown_knob_name_refused(rig):
    assert_refused(
        rig,
        launch(rig, dict(GOOD, GLM53_KV_OFFLOAD_CPUGB="8")),
        "unknown knob GLM53_KV_OFFLOAD_CPUGB",
    )


def test_restore_1_refused_with_reason(rig):
    res = launch(rig, dict(GOOD, GLM53_KV_OFFLOAD_RESTORE="1"))
    assert_refused(rig, res, "GLM53_KV_OFFLOAD_RESTORE=1 is refused")
    # ... also with the tier off: the rule is about the stage, not the knob.
    res = launch(rig, {"GLM53_KV_OFFLOAD_RESTORE": "1"})
    assert_refused(rig, res, "RESTORE=1 is refused")


@pytest.mark.parametrize(
    "knobs",
    [
        {},
        {"GLM53_KV_OFFLOAD": "0"},
        {"GLM53_KV_OFFLOAD": "0", "GLM53_KV_OFFLOAD_RESTORE": "0"},
        dict(GOOD, GLM53_KV_OFFLOAD_CPU_GB="1"),
        dict(GOOD, GLM53_KV_OFFLOAD_CPU_GB="64"),
        dict(GOOD, GLM53_KV_OFFLOAD_KEEP_BOUNDARIES="0"),
        dict(GOOD, GLM53_KV_OFFLOAD_KEEP_BOUNDARIES="1024"),
        dict(GOOD, GLM53_KV_OFFLOAD_DRAFTER="1", GLM53_KV_OFFLOAD_RESTORE="0"),
        dict(GOOD, GLM53_KV_OFFLOAD_BUILD_ID="recipe-3f2a9c1.b_7"),
        dict(GOOD, GLM53_KV_OFFLOAD_DIR="/mnt/nvme0/kv@node_1+x"),
    ],
)
def test_valid_knobs_pass(rig, knobs):
    res = rig.gate(**knobs)
    assert res.returncode == 0, res.stderr
    assert "gate: ok" in res.stderr


# ------------------------------------------------------------------ artifacts


def _truncate(p: Path) -> None:
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])


def _swap_order(rig) -> None:
    order = rig.anchors / "ORDER"
    order.write_text("".join(reversed(order.read_text().splitlines(keepends=True))))


def _repoint_manifest(rig) -> None:
    # The scope manifest now claims to be the store-local overlay.
    m = rig.anchors / "kv-offload-scope.toml"
    m.write_text(
        m.read_text().replace(
            'overlay = "kv-offload-scope"', 'overlay = "kv-offload-store-local"'
        )
    )


def _repoint_symlink(rig) -> None:
    # A fragment replaced by a link to the other overlay's file (same bytes
    # would not be needed to fool a name check; the gate refuses links).
    f = rig.prefix / "overlays/kv-offload-scope/kv_offload_scope.py"
    f.unlink()
    os.symlink(rig.prefix / "overlays/kv-offload-store-local/kv_store_local.py", f)


def _other_version(rig) -> None:
    m = rig.anchors / "kv-offload-store-local.toml"
    m.write_text(
        m.read_text().replace('engine_version = "9.9.9"', 'engine_version = "9.9.8"')
    )


def _drop_list_tail(rig) -> None:
    lines = rig.artifacts.read_text().splitlines(keepends=True)
    rig.artifacts.write_text("".join(lines[:-1]))


def _list_garbage(rig) -> None:
    rig.artifacts.write_text(rig.artifacts.read_text() + "not a checksum line\n")


def _extra_file(rig) -> None:
    (rig.prefix / "overlays/kv-offload-store-local/stray.py").write_text("x = 1\n")


def _order_names_unknown(rig) -> None:
    (rig.anchors / "ORDER").write_text("kv-offload-scope\nkv-offload-other\n")


def _fragment_reference_dangles(rig) -> None:
    (rig.prefix / "overlays/kv-offload-scope/config_eligible.py").unlink()


def _edit_same_size(rig) -> None:
    f = rig.prefix / "overlays/kv-offload-store-local/kv_store_format.py"
    f.write_text(f.read_text().replace("KVT1", "KVT2"))


ARTIFACT_BREAKS = {
    "manifest-missing": (
        lambda r: (r.anchors / "kv-offload-store-local.toml").unlink(),
        "kv-offload-store-local.toml: missing",
    ),
    "order-missing": (lambda r: (r.anchors / "ORDER").unlink(), "ORDER: missing"),
    "overlay-folder-missing": (
        lambda r: __import__("shutil").rmtree(r.prefix / "overlays/kv-offload-scope"),
        "overlays/kv-offload-scope: missing",
    ),
    "fragment-missing": (_fragment_reference_dangles, "references config_eligible.py"),
    "fragment-truncated": (
        lambda r: _truncate(
            r.prefix / "overlays/kv-offload-store-local/kv_store_local.py"
        ),
        "kv_store_local.py: FAILED",
    ),
    "manifest-truncated": (
        lambda r: _truncate(r.anchors / "kv-offload-scope.toml"),
        "kv-offload-scope.toml",
    ),
    "module-edited": (_edit_same_size, "kv_store_format.py: FAILED"),
    "list-missing": (lambda r: r.artifacts.unlink(), "ARTIFACTS.sha256: missing"),
    "list-truncated": (_drop_list_tail, "not in the baked artifact list"),
    "list-garbage": (_list_garbage, "malformed"),
    "extra-file": (_extra_file, "stray.py: not in the baked artifact list"),
    "order-swapped": (_swap_order, "another overlay order"),
    "order-unknown-overlay": (_order_names_unknown, "kv-offload-other.toml: missing"),
    "manifest-repointed": (_repoint_manifest, "but ORDER names kv-offload-scope"),
    "fragment-symlinked": (_repoint_symlink, "missing"),
    "engine-version-mismatch": (_other_version, 'engine_version is not "9.9.9"'),
}


@pytest.mark.parametrize("knob", ["0", "1"])
@pytest.mark.parametrize("case", sorted(ARTIFACT_BREAKS))
def test_broken_artifact_refused_before_any_call(rig, case, knob):
    breaker, needle = ARTIFACT_BREAKS[case]
    breaker(rig)
    knobs = GOOD if knob == "1" else {"GLM53_KV_OFFLOAD": "0"}
    res = launch(rig, knobs)
    assert_refused(rig, res, needle)
    assert rig.overlay_calls() == [], "the tree is checked only after the artifacts"


def test_symlinked_overlay_file_refused(rig):
    # A link that is not referenced by a manifest is still an artifact.
    os.symlink("/etc/hostname", rig.prefix / "overlays/kv-offload-scope/extra.py")
    res = launch(rig, GOOD)
    assert_refused(rig, res, "symlinks are not allowed")
    assert len(res.stderr.splitlines()) == 1, res.stderr  # refused at once


def test_engine_is_taken_from_the_anchors_folder(rig):
    assert rig.anchors.name == ENGINE_DIR
    res = rig.run(
        "gate.sh",
        "--prefix",
        str(rig.prefix),
        "--root",
        str(rig.tree),
        "--engine",
        "vllm-9.9.8",
    )
    assert res.returncode == 2 and "anchors/vllm-9.9.8/ORDER: missing" in res.stderr


# ---------------------------------------------------------------- tree state


@pytest.mark.parametrize(
    "state,knob,ok",
    [
        ("applied", "1", True),
        ("pristine", "1", False),
        ("drift", "1", False),
        ("tampered", "1", False),
        ("applied", "0", True),
        ("pristine", "0", True),
        ("drift", "0", False),
        ("tampered", "0", False),
    ],
)
def test_tree_state_must_fit_the_knob(rig, state, knob, ok):
    rig.set_state(state)
    knobs = GOOD if knob == "1" else {}
    res = launch(rig, knobs)
    if ok:
        assert res.returncode == 0, res.stderr
        assert rig.calls()
    else:
        assert_refused(rig, res, "gate:")


def test_knob_1_compiles_injected_sources(rig):
    (rig.tree / ".fake-bad-inject").write_text("")
    assert_refused(rig, launch(rig, GOOD), "injected source does not compile")
    assert any("--check-injected" in c for c in rig.overlay_calls())
    # With the knob at 0 the injected code never runs; no compile check.
    rig.stub_log.unlink()
    assert launch(rig, {}).returncode == 0
    assert not any("--check-injected" in c for c in rig.overlay_calls())


# ---------------------------------------------------------------- happy path


def _ssh_commands(rig) -> list[tuple[str, str]]:
    return [(c[1], c[2]) for c in rig.calls() if c[0] == "ssh"]


def test_knob_1_wiring(rig):
    res = launch(rig, GOOD)
    assert res.returncode == 0, res.stderr
    cmds = _ssh_commands(rig)
    assert [h for h, _ in cmds] == ["h0"] * 3 + ["h1"] * 3
    for host in ("h0", "h1"):
        stop, mkdir, run = (c for h, c in cmds if h == host)
        assert stop.startswith("docker rm -f")
        assert mkdir == "mkdir -p /data/glm53-kv-offload"
        assert "-v /data/glm53-kv-offload:/data/glm53-kv-offload:rw" in run
        assert "--kv-transfer-config" in run
        assert "GLM53_KV_OFFLOAD=1" in run
    runs = [c for _, c in cmds if c.startswith("docker run")]
    # The same command but for the rank arguments of a 2-node TP pair.
    tail = "--nnodes 2 --master-addr h0 --master-port 29501 --node-rank "
    assert runs[0].endswith(tail + "0 ") and runs[1].endswith(tail + "1 --headless ")
    assert runs[0].removesuffix(tail + "0 ") == runs[1].removesuffix(
        tail + "1 --headless "
    )
    assert "expandable_segments" not in res.stderr  # no alloc conf given


def test_knob_0_wiring_adds_nothing(rig):
    res = launch(rig, {"GLM53_KV_OFFLOAD": "0"})
    assert res.returncode == 0, res.stderr
    cmds = _ssh_commands(rig)
    assert len(cmds) == 4
    assert not any(c.startswith("mkdir") for _, c in cmds)
    run = next(c for _, c in cmds if c.startswith("docker run"))
    assert run.endswith(
        "img:tag vllm serve org/model --tensor-parallel-size 2"
        " --nnodes 2 --master-addr h0 --master-port 29501 --node-rank 0 "
    )
    assert " -v " not in run and " -e " not in run
    assert "GLM53" not in run and "kv-transfer" not in run


def test_example_passes_the_image_python_to_the_gate(rig):
    res = rig.run(
        "launch-example.sh",
        "--hosts", "h0",
        "--image", "img:tag",
        "--tree", str(rig.tree),
        "--prefix", str(rig.prefix),
        "--python", "/opt/py/bin/python3.12",
        "--",
        "org/model",
        **GOOD,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    (check,) = [c for c in rig.overlay_calls() if "--check-injected" in c]
    assert check.endswith("--python /opt/py/bin/python3.12")


# ------------------------------------------------- the gate inside the image

# An ssh stand-in that records like the others and, for the gate's
# `docker run`, exits with $GATE_RC (the image's gate refusing or not).
SSH_GATE = r"""#!/usr/bin/env bash
{ printf '%s' ssh; printf '\t%s' "$@"; printf '\n'; } >>"$CALL_LOG"
case $2 in *gate.sh*) exit "${GATE_RC:-0}" ;; esac
exit 0
"""


def launch_in_image(rig, knobs, gate_rc=0):
    from docker_support import write_exec

    write_exec(rig.stubs / "ssh", SSH_GATE)
    return rig.run(
        "launch-example.sh",
        "--hosts", "h0,h1",
        "--image", "img@sha256:" + "a" * 64,
        "--prefix", str(rig.prefix),
        "--",
        "org/model", "--tensor-parallel-size", "2",
        GATE_RC=str(gate_rc),
        **knobs,
    )  # fmt: skip


def test_gate_runs_inside_the_image_on_every_host_first(rig):
    res = launch_in_image(rig, GOOD)
    assert res.returncode == 0, res.stderr
    cmds = _ssh_commands(rig)
    gates = [(h, c) for h, c in cmds if "gate.sh" in c]
    assert [h for h, _ in gates] == ["h0", "h1"]
    assert cmds[:2] == gates, "the gates run before anything is stopped"
    for _, c in gates:
        assert c.startswith(
            "docker run --rm --network none --entrypoint /opt/kvtier/share/kvtier/docker/gate.sh "
        )
        assert (
            "-e GLM53_KV_OFFLOAD=1 " in c
            and "-e GLM53_KV_OFFLOAD_DIR=/data/glm53-kv-offload " in c
        )
        assert c.endswith(" --prefix /opt/kvtier --python python3 ")
    # The local tree was never consulted: no overlay call on this machine.
    assert rig.overlay_calls() == []


def test_a_refusing_image_gate_stops_before_any_restart(rig):
    res = launch_in_image(rig, GOOD, gate_rc=2)
    assert res.returncode == 2 and "h0: the gate inside" in res.stderr, res.stderr
    assert [c for _, c in _ssh_commands(rig) if "gate.sh" not in c] == []


def test_bad_knob_refused_locally_before_any_ssh(rig):
    res = launch_in_image(rig, dict(GOOD, GLM53_KV_OFFLOAD_CPU_GB="0"))
    assert res.returncode == 2 and "GLM53_KV_OFFLOAD_CPU_GB" in res.stderr
    assert rig.calls() == []
