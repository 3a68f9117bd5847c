"""Every overlay in ORDER (that has a manifest) on a copy of the REAL pinned tree,
through the `overlay` CLI: anchors match, apply -> check -> revert round trip,
idempotence, and the drift refusal. The patched files are then loaded by the
harness, so the injected code is executed, not only compiled.

Exit codes are the engine's documented contract (docs/OVERLAYS.md):
0 ok, 1 not in the expected state, 2 usage/manifest, 3 drift,
4 tampered/half-applied, 5 compile, 6 I/O, 7 busy (a lock, or a target another
process changed while apply wrote).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import time
import tomllib
from pathlib import Path

import harness
import pytest
from conftest import PIN_DIRS, REPO_ROOT, fetch_tree

EXIT_OK = 0
EXIT_DRIFT = 3


def _order(pin_dir: Path) -> list[str]:
    path = REPO_ROOT / "anchors" / pin_dir.name / "ORDER"
    if not path.is_file():
        return []
    lines = (line.strip() for line in path.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def _manifest_path(pin_dir: Path, overlay: str) -> Path:
    return REPO_ROOT / "anchors" / pin_dir.name / f"{overlay}.toml"


def _python_only(pin_dir: Path, overlay: str) -> bool:
    """C/C++ overlays (sources from the sdist, [[built_files]]) have their own
    real-tree test: tests/python/fs_durable/test_vllm_fs_durable.py."""
    return "built_files" not in tomllib.loads(
        _manifest_path(pin_dir, overlay).read_text()
    )


def pytest_generate_tests(metafunc):
    if "overlay" in metafunc.fixturenames:
        params = [
            pytest.param(d, name, id=f"{d.name}:{name}")
            for d in PIN_DIRS
            for name in _order(d)
            if _manifest_path(d, name).is_file() and _python_only(d, name)
        ]
        metafunc.parametrize(("overlay_pins", "overlay"), params)


class Case:
    """One overlay on a private copy of the pinned tree."""

    def __init__(self, overlay_bin: Path, pin_dir: Path, overlay: str, tmp: Path):
        self.bin = overlay_bin
        self.pin_dir = pin_dir
        self.overlay = overlay
        self.manifests = REPO_ROOT / "anchors" / pin_dir.name
        self.manifest = tomllib.loads(_manifest_path(pin_dir, overlay).read_text())
        self.engine = harness.split_pin_dir(pin_dir)[0]
        self.pins = {p.path: p.sha256 for p in harness.read_pins(pin_dir / "PINS")}
        if (pin_dir / "INTERFACE").is_file():  # fetched into the tree too
            self.pins |= {
                p.path: p.sha256 for p in harness.read_pins(pin_dir / "INTERFACE")
            }
        order = _order(pin_dir)
        # Apply what the order puts before it, then it: stacked overlays anchor
        # inside earlier overlays' regions.
        present = [n for n in order if _manifest_path(pin_dir, n).is_file()]
        self.stack = present[: present.index(overlay) + 1]
        if present != order:
            # The engine refuses an ORDER naming an overlay whose manifest has not
            # landed yet; test the landed ones with an ORDER of just those.
            self.manifests = tmp / "manifests" / pin_dir.name
            self.manifests.mkdir(parents=True)
            for name in present:
                shutil.copy(_manifest_path(pin_dir, name), self.manifests)
            (self.manifests / "ORDER").write_text("".join(f"{n}\n" for n in present))
        self.root = tmp / "site-packages"
        shutil.copytree(
            fetch_tree(pin_dir), self.root, ignore=shutil.ignore_patterns("__pycache__")
        )

    def run(self, command: str, overlays: list[str] | None = None):
        args = [
            str(self.bin), command,
            "--root", str(self.root),
            "--manifests", str(self.manifests),
            "--fragments", str(REPO_ROOT / "overlays"),
            "--overlays", ",".join(overlays or self.stack),
        ]  # fmt: skip
        done = subprocess.run(args, capture_output=True, text=True, timeout=120)
        done.output = done.stdout + done.stderr
        return done

    def expect(self, command: str, code: int, overlays: list[str] | None = None):
        done = self.run(command, overlays)
        assert done.returncode == code, (
            f"overlay {command} {','.join(overlays or self.stack)}: exit"
            f" {done.returncode}, expected {code}\n{done.output}"
        )
        return done

    def snapshot(self) -> dict[str, tuple[bytes, int]]:
        """Every file's bytes and mtime: 'wrote nothing' means this is unchanged."""
        return {
            p.relative_to(self.root).as_posix(): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(self.root.rglob("*"))
            if p.is_file()
        }

    def tree_hashes(self) -> dict[str, str]:
        return {
            p.relative_to(self.root).as_posix(): hashlib.sha256(
                p.read_bytes()
            ).hexdigest()
            for p in self.root.rglob("*")
            if p.is_file()
        }


