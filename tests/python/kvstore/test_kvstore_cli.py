"""kvstore's command-line conventions (issue 19), on real stores: metrics
that promtool accepts with every series present, last success carried over a
failed run, `--prometheus -`, JSON documents with schema_version and JSON
errors, 'no store here', suggestions, ROOT given either way, -q/-v, and
--version with the build id docker/lib.sh computes."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from conftest import REPO_ROOT as REPO
from kvstore_support import FULL_GROUP, Store, age_tree, flip_bit, key_of, run

FORK = (["a"], ["a", "b"], ["a", "b", "c"], ["a", "d"])
RUN_SERIES = (
    "kvstore_last_run_timestamp_seconds",
    "kvstore_last_run_duration_seconds",
    "kvstore_last_exit_code",
    "kvstore_last_success_timestamp_seconds",
)
SERIES = {
    "verify": ("kvstore_verify_chunks", "kvstore_verify_bytes", "kvstore_verify_problems", "kvstore_verify_damage"),
    "gc": ("kvstore_gc_planned_files", "kvstore_gc_freed_bytes", "kvstore_gc_deleted_files", "kvstore_gc_refused_ranks"),
    "stat": ("kvstore_store_chunks", "kvstore_store_bytes", "kvstore_store_manifests", "kvstore_store_ranks"),
}  # fmt: skip


@pytest.fixture
def kv(kvstore_bin):
    return lambda *args: run(kvstore_bin, *args)


@pytest.fixture
def store(tmp_path) -> Store:
    s = Store(tmp_path / "tier")
    for names in FORK:
        s.boundary(names)
    age_tree(s.tier)
    return s


def promtool_ok(text: str, tmp_path: Path) -> None:
    if shutil.which("promtool") is None:
        pytest.fail(
            "promtool is not installed (scripts/setup.sh installs Debian's prometheus)"
        )
    done = subprocess.run(
        ["promtool", "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def value(text: str, series: str) -> float:
    m = re.search(rf"^{re.escape(series)} (\S+)$", text, re.MULTILINE)
    assert m, f"{series} missing from:\n{text}"
    return float(m[1])


@pytest.mark.parametrize("command", ["verify", "gc", "stat"])
def test_metrics_pass_promtool_and_carry_every_series(kv, store, tmp_path, command):
    prom = tmp_path / f"{command}.prom"
    before = time.time()
    r = kv(command, "-q", "--prometheus", str(prom), str(store.tier))
    assert r.code == 0, r.err
    text = prom.read_text()
    promtool_ok(text, tmp_path)
    for name in SERIES[command]:
        assert re.search(rf"^{name} ", text, re.MULTILINE), name
    for name in RUN_SERIES:
        value(text, f'{name}{{command="{command}"}}')
    assert value(text, f'kvstore_last_exit_code{{command="{command}"}}') == 0
    assert (
        before - 1
        <= value(text, f'kvstore_last_success_timestamp_seconds{{command="{command}"}}')
        <= time.time() + 1
    )


def test_empty_store_emits_every_series_as_zero(kv, tmp_path):
    """A store with its rank folder and record but nothing written yet."""
    tier = Store(tmp_path / "empty").tier
    age_tree(tier)
    for command in ("verify", "gc", "stat"):
        r = kv(command, "--prometheus", "-", str(tier))
        assert r.code == 0, r.err
        promtool_ok(r.out, tmp_path)
        for name in SERIES[command]:
            if name.startswith(("kvstore_verify_ranks", "kvstore_store_ranks")):
                assert value(r.out, name) == 1, name
            else:
                assert value(r.out, name) == 0, name


def test_an_empty_folder_is_no_store_not_no_problems(kv, tmp_path):
    """Issue 48: an unmounted disk (the store folder empty) said "0 rank(s)
    ... no problems", exit 0. It is exit 8 for every command, the metrics
    say so, and the last success stays where it was (0: never)."""
    empty = tmp_path / "mnt"
    empty.mkdir()
    for command in ("verify", "gc", "stat", "gc --sweep"):
        r = kv(*command.split(), "--prometheus", "-", str(empty))
        assert r.code == 8, (command, r.err)
        assert "no store here (empty: the store's disk not mounted" in r.err
        assert "no problems" not in r.out + r.err
        name = command.split()[0]
        assert value(r.out, f'kvstore_last_exit_code{{command="{name}"}}') == 8
        assert (
            value(r.out, f'kvstore_last_success_timestamp_seconds{{command="{name}"}}')
            == 0
        )


def test_verify_metrics_make_corruption_alertable(kv, store, tmp_path):
    prom = tmp_path / "verify.prom"
    assert kv("verify", "--prometheus", str(prom), str(store.tier)).code == 0
    first_success = value(
        prom.read_text(), 'kvstore_last_success_timestamp_seconds{command="verify"}'
    )
    flip_bit(store.tier / store.chunk_rel("b", FULL_GROUP), 200)
    time.sleep(0.01)
    r = kv("verify", "--prometheus", str(prom), str(store.tier))
    assert r.code == 1
    text = prom.read_text()
    promtool_ok(text, tmp_path)
    assert (
        value(text, "kvstore_verify_problems") >= 1
        and value(text, "kvstore_verify_damage") >= 1
    )
    assert value(text, 'kvstore_last_exit_code{command="verify"}') == 1
    # The failed run keeps the last success where it was.
    assert (
        value(text, 'kvstore_last_success_timestamp_seconds{command="verify"}')
        == first_success
    )
    assert (
        value(text, 'kvstore_last_run_timestamp_seconds{command="verify"}')
        > first_success
    )


def test_stat_metrics_are_timestamps_not_ages(kv, store):
    r = kv("stat", "--prometheus", "-", str(store.tier))
    assert r.code == 0, r.err
    newest = re.search(
        r"^kvstore_rank_newest_boundary_timestamp_seconds\{[^}]*\} (\S+)$",
        r.out,
        re.MULTILINE,
    )
    # age_tree backdated the store by an hour.
    assert newest and abs(float(newest[1]) - (time.time() - 3600)) < 120
    assert "age_seconds" not in r.out
    # stdout carries only the metrics; the report went to stderr.
    assert all(ln.startswith(("#", "kvstore_")) for ln in r.out.splitlines())
    assert "rank" in r.err


def test_no_store_here(kv, tmp_path):
    d = tmp_path / "not-a-store"
    (d / "photos").mkdir(parents=True)
    for command in ("verify", "gc", "stat", "gc --sweep"):
        r = kv(*command.split(), str(d))
        assert r.code == 8 and "no store here" in r.err, (command, r.err)
        r = kv(*command.split(), "--json", str(d))
        doc = json.loads(r.out)
        assert (
            doc["error"]["kind"] == "no_store"
            and doc["exit_code"] == 8
            and doc["schema_version"] == 1
        )


def test_json_documents_have_a_schema_version(kv, store):
    for args in (["verify"], ["gc"], ["stat"]):
        r = kv(*args, "--json", str(store.tier))
        doc = json.loads(r.out)
        assert (
            doc["schema_version"] == 1
            and doc["tool"] == "kvstore"
            and doc["command"] == args[0]
        )
        assert doc["ok"] is True and doc["exit_code"] == r.code == 0


def test_json_errors_are_never_empty_stdout(kv, tmp_path):
    for args in (
        ["verify", str(tmp_path / "missing")],
        ["verify", "--jsno", str(tmp_path)],
        ["stat"],
    ):
        r = kv(*args, "--json")
        assert r.code == 2, (args, r.err)
        doc = json.loads(r.out)
        assert (
            doc["ok"] is False
            and doc["error"]["kind"] == "usage"
            and doc["error"]["message"]
        )


def test_unknown_names_get_a_suggestion_before_a_missing_root(kv):
    r = kv("stauts")
    assert r.code == 2 and "unknown command 'stauts'; did you mean 'stat'?" in r.err
    r = kv("verify", "--jsno")  # no ROOT either: the unknown option is what is reported
    assert (
        r.code == 2
        and "unknown option '--jsno' for 'verify'; did you mean '--json'?" in r.err
    )


def test_a_number_option_refuses_nan(kv, store):
    """NaN passed every range check and acted as 0: --grace nan let a sweep
    delete chunks written seconds before."""
    for args in (
        ["gc", "--grace", "nan"],
        ["gc", "--sweep", "--lock-timeout", "nan"],
        ["verify", "--grace", "NaN"],
        ["gc", "--grace", "inf"],
        ["gc", "--grace", "5x"],
    ):
        r = kv(*args, str(store.tier))
        assert r.code == 2 and "not a number" in r.err, (args, r.err)
    assert kv("gc", "--grace", "1.5", str(store.tier)).code == 0
    for args, text in (
        (
            ["gc", "--sweep", "--lock-timeout=-1"],
            "out of range: -1 (0 to 86400 seconds)",
        ),
        (["gc", "--grace", "2e9"], "out of range: 2e9 (0 to 1000000000 seconds)"),
    ):
        r = kv(*args, str(store.tier))
        assert r.code == 2 and text in r.err, (args, r.err)
    for args in (["--keep", "abc"], ["--keep", "0x2"], ["--threads", "two"]):
        r = kv("gc", *args, str(store.tier))
        assert r.code == 2 and "not a whole number" in r.err, (args, r.err)


def test_plain_kvstore_prints_usage(kv):
    r = kv()
    assert r.code == 2 and "Usage: kvstore" in r.err and "verify" in r.err


def test_root_positional_or_option(kv, store, tmp_path):
    a = kv("stat", "--json", str(store.tier))
    b = kv("stat", "--json", "--root", str(store.tier))
    assert a.code == b.code == 0

    def sizes(doc):
        return [
            (r["rank"], r["chunks"], r["bytes"], r["manifests"])
            for r in json.loads(doc)["ranks"]
        ]

    assert sizes(a.out) == sizes(b.out) and sizes(a.out)[0][1] > 0
    r = kv("stat", "--root", str(store.tier), str(tmp_path))
    assert r.code == 2 and "ROOT given twice" in r.err
    r = kv("stat", str(tmp_path / "missing"))
    assert r.code == 2 and "does not exist" in r.err


def test_sweep_prints_a_summary_and_the_files_with_v(kv, store):
    age_tree(store.tier)
    # An orphan chunk past the grace period: garbage.
    store.chunk(key_of("orphan"), FULL_GROUP, 64)
    age_tree(store.tier)
    r = kv("gc", "--sweep", str(store.tier))
    assert r.code == 0, r.err
    assert not re.search(r"^delete ", r.out, re.MULTILINE)
    assert "gc:" in r.out
    store.chunk(key_of("orphan2"), FULL_GROUP, 64)
    age_tree(store.tier)
    r = kv("gc", "--sweep", "-v", str(store.tier))
    assert r.code == 0 and re.search(r"^delete ", r.out, re.MULTILINE), r.out


def test_odd_file_names_are_escaped_and_never_break_a_report(kv, store):
    """Names come from the file system: bytes that are not UTF-8 made every
    --json report fail (after a sweep had deleted), a newline split a line."""
    base = bytes(store.base)
    for name in (b"bad\xffname", b"evil\nline", b"esc\x1b[31m"):
        with open(base + b"/" + name, "wb") as f:
            f.write(b"x")
    store.chunk(key_of("orphan"), FULL_GROUP, 64)
    age_tree(store.tier)
    shown = ("bad\\xffname", "evil\\x0aline", "esc\\x1b[31m")
    r = kv("verify", "--json", str(store.tier))
    assert r.code == 1, r.err
    paths = [f["path"] for f in json.loads(r.out)["findings"]]
    for name in shown:
        assert any(p.endswith("/" + name) for p in paths), (name, paths)
    r = kv("verify", str(store.tier))
    assert r.code == 1 and "\x1b" not in r.out
    assert not any(line.startswith("line") for line in r.out.splitlines())
    for name in shown:
        assert f"/{name}: foreign:" in r.out, r.out
    r = kv("gc", "--sweep", "--json", str(store.tier))
    doc = json.loads(r.out)
    assert doc["sweeps"][0]["deleted"] >= 1, doc
    assert all(
        (store.base / n).exists() for n in ("evil\nline", "esc\x1b[31m")
    )  # foreign: reported, never deleted


def test_quiet_prints_nothing_on_success(kv, store):
    r = kv("verify", "-q", str(store.tier))
    assert r.code == 0 and r.out == "" and r.err == ""


def test_version_is_the_build_id_of_the_artifacts(kv):
    r = kv("--version")
    assert r.code == 0
    first, *engines = r.out.splitlines()
    assert first == f"kvstore {(REPO / 'VERSION').read_text().strip()}"
    script = subprocess.run(
        [str(REPO / "docker/gate.sh"), "--version"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert engines == script.stdout.splitlines()[1:]


# --------------------------------------------------------------------------
# Issue 37: messages and exit codes
# --------------------------------------------------------------------------


def test_negative_keep_says_must_be_at_least_0(kv, store):
    r = kv("gc", "--keep", "-1", str(store.tier))
    assert r.code == 2 and "--keep: must be >= 0: -1" in r.err, r.err
    assert "not a whole number" not in r.err
    r = kv("gc", "--threads", "-2", str(store.tier))
    assert r.code == 2 and "must be >= 1: -2" in r.err, r.err


def test_an_option_of_another_subcommand_is_named_as_such(kv, store):
    r = kv("verify", "--keep", "1", str(store.tier))
    assert r.code == 2
    assert "unknown option '--keep' for 'verify'; it belongs to 'gc'" in r.err, r.err
    assert "did you mean" not in r.err


def test_an_empty_root_is_called_empty(kv):
    for args in (["verify", ""], ["gc", "--root", ""]):
        r = kv(*args)
        assert r.code == 2 and "ROOT is empty" in r.err, (args, r.err)
    r = kv("verify")
    assert r.code == 2 and "ROOT is required" in r.err


def test_a_symlink_root_says_it_is_one(kv, store, tmp_path):
    link = tmp_path / "link"
    link.symlink_to(store.tier)
    for command in ("verify", "gc", "stat"):
        r = kv(command, str(link))
        assert r.code == 6, (command, r.err)
        assert f"{link}: is a symlink; kvstore does not follow links" in r.err, r.err
        assert "Too many levels" not in r.err


def test_a_failed_run_never_says_no_problems(kv, store, tmp_path):
    import fcntl
    import os

    # Exit 7: a writer holds the lock.
    lock = os.open(store.base / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(lock, fcntl.LOCK_SH)
        r = kv("gc", "--sweep", "--lock-timeout", "0.1", str(store.tier))
        assert r.code == 7, r.out + r.err
        assert "no problems" not in r.out, r.out
        assert "a writer held the store lock: not swept (exit 7)" in r.out, r.out
    finally:
        os.close(lock)
    # Exit 6: the textfile cannot be written (after a clean scan).
    prom = str(tmp_path / "no-such-folder" / "x.prom")
    for command in (["verify"], ["gc"], ["gc", "--sweep"]):
        r = kv(*command, "--prometheus", prom, str(store.tier))
        assert r.code == 6, (command, r.out + r.err)
        assert "no problems" not in r.out, (command, r.out)
        assert "I/O error (exit 6)" in r.out, (command, r.out)
    assert kv("verify", str(store.tier)).out.endswith("no problems\n")


def test_a_rank_base_without_its_record_names_folder_and_record(kv, store):
    (store.tier / f"{store.name}.json").unlink()
    r = kv("gc", "--sweep", str(store.base))
    assert r.code == 4, r.out + r.err
    assert (
        f"refused {store.name}: rank folder without its namespace record: "
        f"../{store.name}.json does not exist beside it"
    ) in r.out, r.out
    assert "refused .:" not in r.out


def test_inspect_refuses_every_non_regular_file_alike(kv, store, tmp_path):
    import os

    chunk = next(p for p in store.base.rglob("*.bin"))
    assert kv("inspect", str(chunk)).code == 0
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    link = tmp_path / "link"
    link.symlink_to(chunk)
    folder = tmp_path / "folder"
    folder.mkdir()
    for path, what in (
        (fifo, "is a FIFO, not a regular file"),
        (link, "is a symlink; kvstore does not follow links"),
        (folder, "is a folder, not a regular file"),
    ):
        r = kv("inspect", str(path))
        assert r.code == 6, (path, r.err)
        assert f"{path}: {what}" in r.err, r.err
        r = kv("inspect", "--json", str(path))
        assert r.code == 6 and json.loads(r.out)["error"]["kind"] == "io"
    assert kv("inspect", str(tmp_path / "missing")).code == 2


def test_hex_grace_and_version_with_arguments_are_refused(kv, store):
    for value in ("0x10", " 5", "0X1p4", "1_0"):
        r = kv("gc", "--grace", value, str(store.tier))
        assert r.code == 2 and "not a number" in r.err, (value, r.err)
    for ok in ("600", "1.5", ".5", "2e2"):
        assert kv("gc", "--grace", ok, str(store.tier)).code == 0, ok
    for args in (["--version", "extra"], ["--version", "verify", str(store.tier)]):
        r = kv(*args)
        assert r.code == 2, (args, r.out)
        assert "--version takes no other arguments" in r.err and r.out == ""
    assert kv("--version").code == 0
