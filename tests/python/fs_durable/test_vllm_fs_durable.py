"""Overlay vllm-fs-durable (C++) on the pinned vLLM 0.33.0 sources and wheel.

Source tree (csrc/ from the sdist): apply --check-injected, check, revert to
the pinned bytes; compile errors in injected code, regions the preprocessor
drops, anchors in inactive branches or #define bodies, and drift are refused
with the tree unchanged.

Wheel install (site-packages with vllm/fs_io_C.abi3.so): the engine patches a
pinned copy of the source, rebuilds the extension and replaces it, keeping
the original bytes; the rebuilt extension is loaded and observed (strace and
an LD_PRELOAD shim) to fdatasync each block before its rename and fsync the
folder after it, and store/load round-trips bytes. vLLM's unpatched source,
built the same way, is observed NOT to sync, so the observation can fail. A binary that differs from
its pin is never replaced; revert restores the original bytes; a kill at any
write step converges.

Exit codes (docs/OVERLAYS.md): 0 ok, 2 manifest/bad input, 3 drift,
4 tampered/stale/half-applied, 5 compile failure.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT, fetch_tree
from cxx_support import copy_tree, fetch, pin_dirs_with, pins, scope_tool

OVERLAY = "vllm-fs-durable"
SO = "vllm/fs_io_C.abi3.so"
PIN_DIRS = [
    d
    for d in pin_dirs_with("BUILT")
    if (REPO_ROOT / "anchors" / d.name / f"{OVERLAY}.toml").is_file()
]

pytestmark = pytest.mark.skipif(
    not PIN_DIRS, reason=f"no pin set with BUILT and an {OVERLAY} manifest"
)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def snapshot(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): sha(p)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module", params=PIN_DIRS, ids=[d.name for d in PIN_DIRS])
def pin_set(request) -> Path:
    return request.param


@pytest.fixture(scope="module")
def sources(pin_set) -> Path:
    return fetch(pin_set, "sources")


@pytest.fixture(scope="module")
def built(pin_set) -> Path:
    return fetch(pin_set, "built")


@pytest.fixture
def source_tree(sources, tmp_path) -> Path:
    return copy_tree(sources, tmp_path / "src")


@pytest.fixture
def wheel_tree(pin_set, built, tmp_path) -> Path:
    """site-packages: the pinned Python files plus the wheel's fs_io_C extension."""
    tree = copy_tree(fetch_tree(pin_set), tmp_path / "site-packages")
    shutil.copy2(built / SO, tree / SO)
    return tree


class Overlay:
    def __init__(
        self, bin_: Path, root: Path, manifests: Path, sources: Path | None = None
    ):
        self.bin, self.root, self.manifests, self.sources = (
            bin_,
            root,
            manifests,
            sources,
        )

    def __call__(
        self, *args: str, env: dict | None = None
    ) -> subprocess.CompletedProcess:
        cmd = [str(self.bin), *args, "--root", str(self.root), "--manifests", str(self.manifests),
               "--fragments", str(REPO_ROOT / "overlays")]  # fmt: skip
        if args[0] in ("apply", "plan") and self.sources:
            cmd += ["--sources", str(self.sources)]
        if (
            args[0] in ("status", "plan", "apply", "check", "revert")
            and "--overlays" not in args
        ):
            cmd += ["--overlays", OVERLAY]
        return subprocess.run(
            cmd, capture_output=True, text=True, env={**os.environ, **(env or {})}
        )


@pytest.fixture
def tool(build_dir, overlay_bin) -> Path:
    scope_tool(build_dir)  # skips when the Clang tool is not built
    return overlay_bin


@pytest.fixture
def manifests(pin_set) -> Path:
    return REPO_ROOT / "anchors" / pin_set.name


# --- source tree -----------------------------------------------------------