@pytest.fixture
def case(overlay_bin, overlay_pins, overlay, tmp_path) -> Case:
    return Case(overlay_bin, overlay_pins, overlay, tmp_path)


def test_manifest_targets_are_pinned(overlay_pins, overlay):
    """Each file the overlay touches is pinned, with the manifest's pristine sha256:
    in PINS, or in INTERFACE where the sim's harness cannot run it (vllm/config/vllm.py,
    which needs most of vLLM; the real-vLLM tier runs its hook)."""
    manifest = tomllib.loads(_manifest_path(overlay_pins, overlay).read_text())
    pins = {
        p.path: p.sha256
        for name in ("PINS", "INTERFACE")
        if (overlay_pins / name).is_file()
        for p in harness.read_pins(overlay_pins / name)
    }
    for target in manifest.get("files", []):
        assert target["path"] in pins, f"{target['path']} is not in PINS"
        assert target["sha256"] == pins[target["path"]], target["path"]


def test_anchors_match_pinned_tree(case):
    before = case.snapshot()
    case.expect("plan", EXIT_OK)
    assert case.snapshot() == before, "plan wrote to the tree"


def test_apply_check_revert_round_trip(case):
    case.expect("apply", EXIT_OK)
    case.expect("check", EXIT_OK)

    targets = [f["path"] for f in case.manifest.get("files", [])]
    new_files = [f["path"] for f in case.manifest.get("new_files", [])]
    hashes = case.tree_hashes()
    changed = [t for t in targets if hashes[t] != case.pins[t]]
    applies_edits = any(
        "superseded_by" not in e
        for f in case.manifest.get("files", [])
        for e in f.get("edits", [])
    )
    assert changed or not applies_edits, "apply exited 0 but changed no target"
    for path in new_files:
        assert (case.root / path).is_file(), f"new file {path} missing after apply"

    # The patched code runs: every patched file and new module loads for real,
    # but a file pinned in INTERFACE, which the harness never runs (it needs most
    # of vLLM: vllm/config/vllm.py); tests/realsched runs its hook on the real one.
    listed = case.pin_dir / "INTERFACE"
    interface = (
        {p.path for p in harness.read_pins(listed)} if listed.is_file() else set()
    )
    with harness.engine(case.root, package=case.engine) as ns:
        for path in targets + new_files:
            module = harness.module_name(path)
            if module and path not in interface:
                mod = ns.load(module)
                assert Path(mod.__file__) == case.root / path

    for name in reversed(case.stack):
        case.expect("revert", EXIT_OK, [name])
    assert case.tree_hashes() == case.pins, "revert did not restore the pinned bytes"


def test_second_apply_writes_nothing(case):
    case.expect("apply", EXIT_OK)
    after_first = case.snapshot()
    case.expect("apply", EXIT_OK)
    assert case.snapshot() == after_first, "second apply changed bytes or mtimes"
    case.expect("check", EXIT_OK)


def _drift_target(case: Case) -> tuple[str, str, str] | None:
    """(file, edit id, anchor's first line) of an edit anchored in pristine text."""
    for target in case.manifest.get("files", []):
        text = (case.root / target["path"]).read_text()
        lines = text.splitlines()
        for edit in target.get("edits", []):
            anchor = edit.get("anchor")
            if not anchor or "superseded_by" in edit:
                continue
            first = anchor.splitlines()[0]
            if first.strip() and first in lines:
                return target["path"], edit["id"], first
    return None


def test_drift_is_refused_without_writing(case):
    found = _drift_target(case)
    if found is None:
        pytest.skip(f"{case.overlay}: no edit anchored in pristine text to drift")
    path, edit_id, first = found
    target = case.root / path
    drifted = first + "  # drifted upstream"
    lines = target.read_text().split("\n")
    target.write_text("\n".join(drifted if line == first else line for line in lines))
    before = case.snapshot()

    done = case.expect("apply", EXIT_DRIFT)

    assert case.snapshot() == before, "apply wrote despite drift"
    assert edit_id in done.output and first.strip() in done.output, (
        f"drift report does not name the anchor ({edit_id}):\n{done.output}"
    )
    assert "# drifted upstream" in done.output, (
        f"drift report does not show the changed line:\n{done.output}"
    )


