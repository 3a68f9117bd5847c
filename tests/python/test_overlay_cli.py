"""overlay's command-line conventions (issue 19), shared with kvstore:
usage on a bare call, suggestions, an unknown option reported before a missing
ROOT, ROOT given either way, a nonexistent ROOT named, subcommand help with
every global option, -q/-v, one JSON shape with schema_version (errors too),
and --version with the artifacts' build id."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


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