def test_source_tree_apply_check_revert(tool, manifests, source_tree, sources, pin_set):
    ov = Overlay(tool, source_tree, manifests)
    before = snapshot(source_tree)
    done = ov("apply", "--check-injected")
    assert done.returncode == 0, done.stderr
    text = (source_tree / "csrc/fs_io.cpp").read_text()
    assert "// >>> overlay vllm-fs-durable/sync-data" in text
    assert "kvtier_fs_durable::sync_parent_dir(dest_path)" in text
    assert (source_tree / "csrc/kvtier_fs_durable.h").is_file()
    assert ov("check").returncode == 0
    assert ov("apply").returncode == 0  # idempotent
    done = ov("revert")
    assert done.returncode == 0, done.stderr
    assert snapshot(source_tree) == before
    for rel, digest in pins(pin_set / "SOURCES").items():
        assert sha(source_tree / rel) == digest, rel
    assert ov("check", "--expect", "pristine").returncode == 0


def _manifest_copy(
    manifests: Path, tmp_path: Path, edit=None, fragment: tuple[str, str] | None = None
):
    """A manifest folder holding only this overlay, optionally edited, and a
    fragments folder (a copy, so a fragment can be broken)."""
    mdir = tmp_path / "anchors"
    mdir.mkdir()
    text = (manifests / f"{OVERLAY}.toml").read_text()
    if edit:
        text = edit(text)
    (mdir / f"{OVERLAY}.toml").write_text(text)
    frags = tmp_path / "overlays"
    shutil.copytree(REPO_ROOT / "overlays" / OVERLAY, frags / OVERLAY)
    if fragment:
        (frags / OVERLAY / fragment[0]).write_text(fragment[1])
    return mdir, frags


def _run(tool, root, mdir, frags, *args, sources=None):
    cmd = [
        str(tool),
        *args,
        "--root",
        str(root),
        "--manifests",
        str(mdir),
        "--fragments",
        str(frags),
    ]
    if sources:
        cmd += ["--sources", str(sources)]
    return subprocess.run(cmd, capture_output=True, text=True)


def test_compile_error_in_injected_code_fails_with_tree_unchanged(
    tool, manifests, source_tree, tmp_path
):
    broken = "if (const int err = kvtier_fs_durable::sync_data(fd); err != 0 {\n  return err;\n}\n"
    mdir, frags = _manifest_copy(
        manifests, tmp_path, fragment=("store_sync_data.inc", broken)
    )
    before = snapshot(source_tree)
    done = _run(tool, source_tree, mdir, frags, "apply", "--check-injected")
    assert done.returncode == 5, done.stderr
    assert "in region vllm-fs-durable/sync-data" in done.stderr
    assert snapshot(source_tree) == before
    # Without the check the same overlay applies: the check is what refused it.
    assert _run(tool, source_tree, mdir, frags, "apply").returncode == 0


def test_region_the_preprocessor_drops_fails_closed(
    tool, manifests, source_tree, tmp_path
):
    dead = "#if 0\nif (const int err = kvtier_fs_durable::sync_data(fd); err != 0) {\n  return err;\n}\n#endif\n"
    mdir, frags = _manifest_copy(
        manifests, tmp_path, fragment=("store_sync_data.inc", dead)
    )
    before = snapshot(source_tree)
    done = _run(tool, source_tree, mdir, frags, "apply", "--check-injected")
    assert done.returncode == 5, done.stderr
    assert (
        "dropped by the preprocessor" in done.stderr
        or "never be compiled" in done.stderr
    )
    assert snapshot(source_tree) == before


def test_a_relative_root_plans_like_an_absolute_one(tool, manifests, source_tree):
    """The Clang tool runs elsewhere: a relative --root used to reach it as
    is, so every C/C++ anchor was "found 0 times" (drift, exit 3)."""
    cmd = [str(tool), "plan", "--root", source_tree.name, "--manifests", str(manifests),
           "--fragments", str(REPO_ROOT / "overlays"), "--overlays", OVERLAY]  # fmt: skip
    relative = subprocess.run(
        cmd, capture_output=True, text=True, cwd=source_tree.parent
    )
    absolute = Overlay(tool, source_tree, manifests)("plan")
    assert relative.returncode == absolute.returncode == 0, relative.stderr
    assert relative.stdout == absolute.stdout and "sync-data" in relative.stdout


