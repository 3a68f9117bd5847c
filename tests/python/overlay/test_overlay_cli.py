"""overlay's command-line conventions (issue 19), shared with kvstore:
usage on a bare call, suggestions, an unknown option reported before a missing
ROOT, ROOT given either way, a nonexistent ROOT named, subcommand help with
every global option, -q/-v, one JSON shape with schema_version (errors too),
and --version with the artifacts' build id."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from conftest import REPO_ROOT as REPO


def ov(overlay_bin, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(overlay_bin), *args], capture_output=True, text=True, check=False
    )


def test_plain_overlay_prints_usage(overlay_bin):
    r = ov(overlay_bin)
    assert r.returncode == 2 and "Usage: overlay" in r.stderr and "status" in r.stderr


def test_suggestions_and_unknown_option_first(overlay_bin):
    r = ov(overlay_bin, "stauts")
    assert (
        r.returncode == 2
        and "unknown command 'stauts'; did you mean 'status'?" in r.stderr
    )
    r = ov(overlay_bin, "check", "--expcet", "applied")  # no ROOT either
    assert (
        r.returncode == 2
        and "unknown option '--expcet' for 'check'; did you mean '--expect'?"
        in r.stderr
    )


def test_root_positional_or_option_and_missing_paths(
    overlay_bin, engine_tree, tmp_path
):
    a = ov(overlay_bin, "check", str(engine_tree), "--expect", "pristine")
    b = ov(overlay_bin, "check", "--root", str(engine_tree), "--expect", "pristine")
    assert a.returncode == b.returncode == 0 and a.stdout == b.stdout
    r = ov(overlay_bin, "check", "--root", str(engine_tree), str(tmp_path))
    assert r.returncode == 2 and "ROOT given twice" in r.stderr
    r = ov(overlay_bin, "status")
    assert r.returncode == 2 and "ROOT is required" in r.stderr
    r = ov(overlay_bin, "status", str(tmp_path / "missing"))
    assert r.returncode == 2 and f"{tmp_path / 'missing'}: does not exist" in r.stderr


def test_subcommand_help_lists_every_global_option(overlay_bin):
    r = ov(overlay_bin, "check", "--help")
    assert r.returncode == 0
    for opt in (
        "--expect",
        "--root",
        "--json",
        "--overlays",
        "--check-injected",
        "--python",
        "-q,--quiet",
        "-v,--verbose",
    ):
        assert opt in r.stdout, opt


def test_quiet_and_verbose(overlay_bin, engine_tree):
    r = ov(overlay_bin, "check", str(engine_tree), "--expect", "pristine", "-q")
    assert r.returncode == 0 and r.stdout == ""
    r = ov(overlay_bin, "check", str(engine_tree), "--expect", "pristine", "-v")
    assert (
        r.returncode == 0
        and r.stdout.startswith("ok: pristine")
        and "overlay kv-offload-scope: pristine" in r.stdout
    )


def test_one_json_shape_with_schema_version(overlay_bin, engine_tree, tmp_path):
    for cmd in (["status"], ["plan"], ["check", "--expect", "pristine"]):
        r = ov(overlay_bin, *cmd, str(engine_tree), "--json")
        doc = json.loads(r.stdout)
        assert (
            doc["schema_version"] == 1
            and doc["tool"] == "overlay"
            and doc["exit_code"] == r.returncode == 0
        )
        assert doc["ok"] is True and "state" in doc and "overlays" in doc["state"], cmd
        assert doc["command"] == cmd[0]
    r = ov(overlay_bin, "status", str(tmp_path / "missing"), "--json")
    doc = json.loads(r.stdout)
    assert (
        r.returncode == 2
        and doc["ok"] is False
        and doc["exit_code"] == 2
        and doc["schema_version"] == 1
    )
    assert doc["error"]["kind"] == "usage"


def test_version_is_the_build_id_of_the_artifacts(overlay_bin):
    r = ov(overlay_bin, "--version")
    first, *engines = r.stdout.splitlines()
    assert (
        r.returncode == 0
        and first == f"overlay {(REPO / 'VERSION').read_text().strip()}"
    )
    script = subprocess.run(
        [str(REPO / "docker/bake.sh"), "--version"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert engines == script.stdout.splitlines()[1:]


def test_an_overlay_not_in_the_tree_is_called_absent(overlay_bin, tree_copy):
    """The C++ overlay on the wheel's Python-only tree: neither 'already
    applied' nor 'already pristine', and check says so beside its ok."""
    args = ["--root", str(tree_copy)]
    assert ov(overlay_bin, "apply", *args, "-q").returncode == 0
    again = ov(overlay_bin, "apply", *args)
    assert again.returncode == 0, again.stderr
    assert "vllm-fs-durable: absent:" in again.stdout
    assert "vllm-fs-durable: already" not in again.stdout
    check = ov(overlay_bin, "check", *args)
    assert (
        check.returncode == 0
        and "  vllm-fs-durable: absent, not checked (" in check.stdout
    )
    # Issue 48: the ok line names what it checked, never the absent overlay.
    assert "vllm-fs-durable" not in check.stdout.splitlines()[0], check.stdout
    doc = json.loads(ov(overlay_bin, "apply", *args, "--json").stdout)
    assert doc["absent"] == ["vllm-fs-durable"]
    assert "vllm-fs-durable" not in doc["skipped"]
    back = ov(overlay_bin, "revert", *args)
    assert back.returncode == 0 and "vllm-fs-durable: absent:" in back.stdout


