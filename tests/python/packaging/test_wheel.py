"""The `kvtier` wheel (pyproject.toml, docs/DEPLOY.md "With pip"): built with
scikit-build-core, repaired by auditwheel, installed into a fresh virtual
environment beside the pinned vLLM, and used from its entry points only.

The environment sees a hard-linked copy of the real-scheduler venv's vLLM
(scripts/real-venv.sh) through a .pth file: the overlay engine replaces files
by rename, so the cached venv is never written (cached_venv_stats
checks every file's inode, size and mtime). Skipped only with KVTIER_REAL=0
or without that venv.
"""

from __future__ import annotations

import filecmp
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from conftest import REPO_ROOT
from kvstore_support import Store, age_tree

VERSION = (REPO_ROOT / "VERSION").read_text().strip()
REAL_VENV = Path(
    os.environ.get(
        "KVTIER_REAL_VENV",
        Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
        / "kvtier/venv-vllm-0.33.0",
    )
)
NOTE = "run `overlay revert` before `pip uninstall kvtier`"

pytestmark = [
    pytest.mark.skipif(
        os.environ.get("KVTIER_REAL") == "0", reason="KVTIER_REAL=0: no real vLLM"
    ),
    pytest.mark.skipif(
        not (REAL_VENV / "bin/python").exists(),
        reason=f"{REAL_VENV}: no real-vLLM venv (scripts/real-venv.sh)",
    ),
]