# Issue 37 on the real tree, through the test-only `overlay-faults` binary
# (docs/OVERLAYS.md, "Test-only fault hook"): the three Python overlays of
# every pinned release (pin_dir), a kill or a pause at one step, and a file
# edited meanwhile.
EXIT_TAMPERED = 4
EXIT_BUSY = 7
EXIT_KILLED = 99
PYTHON_OVERLAYS = ["kv-offload-scope", "kv-offload-store-local", "kv-offload-restore"]
CONNECTOR = "vllm/distributed/kv_transfer/kv_connector/v1/offloading_connector.py"
WORKER = "vllm/distributed/kv_transfer/kv_connector/v1/offloading/worker.py"
CONFIG = "vllm/distributed/kv_transfer/kv_connector/v1/offloading/config.py"
JOURNAL = ".overlay-journal"


class Faults:
    """The three Python overlays on a private copy of one pinned release's tree."""

    def __init__(self, build_dir: Path, tmp: Path, pin_dir: Path):
        self.bin = build_dir / "patcher" / "overlay-faults"
        if not self.bin.is_file():
            pytest.skip(f"{self.bin} is not built (set KVTIER_BUILD_DIR or build it)")
        self.engine = pin_dir.name
        self.root = tmp / "site-packages"
        shutil.copytree(
            fetch_tree(pin_dir),
            self.root,
            ignore=shutil.ignore_patterns("__pycache__"),
        )

    def args(self, *command: str) -> list[str]:
        return [
            str(self.bin), *command,
            "--root", str(self.root),
            "--manifests", str(REPO_ROOT / "anchors" / self.engine),
            "--fragments", str(REPO_ROOT / "overlays"),
            "--overlays", ",".join(PYTHON_OVERLAYS),
        ]  # fmt: skip

    def run(self, *command: str, fault: str = "") -> subprocess.CompletedProcess:
        env = {**os.environ, "OVERLAY_FAULT": fault}
        return subprocess.run(
            self.args(*command), capture_output=True, text=True, env=env, timeout=300
        )

    def hashes(self) -> dict[str, str]:
        return {
            p.relative_to(self.root).as_posix(): hashlib.sha256(
                p.read_bytes()
            ).hexdigest()
            for p in self.root.rglob("*")
            if p.is_file()
        }


def test_discard_after_a_hand_edit_refuses_naming_the_file(
    build_dir, tmp_path, pin_dir
):
    """Killed with only the journal left, one target edited: recover --discard
    deleted the new modules and left config, scheduler and worker importing
    them (exit 0). All or nothing: it refuses, names the file, changes nothing."""
    t = Faults(build_dir, tmp_path, pin_dir)
    done = t.run("apply", fault="journal-remove:1")
    assert done.returncode == EXIT_KILLED, done.stderr
    with (t.root / CONNECTOR).open("a") as f:
        f.write("# a hand edit\n")
    before = t.hashes()

    done = t.run("recover", "--discard")

    assert done.returncode == EXIT_TAMPERED, done.stdout + done.stderr
    assert CONNECTOR in done.stderr and "half-applied" in done.stderr, done.stderr
    assert t.hashes() == before, "a refused discard changed the tree"