# ------------------------------------------- issue 48: an operator's first hour


def _tree_of_release(tmp_path: Path, version: str) -> Path:
    tree = tmp_path / f"site-{version}"
    (tree / "vllm").mkdir(parents=True)
    info = tree / f"vllm-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
    )
    return tree


def _supported() -> list[str]:
    return sorted(
        (d.name.removeprefix("vllm-") for d in (REPO / "anchors").glob("vllm-*")),
        key=lambda v: [int(x) for x in v.split(".")],
    )


def test_an_unsupported_release_is_drift_with_the_next_step(overlay_bin, tmp_path):
    """Before: `no manifests for vllm X`, a usage error. Now: drift (exit 3),
    the supported releases, what to install, and the way to remove what an
    earlier release's overlays left."""
    tree = _tree_of_release(tmp_path, "99.0.0")
    r = ov(overlay_bin, "status", str(tree))
    assert r.returncode == 3, r.stderr
    assert (
        f"holds vllm 99.0.0, which this kvtier does not support "
        f"(it supports vllm {', '.join(_supported())})" in r.stderr
    )
    assert (
        f"next: install a supported release (pip install vllm=={_supported()[-1]})"
        in (r.stderr)
    )
    assert "overlay revert --new-files-only --engine-version OLD" in r.stderr
    named = ov(overlay_bin, "status", str(tree), "--engine-version", "99.0.0")
    assert named.returncode == 2 and "this kvtier supports vllm" in named.stderr


def test_the_same_error_has_the_same_json_message_in_both_tools(
    overlay_bin, kvstore_bin, tmp_path
):
    missing = str(tmp_path / "missing")
    a = json.loads(ov(overlay_bin, "status", missing, "--json").stdout)
    b = json.loads(
        subprocess.run(
            [str(kvstore_bin), "verify", missing, "--json"],
            capture_output=True, text=True, check=False,
        ).stdout
    )  # fmt: skip
    assert (
        a["error"]["message"] == b["error"]["message"] == f"{missing}: does not exist"
    )
    assert a["error"]["kind"] == b["error"]["kind"] == "usage"


def test_command_help_lists_the_global_options_before_the_exit_codes(overlay_bin):
    r = ov(overlay_bin, "apply", "--help")
    assert r.returncode == 0
    head = r.stdout.split("\nExit codes")[0]
    for opt in (
        "--check-injected",
        "--python",
        "--rebuild-binaries",
        "--root",
        "--json",
    ):
        assert opt in head, opt


def test_version_lists_only_releases_that_ship(overlay_bin):
    lines = ov(overlay_bin, "--version").stdout.splitlines()[1:]
    assert lines and all(ln.startswith("vllm-") for ln in lines), lines


def test_status_says_the_way_out_of_a_tampered_tree(overlay_bin, tree_copy):
    args = ["--root", str(tree_copy)]
    assert ov(overlay_bin, "apply", *args, "-q").returncode == 0
    status = json.loads(ov(overlay_bin, "status", *args, "--json").stdout)
    new = next(
        f for f in status["state"]["files"] if f["new_file"] and f["state"] == "present"
    )
    path = tree_copy / new["path"]
    path.write_text(path.read_text() + "# edited by hand\n")
    r = ov(overlay_bin, "status", *args)
    assert r.returncode == 0  # status reports; check is the verdict
    assert "tampered" in r.stdout
    assert "next: a file the overlay owns was edited; put it back" in r.stdout
    assert "overlay revert --new-files-only" in r.stdout
    assert ov(overlay_bin, "check", *args).returncode == 4