def test_drift_in_cxx_file_reports_nearest(tool, manifests, source_tree):
    path = source_tree / "csrc/fs_io.cpp"
    path.write_text(
        path.read_text().replace("  if (close(fd) != 0) {", "  if (::close(fd) != 0) {")
    )
    before = snapshot(source_tree)
    done = Overlay(tool, source_tree, manifests)("apply")
    assert done.returncode == 3, done.stderr
    assert "sync-data" in done.stderr and "nearest lines" in done.stderr
    assert (
        "+  if (::close(fd) != 0) {" in done.stderr
    )  # the unified diff to the best candidate
    assert snapshot(source_tree) == before


def test_scope_not_found_names_candidates(tool, manifests, source_tree, tmp_path):
    mdir, frags = _manifest_copy(
        manifests,
        tmp_path,
        edit=lambda t: t.replace(
            'scope = "fn _store_block"', 'scope = "fn _store_blok"', 1
        ),
    )
    done = _run(tool, source_tree, mdir, frags, "plan")
    assert done.returncode == 3, done.stderr
    assert '"fn _store_blok" found 0 times' in done.stderr
    assert "_store_block" in done.stderr  # among the nearest definitions


SWAP_MANIFEST = """\
format = 1
overlay = "cuda-probe"
engine = "vllm"
engine_version = "0.33.0"

[[files]]
path = "csrc/cache_kernels.cu"
sha256 = "{sha}"
compile_flags = {flags}

  [[files.edits]]
  id = "probe"
  scope = "fn swap_blocks_batch"
  anchor = '''{anchor}'''
  action = "insert_before"
  fragment = "probe.inc"
"""


def _probe(tool, source_tree, tmp_path, anchor: str, flags: list[str], name: str):
    mdir = tmp_path / f"anchors-{name}"
    mdir.mkdir()
    frags = tmp_path / f"overlays-{name}"
    (frags / "cuda-probe").mkdir(parents=True)
    (frags / "cuda-probe" / "probe.inc").write_text("(void)0;\n")
    digest = sha(source_tree / "csrc/cache_kernels.cu")
    (mdir / "cuda-probe.toml").write_text(
        SWAP_MANIFEST.format(sha=digest, flags=json.dumps(flags), anchor=anchor)
    )
    return _run(tool, source_tree, mdir, frags, "plan")


def test_anchor_in_inactive_branch_is_refused_unless_flags_make_it_live(
    tool, source_tree, tmp_path
):
    lines = (source_tree / "csrc/cache_kernels.cu").read_text().splitlines()
    call = next(
        line for line in lines if 'cuGetProcAddress("cuMemcpyBatchAsync"' in line
    )
    base = ["-std=c++17", "-Icsrc"]
    done = _probe(tool, source_tree, tmp_path, call, base, "off")
    assert done.returncode == 2, done.stderr
    assert "inactive" in done.stderr
    live = _probe(
        tool, source_tree, tmp_path, call, base + ["-DCUDA_VERSION=13000"], "on"
    )
    assert live.returncode == 0, live.stderr


def test_anchor_in_macro_continuation_is_refused(tool, source_tree, tmp_path):
    text = (source_tree / "csrc/cache_kernels.cu").read_text()
    # A line inside a multi-line #define (it ends with a backslash).
    m = re.search(r"^#define \w+\(.*\\\n(.*\\)$", text, re.M)
    assert m, "cache_kernels.cu has multi-line macros"
    body_line = m.group(1)
    assert text.count(body_line + "\n") == 1
    mdir = tmp_path / "anchors-macro"
    mdir.mkdir()
    frags = tmp_path / "overlays-macro"
    (frags / "cuda-probe").mkdir(parents=True)
    (frags / "cuda-probe" / "probe.inc").write_text("(void)0;\n")
    manifest = SWAP_MANIFEST.format(
        sha=sha(source_tree / "csrc/cache_kernels.cu"),
        flags='["-std=c++17", "-Icsrc"]',
        anchor=body_line,
    ).replace('  scope = "fn swap_blocks_batch"\n', "")
    (mdir / "cuda-probe.toml").write_text(manifest)
    done = _run(tool, source_tree, mdir, frags, "plan")
    assert done.returncode == 2, done.stderr
    assert "#define" in done.stderr