def _run(*cmd, env=None, check=True) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [str(c) for c in cmd], capture_output=True, text=True, env=env, check=False
    )
    if check and done.returncode != 0:
        pytest.fail(f"{cmd} exit {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return done


PYTHON_OVERLAYS = "kv-offload-scope,kv-offload-store-local,kv-offload-restore"


def _env(**extra: str) -> dict[str, str]:
    """The caller's environment without kvtier's own variables."""
    drop = ("KVTIER_CXXSCOPE", "KVTIER_PIP_ENV", "KVTIER_STORE_LIB")
    return dict({k: v for k, v in os.environ.items() if k not in drop}, **extra)


@pytest.fixture(scope="module")
def cxxscope(build_dir) -> Path:
    """The Clang tool the wheel leaves out, from the source build (setup.sh)."""
    tool = build_dir / "cxxscope/kvtier-cxxscope"
    if not os.access(tool, os.X_OK):
        pytest.fail(f"{tool} is not built (scripts/setup.sh builds it)")
    return tool


def _real_site() -> Path:
    (site,) = (REAL_VENV / "lib").glob("python3*/site-packages")
    return site


@pytest.fixture(scope="module")
def wheel(tmp_path_factory, request) -> Path:
    """Builds and repairs the wheel once; prints how long each step took."""
    out = tmp_path_factory.mktemp("wheel")
    build_dir = Path(
        os.environ.get("KVTIER_WHEEL_BUILD_DIR", REPO_ROOT / "build-wheel")
    )
    args = [f"-Cbuild-dir={build_dir}"]
    if shutil.which("ccache"):
        args += [
            f"-Ccmake.define.CMAKE_{lang}_COMPILER_LAUNCHER=ccache"
            for lang in ("C", "CXX")
        ]
    env = dict(
        os.environ, CCACHE_BASEDIR=os.environ.get("CCACHE_BASEDIR", str(REPO_ROOT))
    )
    start = time.monotonic()
    _run(sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q",
         "-w", out / "dist", REPO_ROOT, *args, env=env)  # fmt: skip
    built = time.monotonic() - start
    (raw,) = (out / "dist").glob("kvtier-*.whl")
    start = time.monotonic()
    _run(sys.executable, "-m", "auditwheel", "repair", "-w", out / "house", raw)
    repaired = time.monotonic() - start
    (whl,) = (out / "house").glob("kvtier-*.whl")
    # Past pytest's capture, so every run (CI's too) prints the build time.
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled():
        print(
            f"\nwheel: built in {built:.1f} s, repaired in {repaired:.1f} s: "
            f"{whl.name} ({whl.stat().st_size // 1024} KiB)",
            flush=True,
        )
    return whl


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A fresh venv (no pip: the test's own pip installs into it)."""
    path = tmp_path_factory.mktemp("venv") / "v"
    _run(sys.executable, "-m", "venv", "--without-pip", path)
    return path


def _pip(venv: Path, *args) -> subprocess.CompletedProcess:
    return _run(sys.executable, "-m", "pip", "--python", venv / "bin/python", *args)


def _purelib(venv: Path) -> Path:
    done = _run(
        venv / "bin/python",
        "-c",
        "import sysconfig; print(sysconfig.get_path('purelib'))",
    )
    return Path(done.stdout.strip())


@pytest.fixture
def installed(wheel, venv) -> Path:
    _pip(venv, "install", "-q", "--no-deps", "--no-index", "--force-reinstall", wheel)
    return venv


def _vllm_copy(dst: Path) -> Path:
    """A site-packages-like folder: vllm/ hard-linked, its dist-info copied."""
    real = _real_site()
    dst.mkdir(parents=True)
    _run("cp", "-al", real / "vllm", dst / "vllm")
    (info,) = real.glob("vllm-*.dist-info")
    shutil.copytree(info, dst / info.name)
    return dst


@pytest.fixture(scope="module")
def pristine_copy(tmp_path_factory) -> Path:
    return _vllm_copy(tmp_path_factory.mktemp("vllm") / "site")


@pytest.fixture
def site(installed, pristine_copy) -> Path:
    """The vLLM copy, on the venv's sys.path through a .pth file; made again
    after a test that left it changed (a copy is 10k hard links)."""
    pth = _purelib(installed) / "vllm_copy_for_test.pth"
    pth.write_text(f"{pristine_copy}\n")
    yield pristine_copy
    pth.unlink(missing_ok=True)
    if _differences(pristine_copy / "vllm", _real_site() / "vllm") or sorted(
        p.name for p in pristine_copy.iterdir()
    ) != ["vllm", "vllm-0.33.0.dist-info"]:
        shutil.rmtree(pristine_copy)
        _vllm_copy(pristine_copy)


def _differences(tree: Path, ref: Path) -> list[str]:
    """Paths that are in one tree only, or whose bytes differ."""

    def entries(root: Path) -> set[str]:
        out = set()
        for d, dirs, files in os.walk(root):
            for n in dirs + files:
                out.add(os.path.relpath(os.path.join(d, n), root))
        return out

    a, b = entries(tree), entries(ref)
    diff = sorted(a ^ b)
    for rel in sorted(a & b):
        p, q = tree / rel, ref / rel
        if p.is_symlink() or q.is_symlink():
            if os.readlink(p) != os.readlink(q):
                diff.append(rel)
        elif p.is_file() and os.stat(p).st_ino != os.stat(q).st_ino:
            if not filecmp.cmp(p, q, shallow=False):
                diff.append(rel)
    return diff


def _stats(root: Path) -> dict[str, tuple]:
    out = {}
    for d, _, files in os.walk(root):
        for n in files:
            st = os.lstat(os.path.join(d, n))
            out[os.path.join(d, n)] = (st.st_ino, st.st_size, st.st_mtime_ns)
    return out


@pytest.fixture(scope="module", autouse=True)
def cached_venv_stats():
    before = _stats(_real_site() / "vllm")
    yield before
    assert _stats(_real_site() / "vllm") == before, "the cached venv's vllm changed"


ENGINES = sorted(
    d.name
    for d in (REPO_ROOT / "anchors").iterdir()
    if (d / "ORDER").is_file() and not d.name.startswith("example-")
)


def test_wheel_tag_and_contents(wheel):
    assert re.fullmatch(
        rf"kvtier-{re.escape(VERSION)}-py3-none-manylinux_2_\d+_x86_64\.whl", wheel.name
    ), wheel.name
    names = zipfile.ZipFile(wheel).namelist()
    data = "kvtier/share/kvtier"
    for want in ("kvtier/bin/overlay", "kvtier/bin/kvstore", "kvtier/_cli.py", "kvtier/found.py",
                 f"{data}/VERSION", f"{data}/docker/bake.sh", f"{data}/docker/gate.sh"):  # fmt: skip
        assert want in names, want
    # Every supported release: its ORDER, each overlay ORDER names, its pins.
    for engine in ENGINES:
        assert f"{data}/anchors/{engine}/ORDER" in names, engine
        assert f"{data}/pins/{engine}/PINS" in names, engine
        order = (REPO_ROOT / "anchors" / engine / "ORDER").read_text().split()
        for name in order:
            assert any(n.startswith(f"{data}/overlays/{name}/") for n in names), name
    # ISA-L grafted by auditwheel; no Clang tool, no worked example, no caches.
    assert any(re.match(r"kvtier\.libs/libisal-[0-9a-f]+\.so", n) for n in names), names
    for bad in ("cxxscope", "example-", "__pycache__", "share/doc", "bash-completion"):
        assert not [n for n in names if bad in n], bad


def test_versions_agree(installed):
    py = installed / "bin/python"
    meta = _run(py, "-c", "import kvtier; print(kvtier.__version__)").stdout.strip()
    assert meta == VERSION
    data = _purelib(installed) / "kvtier/share/kvtier"
    assert (data / "VERSION").read_text().strip() == VERSION
    for tool in ("overlay", "kvstore"):
        lines = _run(installed / "bin" / tool, "--version").stdout.splitlines()
        assert lines[0] == f"{tool} {VERSION}"
        for engine in ENGINES:
            # The id baked into the binary is the id of the artifacts the wheel carries.
            sh = f'. "{data}/docker/lib.sh"; build_id "{data}" {engine}'
            assert f"{engine} build {_run('bash', '-c', sh).stdout}" in lines, lines
    # The Dockerfile's pip stage installs this version by default.
    dockerfile = (REPO_ROOT / "docker/Dockerfile").read_text()
    assert f"ARG KVTIER_VERSION={VERSION}\n" in dockerfile


def _order(engine: str = "vllm-0.33.0") -> list[str]:
    return (REPO_ROOT / "anchors" / engine / "ORDER").read_text().split()


def _rebuilds_a_binary(name: str, engine: str = "vllm-0.33.0") -> bool:
    manifest = (REPO_ROOT / "anchors" / engine / f"{name}.toml").read_text()
    return re.search(r"^\[\[built_files\]\]", manifest, re.M) is not None


def _pip_stage_run() -> tuple[str, str]:
    """The serving-pip stage's RUN line, continuation lines joined, without
    its bind mount; and the mount's target (where the wheelhouse appears)."""
    text = re.sub(r"\\\n\s*", " ", (REPO_ROOT / "docker/Dockerfile").read_text())
    stage = text.split(" AS serving-pip\n", 1)[1].split("\nFROM ", 1)[0]
    (run,) = [ln[4:] for ln in stage.splitlines() if ln.startswith("RUN ")]
    mount = re.match(r"--mount=type=bind,source=wheelhouse,target=(\S+) ", run)
    assert mount, run
    return re.sub(r"\s+", " ", run[mount.end() :]).strip(), mount[1]


def test_the_dockerfile_two_line_path_works_from_the_wheel(wheel, site, tmp_path):
    """The pip stage's line exactly as the Dockerfile has it, in a fresh venv
    beside the pinned vLLM, with no fetch cache and no kvtier-cxxscope (as in
    the serving image): `pip install kvtier==X` from a local index, then the
    plain `overlay apply --check-injected`. It applies the overlays of ORDER
    that rebuild no engine binary, names the one it leaves out, and leaves
    vLLM's own extension alone."""
    run, wheelhouse = _pip_stage_run()
    pip_part, sep, overlay_part = run.partition(" && ")
    assert sep and overlay_part == "overlay apply --check-injected", run
    # The stage's pip line as written: the wheelhouse is the folder the wheel
    # was repaired into (README "With pip"), nothing from an index.
    assert pip_part.startswith("pip install ") and "--no-index" in pip_part, run
    fresh = tmp_path / "v"
    _run(sys.executable, "-m", "venv", "--without-pip", fresh)
    line = pip_part.replace(wheelhouse, str(wheel.parent)).replace(
        "${KVTIER_VERSION}", VERSION
    )
    pip = f"{sys.executable} -m pip --python {fresh / 'bin/python'}"
    _run("bash", "-c", line.replace("pip install ", f"{pip} install -q ", 1))
    (_purelib(fresh) / "vllm_copy_for_test.pth").write_text(f"{site}\n")
    (tmp_path / "empty-cache").mkdir()
    env = _env(PATH=f"{fresh / 'bin'}:/usr/bin:/bin",
               XDG_CACHE_HOME=str(tmp_path / "empty-cache"))  # fmt: skip
    so = "vllm/fs_io_C.abi3.so"
    pinned = (site / so).read_bytes()
    done = _run("bash", "-c", overlay_part, env=env)
    python_only = [n for n in _order() if not _rebuilds_a_binary(n)]
    left_out = [n for n in _order() if _rebuilds_a_binary(n)]
    assert left_out == ["vllm-fs-durable"], left_out
    assert f"no ROOT given: using {site} (vllm 0.33.0" in done.stderr, done.stderr
    assert f"leaving out vllm-fs-durable (rebuilds {so})" in done.stderr
    assert "--rebuild-binaries takes it in" in done.stderr
    assert re.search(r"compiled \d+ files and fragments: ok", done.stdout), done.stdout
    assert (site / so).read_bytes() == pinned
    assert not (site / "vllm/.fs_io_C.abi3.so.overlay-orig").exists()
    # A plain check checks what a plain apply applied; the one left out is
    # pristine, so naming it in fails.
    check = _run("bash", "-c", "overlay check --check-injected", env=env)
    assert check.stdout.startswith(f"ok: applied {' '.join(python_only)}\n"), (
        check.stdout
    )
    with_it = _run(
        "bash", "-c", "overlay check --rebuild-binaries", env=env, check=False
    )
    assert with_it.returncode == 1, with_it.stderr
    assert "vllm-fs-durable is pristine" in with_it.stderr
    status = _run("bash", "-c", "overlay status", env=env).stdout
    for name in python_only:
        assert re.search(rf"^overlay {name}: applied ", status, re.M), status
    assert re.search(r"^overlay vllm-fs-durable: pristine ", status, re.M), status
    _run("bash", "-c", "overlay revert", env=env)
    assert _differences(site / "vllm", _real_site() / "vllm") == []


OFFLOADING = "vllm/distributed/kv_transfer/kv_connector/v1/offloading"
LOAD_STORE_LIBRARY = """import sys
sys.path.insert(0, sys.argv[1])
from kv_store_format import native
print(native.load().path)
"""


def _load_store_library(python: Path, site: Path) -> subprocess.CompletedProcess:
    """The patched tree's kv_store_format.native loads its library the way
    the writer does at boot: KVTIER_STORE_LIB unset, so from beside itself."""
    return _run(python, "-c", LOAD_STORE_LIBRARY, site / OFFLOADING, env=_env(),
                check=False)  # fmt: skip


def test_the_wheel_bake_records_the_build_id_the_tools_print(installed, site, tmp_path):
    """One version: the wheel's, `overlay --version`, `kvstore --version`, the
    bake script's, and the artifact list the wheel's own bake.sh records
    (without --engine: the release read from the vllm dist-info) all agree."""
    data = _purelib(installed) / "kvtier/share/kvtier"
    py = installed / "bin/python"
    listed = tmp_path / "ARTIFACTS.sha256"
    done = _run(data / "docker/bake.sh", "--python", py, "--artifacts", listed,
                env=_env(PATH="/usr/bin:/bin"))  # fmt: skip
    meta = site / "vllm-0.33.0.dist-info/METADATA"
    assert f"tree {site}: vllm 0.33.0 (from {meta})" in done.stderr, done.stderr
    lines = listed.read_text().splitlines(keepends=True)
    assert lines[0].endswith("  anchors/vllm-0.33.0/ORDER\n"), lines[0]
    baked = (tmp_path / "ARTIFACTS.baked").read_text().split()
    assert baked == [n for n in _order() if not _rebuilds_a_binary(n)]
    # The store library it put beside native.py loads there, with the ISA-L
    # auditwheel grafted (renamed) into kvtier.libs copied beside it.
    loaded = _load_store_library(py, site)
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.strip() == str(
        site / OFFLOADING / "kv_store_format/libkvtier_store.so"
    )
    # The build id hashes the overlay artifacts (the list less the store library).
    artifacts = "".join(ln for ln in lines if not ln.endswith("/libkvtier_store.so\n"))
    build = "kvtier-" + hashlib.sha256(artifacts.encode()).hexdigest()[:16]
    meta_version = _run(py, "-c", "import kvtier; print(kvtier.__version__)").stdout
    assert meta_version.strip() == VERSION
    for tool in (
        installed / "bin/overlay",
        installed / "bin/kvstore",
        data / "docker/bake.sh",
    ):
        out = _run(tool, "--version").stdout.splitlines()
        assert out[0] == f"{tool.name.removesuffix('.sh')} {VERSION}", out
        assert f"vllm-0.33.0 build {build}" in out, (tool, out)


def test_plain_apply_takes_the_release_it_finds(
    installed, engine_tree, pin_dir, engine_name, engine_version, tmp_path
):
    """Each supported release: the pinned tree as pip lays it out (its
    dist-info from the pinned wheel's METADATA), and the plain apply from the
    wheel picks that release's anchors by itself."""
    wheel = (Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
             / "kvtier/wheels" / (pin_dir / "WHEEL").read_text().split()[1])  # fmt: skip
    if not wheel.is_file():
        pytest.skip(f"{wheel}: not cached (run scripts/setup.sh)")
    tree = tmp_path / "site"
    shutil.copytree(engine_tree, tree, ignore=shutil.ignore_patterns("__pycache__"))
    (tree / engine_name / "__init__.py").touch()
    info = tree / f"{engine_name}-{engine_version}.dist-info"
    info.mkdir()
    with zipfile.ZipFile(wheel) as z:
        (info / "METADATA").write_bytes(z.read(f"{info.name}/METADATA"))
    (info / "RECORD").write_text(f"{engine_name}/__init__.py,,\n")
    pth = _purelib(installed) / "vllm_release_for_test.pth"
    pth.write_text(f"{tree}\n")
    try:
        done = _run(installed / "bin/overlay", "apply", "--check-injected", env=_env())
        check = _run(installed / "bin/overlay", "check", env=_env())
    finally:
        pth.unlink()
    assert f"no ROOT given: using {tree} ({engine_name} {engine_version}" in done.stderr
    order = _order(f"{engine_name}-{engine_version}")
    kept = [
        n for n in order if not _rebuilds_a_binary(n, f"{engine_name}-{engine_version}")
    ]
    assert check.stdout.startswith(f"ok: applied {' '.join(kept)}\n"), check.stdout


def _interpreter(version: str) -> Path | None:
    """CPython `version` (3.N) that runs: a pyenv build (the machine image
    carries 3.10-3.13 there), else one on PATH (a pyenv shim on PATH may name
    a version it does not serve: each candidate is run); None when absent."""
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    candidates = sorted(pyenv.glob(f"{version}.*/bin/python{version}"), reverse=True)
    if shutil.which(f"python{version}"):
        candidates.append(Path(shutil.which(f"python{version}")))
    for python in candidates:
        done = subprocess.run(
            [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if done.returncode == 0 and done.stdout.strip() == version:
            return python
    return None


@pytest.mark.parametrize("version", ["3.10", "3.11", "3.12", "3.13"])
def test_the_one_wheel_runs_under_every_supported_cpython(
    wheel, pristine_copy, tmp_path, version
):
    """py3-none: the same wheel installs into a venv of each CPython the
    classifiers name; the entry points run, and the shim's metadata search
    (importlib.metadata of that interpreter) finds the vLLM on its path."""
    python = _interpreter(version)
    if python is None:
        pytest.skip(
            f"no CPython {version} here (not on PATH, none under ~/.pyenv/versions)"
        )
    fresh = tmp_path / "v"
    _run(python, "-m", "venv", "--without-pip", fresh)
    _pip(fresh, "install", "-q", "--no-deps", "--no-index", wheel)
    for tool in ("overlay", "kvstore"):
        out = _run(fresh / "bin" / tool, "--version").stdout.splitlines()
        assert out[0] == f"{tool} {VERSION}", out
    (_purelib(fresh) / "vllm_copy_for_test.pth").write_text(f"{pristine_copy}\n")
    done = _run(fresh / "bin/overlay", "status", env=_env())
    assert f"no ROOT given: using {pristine_copy} (vllm 0.33.0" in done.stderr, (
        done.stderr
    )
    assert f"installed for {fresh / 'bin/python'}" in done.stderr
    assert "overlay kv-offload-scope: pristine" in done.stdout


def test_pip_path_bake_gate_revert_uninstall_leave_nothing(wheel, tmp_path):
    """Issue 48, DOCKER.md/DEPLOY.md "With pip" as a vLLM user has it: kvtier
    installed into the site-packages vLLM is in. The wheel's bake copies the
    store library beside vLLM's native.py only (before the fix also into the
    wheel's own overlay copy, which the gate then refused at both knobs); the
    gate passes at knob 0 and 1; revert removes the folder the overlay made
    with what the bake put there; pip uninstall leaves no kvtier file."""
    venv = tmp_path / "v"
    _run(sys.executable, "-m", "venv", "--without-pip", venv)
    purelib = _purelib(venv)
    real = _real_site()
    _run("cp", "-al", real / "vllm", purelib / "vllm")
    (info,) = real.glob("vllm-*.dist-info")
    shutil.copytree(info, purelib / info.name)
    before = sorted(p.name for p in purelib.iterdir())
    _pip(venv, "install", "-q", "--no-deps", "--no-index", wheel)
    share = purelib / "kvtier/share/kvtier"
    assert (share / "ARTIFACTS.sha256").read_bytes() == b""  # not baked yet
    py, env = venv / "bin/python", _env(PATH=f"{venv / 'bin'}:/usr/bin:/bin")
    gate = _run(share / "docker/gate.sh", "--python", py, env=env, check=False)
    assert gate.returncode == 2 and "empty: nothing baked yet" in gate.stderr
    # DEPLOY.md's lines as written, with this venv's python3 first on PATH.
    deploy = (REPO_ROOT / "docs/DEPLOY.md").read_text()
    block = deploy.split("**Bake and gate from the wheel.**", 1)[1]
    block = block.split("```sh\n", 1)[1].split("```", 1)[0]
    assert "bake.sh" in block and "gate.sh" in block, block
    done = _run("bash", "-euc", block, env=env)
    assert "ok: knob 0" in done.stderr, done.stderr
    assert not [p for p in (share / "overlays").rglob("*") if ".so" in p.name]
    lib_dir = purelib / OFFLOADING / "kv_store_format"
    assert (lib_dir / "libkvtier_store.so").is_file()
    assert "libkvtier_store.so" in (lib_dir / ".overlay-installed").read_text()
    knob1 = {"GLM53_KV_OFFLOAD": "1", "GLM53_KV_OFFLOAD_CPU_GB": "4",
             "GLM53_KV_OFFLOAD_DIR": str(tmp_path / "store")}  # fmt: skip
    for knobs in ({}, knob1):
        gate = _run(share / "docker/gate.sh", "--python", py, env={**env, **knobs})
        assert f"ok: knob {1 if knobs else 0}" in gate.stderr, gate.stderr
    revert = _run(venv / "bin/overlay", "revert", env=env)
    assert "as its record lists them: libkvtier_store.so" in revert.stdout
    _run(venv / "bin/overlay", "check", "--expect", "pristine", env=env)
    assert not lib_dir.exists()
    assert _differences(purelib / "vllm", real / "vllm") == []
    _pip(venv, "uninstall", "-y", "-q", "kvtier")
    assert sorted(p.name for p in purelib.iterdir()) == before


def test_after_the_two_line_path_the_store_library_loads(installed, site):
    """`overlay apply` copies no binary: the patched native.py finds the wheel's
    own library (lib/kvtier of the installed kvtier package), as a knob-1
    writer does at boot."""
    _run(installed / "bin/overlay", "apply", env=_env())
    loaded = _load_store_library(installed / "bin/python", site)
    assert loaded.returncode == 0, loaded.stderr


def test_tools_need_only_glibc_and_the_wheel(installed):
    for tool in ("overlay", "kvstore"):
        binary = _purelib(installed) / "kvtier/bin" / tool
        libs = _run("ldd", binary).stdout
        for line in libs.splitlines():
            if "=>" not in line:
                continue
            name, where = (s.strip() for s in line.split("=>", 1))
            assert "not found" not in where, line
            if not re.match(r"(libc|libm|libpthread|libdl|librt)\.so", name):
                assert "/kvtier.libs/" in where, line


def test_apply_check_revert_then_uninstall_leaves_vllm_identical(
    installed, site, cxxscope, tmp_path
):
    """Every overlay, the C++ one included (--rebuild-binaries): it rebuilds
    vllm/fs_io_C.abi3.so from the pinned sources (the fetch cache) with
    kvtier-cxxscope. A plain check then checks it too (applied: not left out)."""
    bin_ = installed / "bin"
    env = _env(KVTIER_CXXSCOPE=str(cxxscope))
    done = _run(
        bin_ / "overlay", "apply", "--check-injected", "--rebuild-binaries", env=env
    )
    assert f"no ROOT given: using {site} (vllm 0.33.0" in done.stderr, done.stderr
    assert "leaving out" not in done.stderr
    assert f"installed for {bin_ / 'python'}" in done.stderr
    assert NOTE in done.stderr
    assert "vllm/fs_io_C.abi3.so: rebuilt" in done.stdout, done.stdout
    assert _differences(site / "vllm", _real_site() / "vllm"), "apply changed nothing"
    check = _run(bin_ / "overlay", "check", env=env).stdout
    assert check.startswith(f"ok: applied {' '.join(_order())}\n"), check
    store = Store(tmp_path / "tier")
    store.boundary(["a", "b"])
    age_tree(store.tier)
    _run(bin_ / "kvstore", "verify", store.tier, env=env)
    _run(bin_ / "overlay", "revert", env=env)
    check = _run(bin_ / "overlay", "check", "--expect", "pristine", env=env)
    assert "ok: pristine" in check.stdout
    _pip(installed, "uninstall", "-y", "-q", "kvtier")
    assert not (bin_ / "overlay").exists() and not (bin_ / "kvstore").exists()
    assert not list(_purelib(installed).glob("kvtier*")), "pip left kvtier files"
    assert _differences(site / "vllm", _real_site() / "vllm") == []
    assert sorted(p.name for p in site.iterdir()) == ["vllm", "vllm-0.33.0.dist-info"]


def test_uninstall_while_applied_warns_and_keeps_the_tree(wheel, installed, site):
    """pip runs no uninstall hook: it cannot refuse. apply warns; uninstall
    leaves the applied tree whole, and a reinstalled kvtier reverts it."""
    bin_ = installed / "bin"
    done = _run(bin_ / "overlay", "apply", "--overlays", PYTHON_OVERLAYS, env=_env())
    assert NOTE in done.stderr
    applied = _differences(site / "vllm", _real_site() / "vllm")
    assert applied
    _pip(installed, "uninstall", "-y", "-q", "kvtier")
    assert _differences(site / "vllm", _real_site() / "vllm") == applied
    _pip(installed, "install", "-q", "--no-deps", "--no-index", wheel)
    check = _run(bin_ / "overlay", "check", "--overlays", PYTHON_OVERLAYS, env=_env())
    assert "ok: applied" in check.stdout
    _run(bin_ / "overlay", "revert", env=_env())
    assert _differences(site / "vllm", _real_site() / "vllm") == []


def test_without_cxxscope_rebuild_binaries_is_refused(installed, site):
    """The wheel has no kvtier-cxxscope: taking the C++ vllm-fs-durable in
    (--rebuild-binaries) fails closed, naming the tool; nothing is written."""
    done = _run(installed / "bin/overlay", "apply", "--rebuild-binaries", env=_env(),
                check=False)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "kvtier-cxxscope is not built or installed" in done.stderr
    assert _differences(site / "vllm", _real_site() / "vllm") == []


def test_no_root_refuses_none_or_several(installed, site, tmp_path):
    bin_ = installed / "bin"
    purelib = _purelib(installed)
    pth = purelib / "vllm_copy_for_test.pth"
    pth.unlink()
    # A dist-info without its package beside it does not count.
    broken = tmp_path / "broken"
    broken.mkdir()
    shutil.copytree(site / "vllm-0.33.0.dist-info", broken / "vllm-0.33.0.dist-info")
    (purelib / "broken_vllm_for_test.pth").write_text(f"{broken}\n")
    try:
        done = _run(bin_ / "overlay", "status", env=_env(), check=False)
    finally:
        (purelib / "broken_vllm_for_test.pth").unlink()
    assert done.returncode == 2, done.stderr
    assert f"no vllm distribution is installed for {bin_ / 'python'}" in done.stderr
    assert f"skipped {broken}/vllm-0.33.0.dist-info: RECORD lists vllm/__init__.py" in (
        done.stderr
    )

    second = _vllm_copy(tmp_path / "second")
    pth.write_text(f"{site}\n{second}\n")
    done = _run(bin_ / "overlay", "apply", env=_env(), check=False)
    assert done.returncode == 2, done.stderr
    assert "2 vllm distributions are installed" in done.stderr
    assert f"  {site} (vllm 0.33.0)" in done.stderr
    assert f"  {second} (vllm 0.33.0)" in done.stderr
    assert _differences(site / "vllm", _real_site() / "vllm") == []
    # Named explicitly, either works.
    done = _run(bin_ / "overlay", "status", "--root", second, env=_env())
    assert "pristine" in done.stdout and "no ROOT given" not in done.stderr