@pytest.mark.parametrize("step", ["rename:1", "rename:3"])
def test_an_edit_by_another_process_during_apply_is_kept(
    build_dir, tmp_path, step, pin_dir
):
    """Paused after the commit point, a line appended to worker.py vanished and
    apply said "applied". Now the file is re-checked right before its rename:
    apply exits 7 (busy), rolls back (at rename:3 config.py and scheduler.py
    are already patched), and the edit is kept."""
    t = Faults(build_dir, tmp_path, pin_dir)
    pristine = t.hashes()
    env = {**os.environ, "OVERLAY_FAULT": f"pause@{step}"}
    proc = subprocess.Popen(
        t.args("apply"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    try:
        stat = Path(f"/proc/{proc.pid}/stat")
        deadline = time.monotonic() + 120
        # Stopped (T) at the first rename: the journal is committed.
        while stat.read_text().rsplit(")", 1)[1].split()[0] != "T":
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "apply never reached the pause"
            time.sleep(0.05)
        assert (t.root / JOURNAL).is_file()
        config_patched = t.hashes()[CONFIG] != pristine[CONFIG]
        assert config_patched == (step == "rename:3"), "not the change order assumed"
        with (t.root / WORKER).open("a") as f:
            f.write("# appended by another process\n")
        edited = hashlib.sha256((t.root / WORKER).read_bytes()).hexdigest()
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    out, err = proc.communicate(timeout=300)

    assert proc.returncode == EXIT_BUSY, (out + err).decode()
    assert WORKER in err.decode() and "changed by another process" in err.decode()
    assert (t.root / WORKER).read_bytes().endswith(b"# appended by another process\n")
    want = {**pristine, WORKER: edited}
    assert t.hashes() == want, "rolled back to anything but pristine plus the edit"


SCHEDULER = "vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py"
BUDGET = (
    "vllm/distributed/kv_transfer/kv_connector/v1/offloading/kv_store_local/budget.py"
)


def _saved(rel: str) -> str:
    folder, name = rel.rsplit("/", 1)
    return f"{folder}/.{name}.overlay-old"


def _pause(t: Faults, command: str, step: str) -> subprocess.Popen:
    """`overlay <command>` stopped (SIGSTOP) at ``step``, after its commit."""
    env = {**os.environ, "OVERLAY_FAULT": f"pause@{step}"}
    proc = subprocess.Popen(
        t.args(command), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    stat = Path(f"/proc/{proc.pid}/stat")
    deadline = time.monotonic() + 120
    while stat.read_text().rsplit(")", 1)[1].split()[0] != "T":
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{command} never reached {step}"
        time.sleep(0.05)
    return proc


@pytest.mark.parametrize(
    "fault, target",
    [
        ("unlink-saved:1", SCHEDULER),
        ("unlink-saved:1", CONFIG),
        ("unlink-saved:1", BUDGET),  # a module the transaction created
        ("rename:3", CONFIG),
    ],
)
def test_discard_after_an_edit_to_a_file_holding_its_new_bytes_refuses(
    build_dir, tmp_path, pin_dir, fault, target
):
    """Issue 45, 7: interrupted after ``target`` got its new bytes, then
    ``target`` edited: recover --discard said "kept", deleted the new
    modules under a file still importing them and removed the only saved
    copy of the old bytes. It refuses (exit 4) naming the file, changes
    nothing, keeps the saved old bytes; once the edit is undone it rolls
    the transaction back whole."""
    t = Faults(build_dir, tmp_path, pin_dir)
    pristine = t.hashes()
    done = t.run("apply", fault=fault)
    assert done.returncode == EXIT_KILLED, done.stderr
    applied = t.hashes()
    assert applied[target] != pristine.get(target), "not holding its new bytes"
    text = (t.root / target).read_bytes()
    (t.root / target).write_bytes(text + b"# appended by hand\n")
    before = t.hashes()

    done = t.run("recover", "--discard")

    assert done.returncode == EXIT_TAMPERED, done.stdout + done.stderr
    assert f"{target}: edited after the interrupted transaction" in done.stderr
    assert "nothing was changed" in done.stderr, done.stderr
    assert t.hashes() == before, "a refused discard changed the tree"
    if target != BUDGET:
        assert _saved(target) in before, "the saved old bytes are gone"
    for command in ("apply", "revert"):
        assert t.run(command).returncode == EXIT_TAMPERED
        assert t.hashes() == before
    # The way out the message gives: undo the edit, discard again.
    (t.root / target).write_bytes(text)
    done = t.run("recover", "--discard")
    assert done.returncode == 0, done.stdout + done.stderr
    assert t.hashes() == pristine


def test_an_apply_rolling_back_after_edits_names_every_edited_file(
    build_dir, tmp_path, pin_dir
):
    """Issue 45, 8: paused at the third rename (config.py and scheduler.py
    already patched), config.py and worker.py edited by another process: apply
    named worker.py only (exit 7), and its rollback left config.py, kept as
    edited, importing modules it deleted. The rollback refuses instead: every
    edited file named, nothing rolled back, no module deleted, the journal
    kept; undoing the edit to config.py lets `recover --discard` finish it."""
    t = Faults(build_dir, tmp_path, pin_dir)
    pristine = t.hashes()
    proc = _pause(t, "apply", "rename:3")
    try:
        assert t.hashes()[CONFIG] != pristine[CONFIG]
        config = (t.root / CONFIG).read_bytes()
        for rel in (CONFIG, WORKER):
            with (t.root / rel).open("a") as f:
                f.write("# appended by another process\n")
        edited = t.hashes()
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    out, err = proc.communicate(timeout=300)
    err = err.decode()

    assert proc.returncode == EXIT_TAMPERED, out.decode() + err
    assert f"{WORKER}: changed by another process" in err, err
    assert f"{CONFIG}: edited after the interrupted transaction" in err, err
    assert t.hashes() == edited, "the refused rollback changed the tree"
    assert (t.root / JOURNAL).is_file()
    (t.root / CONFIG).write_bytes(config)
    done = t.run("recover", "--discard")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"kept {WORKER}" in done.stdout, done.stdout
    want = {**pristine, WORKER: edited[WORKER]}
    assert t.hashes() == want