# --- wheel install ----------------------------------------------------------


def test_wheel_rebuild_replace_and_revert(tool, manifests, wheel_tree, sources, built):
    ov = Overlay(tool, wheel_tree, manifests, sources)
    original = (built / SO).read_bytes()
    before = snapshot(wheel_tree)
    status = ov("status")
    assert status.returncode == 0, status.stderr
    assert "pristine" in status.stdout
    done = ov("apply", "--check-injected")
    assert done.returncode == 0, done.stderr
    new = (wheel_tree / SO).read_bytes()
    assert new != original
    assert (wheel_tree / "vllm/.fs_io_C.abi3.so.overlay-orig").read_bytes() == original
    assert not (
        wheel_tree / "csrc"
    ).exists()  # sources are build inputs, not tree files
    assert ov("check").returncode == 0
    assert ov("apply").returncode == 0  # no-op
    assert (wheel_tree / SO).read_bytes() == new
    done = ov("revert")
    assert done.returncode == 0, done.stderr
    assert (wheel_tree / SO).read_bytes() == original
    assert snapshot(wheel_tree) == before
    assert ov("check", "--expect", "pristine").returncode == 0


def test_a_killed_runs_build_folder_is_removed_by_the_next_build(
    tool, manifests, wheel_tree, sources, tmp_path
):
    """A kill -9 leaves overlay-build.<pid>.* behind; the next build removes
    the ones whose process is gone, and never a live process's."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    dead = tmp / "overlay-build.4194300.AbC123"  # above any pid in use here
    live = tmp / f"overlay-build.{os.getpid()}.XyZ789"
    other = tmp / "overlay-build.notapid"
    for d in (dead, live, other):
        d.mkdir()
        (d / "fs_io.o").write_bytes(b"x")
    done = Overlay(tool, wheel_tree, manifests, sources)(
        "apply", env={"TMPDIR": str(tmp)}
    )
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in tmp.iterdir()) == sorted([live.name, other.name])


def test_wheel_binary_that_differs_from_pin_is_not_replaced(
    tool, manifests, wheel_tree, sources
):
    so = wheel_tree / SO
    data = bytearray(so.read_bytes())
    data[-1] ^= 0xFF
    so.write_bytes(bytes(data))
    before = snapshot(wheel_tree)
    done = Overlay(tool, wheel_tree, manifests, sources)("apply")
    assert done.returncode == 3, done.stderr
    assert "refusing to replace" in done.stderr
    assert snapshot(wheel_tree) == before


def test_wheel_apply_needs_sources(tool, manifests, wheel_tree, tmp_path):
    before = snapshot(wheel_tree)
    # No --sources, and no fetch cache for the default to find.
    done = Overlay(tool, wheel_tree, manifests)(
        "apply", env={"XDG_CACHE_HOME": str(tmp_path / "empty-cache")}
    )
    assert done.returncode == 2, done.stderr
    assert "--sources" in done.stderr
    assert snapshot(wheel_tree) == before


def test_wheel_replaced_binary_is_tampered(tool, manifests, wheel_tree, sources, built):
    ov = Overlay(tool, wheel_tree, manifests, sources)
    assert ov("apply").returncode == 0
    (wheel_tree / SO).write_bytes(b"not the overlay's build")
    assert ov("check").returncode == 4
    done = ov("revert")
    assert done.returncode == 4, done.stderr
    assert (wheel_tree / "vllm/.fs_io_C.abi3.so.overlay-orig").read_bytes() == (
        built / SO
    ).read_bytes()


@pytest.fixture
def faults_bin(build_dir, tool) -> Path:
    """The test-only CLI that honours OVERLAY_FAULT (the shipped one ignores it)."""
    path = build_dir / "patcher" / "overlay-faults"
    if not path.is_file():
        pytest.skip(f"{path} is not built")
    return path


@pytest.mark.parametrize(
    "step", ["temp-write", "temp-fsync", "journal-commit", "rename", "journal-remove"]
)
@pytest.mark.parametrize("action", ["apply", "revert"])
def test_wheel_crash_at_each_step_converges(
    tool, faults_bin, manifests, wheel_tree, sources, built, step, action
):
    ov = Overlay(tool, wheel_tree, manifests, sources)
    original = (built / SO).read_bytes()
    if action == "revert":
        assert ov("apply").returncode == 0
    crashed = Overlay(faults_bin, wheel_tree, manifests, sources)(
        action, env={"OVERLAY_FAULT": step}
    )
    assert crashed.returncode == 99, crashed.stderr
    st = ov("status")
    assert st.returncode == 0, st.stderr
    # Whatever the step, finishing either way converges.
    done = ov(action)
    assert done.returncode == 0, done.stderr
    expect = "applied" if action == "apply" else "pristine"
    assert ov("check", "--expect", expect).returncode == 0
    assert ov("revert").returncode == 0
    assert (wheel_tree / SO).read_bytes() == original


# --- the rebuilt extension, observed ------------------------------------------


def _drive(so: Path, folder: Path, prefix: list[str], env: dict | None = None) -> dict:
    done = subprocess.run(
        [
            *prefix,
            sys.executable,
            str(Path(__file__).parent / "fs_io_driver.py"),
            str(so),
            str(folder),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["round_trip"] is True
    return result


def _order_ok(events: list[tuple[str, str, str]], tmp: str, dest: str) -> bool:
    """fdatasync(tmp) < rename(tmp, dest) < fsync(dest's folder)."""
    try:
        sync = next(
            i for i, e in enumerate(events) if e[0] == "fdatasync" and e[1] == tmp
        )
        ren = next(
            i
            for i, e in enumerate(events)
            if e[0] == "rename" and e[1] == tmp and e[2] == dest
        )
        dsync = next(
            i
            for i, e in enumerate(events)
            if e[0] == "fsync" and e[1] == os.path.dirname(dest)
        )
    except StopIteration:
        return False
    return sync < ren < dsync


def _strace_events(log: Path) -> list[tuple[str, str, str]]:
    events = []
    for line in log.read_text().splitlines():
        m = re.search(r"(fdatasync|fsync)\(\d+<([^>]*)>\) = 0", line)
        if m:
            events.append((m.group(1), m.group(2), ""))
        m = re.search(
            r'rename(?:at2?)?\((?:AT_FDCWD[^,]*, )?"([^"]*)", (?:AT_FDCWD[^,]*, )?"([^"]*)"',
            line,
        )
        if m:
            events.append(("rename", m.group(1), m.group(2)))
    return events


@pytest.fixture
def unpatched(sources, tmp_path) -> Path:
    """vLLM's own fs_io.cpp, unpatched, built the way the overlay builds it:
    the control. (The wheel's binary links libtorch, so it cannot load here.)"""
    import sysconfig

    out = tmp_path / "control-build" / "fs_io_C.abi3.so"
    out.parent.mkdir()
    subprocess.run(
        ["c++", "-O2", "-std=c++17", "-shared", "-fPIC", "-DPy_LIMITED_API=0x030B0000",
         f"-I{sysconfig.get_paths()['include']}", str(sources / "csrc/fs_io.cpp"), "-o", str(out)],
        check=True,
    )  # fmt: skip
    return out


@pytest.fixture
def rebuilt(tool, manifests, wheel_tree, sources) -> Path:
    done = Overlay(tool, wheel_tree, manifests, sources)("apply", "--check-injected")
    assert done.returncode == 0, done.stderr
    return wheel_tree / SO


def test_rebuilt_extension_syncs_before_rename_strace(rebuilt, unpatched, tmp_path):
    if not shutil.which("strace"):
        pytest.skip("strace is not installed (scripts/setup.sh installs it)")
    probe = subprocess.run(
        ["strace", "-o", "/dev/null", "true"], capture_output=True, text=True
    )
    if probe.returncode != 0:
        pytest.skip(
            f"strace cannot trace here: {probe.stderr.strip()} (the LD_PRELOAD test still runs)"
        )
    trace = [
        "strace",
        "-f",
        "-y",
        "-e",
        "trace=fdatasync,fsync,rename,renameat,renameat2",
    ]
    for name, so in (("patched", rebuilt), ("unpatched", unpatched)):
        folder = tmp_path / name
        folder.mkdir()
        log = tmp_path / f"{name}.strace"
        result = _drive(so, folder, [*trace, "-o", str(log)])
        events = _strace_events(log)
        ordered = [
            _order_ok(events, t, d)
            for t, d in zip(result["tmp"], result["dest"], strict=True)
        ]
        if name == "patched":
            assert all(ordered), events
        else:
            assert not any(ordered), events  # vLLM's own code never syncs
            assert not any(e[0] == "fdatasync" for e in events)


def test_rebuilt_extension_syncs_before_rename_preload(rebuilt, unpatched, tmp_path):
    if not shutil.which("cc"):
        pytest.skip("no C compiler")
    shim = tmp_path / "fs_sync_shim.so"
    subprocess.run(
        [
            "cc",
            "-shared",
            "-fPIC",
            "-O1",
            "-o",
            str(shim),
            str(Path(__file__).parent / "fs_sync_shim.c"),
            "-ldl",
        ],
        check=True,
    )
    for name, so in (("patched", rebuilt), ("unpatched", unpatched)):
        folder = tmp_path / name
        folder.mkdir()
        log = tmp_path / f"{name}.log"
        result = _drive(
            so, folder, [], env={"LD_PRELOAD": str(shim), "FS_SYNC_LOG": str(log)}
        )
        events = []
        if log.exists():
            for line in log.read_text().splitlines():
                call, a, b = line.split(" ", 2)
                events.append((call, a, "" if b == "-" else b))
        ordered = [
            _order_ok(events, t, d)
            for t, d in zip(result["tmp"], result["dest"], strict=True)
        ]
        if name == "patched":
            assert all(ordered), events
        else:
            assert not any(ordered), events


# --- manifest errors of the C/C++ keys ------------------------------------------------


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda t: t.replace(
                'scope = "fn _store_block"', 'scope = "def _store_block"', 1
            ),
            "C/C++ scope",
        ),
        (
            lambda t: t.replace(
                'sources = ["csrc/fs_io.cpp"]', 'sources = ["csrc/other.cpp"]'
            ),
            "is not a C/C++ [[files]]",
        ),
        (
            lambda t: t.replace("must_compile = true", 'must_compile = "yes"'),
            "must_compile",
        ),
        (
            lambda t: t.replace('path = "csrc/fs_io.cpp"', 'path = "csrc/fs_io.py"', 1),
            "is for C/C++ targets",
        ),
        (
            lambda t: t.replace('"-o", "{output}"]', '"-o", "{output}", 3]'),
            "array of strings",
        ),
    ],
    ids=[
        "python-scope-on-cpp",
        "built-source-unknown",
        "must-compile-type",
        "flags-on-python",
        "build-not-strings",
    ],
)
def test_bad_cxx_manifest_is_refused(
    tool, manifests, source_tree, tmp_path, change, message
):
    mdir, frags = _manifest_copy(manifests, tmp_path, edit=change)
    before = snapshot(source_tree)
    done = _run(tool, source_tree, mdir, frags, "apply")
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and f"{OVERLAY}.toml" in done.stderr
    assert snapshot(source_tree) == before
