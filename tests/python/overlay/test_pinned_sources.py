"""The pinned engine sources: the pin set, the fetched tree, and that the harness
loads every pinned file pristine, with every import met by a pin or a stub."""

from __future__ import annotations

import hashlib
import importlib.util
import sys
import tomllib
from pathlib import Path

import harness
import pytest
from conftest import PIN_DIRS, REPO_ROOT, fetch_tree
from harness.imports import runtime_imports

# Pinned files that are pinned for the overlays (they read or patch them) but
# cannot be loaded meaningfully in the harness, with the reason. The load test
# asserts these really fail to load, so the list cannot go stale.
NOT_LOADABLE: dict[str, str] = {}


def pytest_generate_tests(metafunc):
    if "pinned_path" in metafunc.fixturenames:
        params = [
            pytest.param(d, pin.path, id=f"{d.name}:{pin.path}")
            for d in PIN_DIRS
            for pin in harness.read_pins(d / "PINS")
            if pin.module is not None
        ]
        metafunc.parametrize(("pinned_dir", "pinned_path"), params)


def test_pin_set_is_well_formed(pin_dir, pins):
    assert pins, f"{pin_dir}/PINS is empty"
    paths = [p.path for p in pins]
    assert len(paths) == len(set(paths)), "a path is pinned twice"
    for pin in pins:
        assert len(pin.sha256) == 64 and int(pin.sha256, 16) >= 0, pin
        assert not pin.path.startswith("/") and ".." not in Path(pin.path).parts
    wheel_lines = [
        line for line in (pin_dir / "WHEEL").read_text().splitlines() if line.strip()
    ]
    assert len(wheel_lines) == 1
    digest, _, name = wheel_lines[0].partition("  ")
    assert len(digest) == 64 and name.endswith(".whl")


def test_tree_is_exactly_the_pins(engine_tree, pins, pin_dir):
    """What fetch.py extracted matches every pin (PINS, and INTERFACE: the
    files the interface pins name), and holds nothing else."""
    interface = pin_dir / "INTERFACE"
    if interface.is_file():
        pins = pins + harness.read_pins(interface)
    for pin in pins:
        data = (engine_tree / pin.path).read_bytes()
        assert hashlib.sha256(data).hexdigest() == pin.sha256, pin.path
    files = {
        p.relative_to(engine_tree).as_posix()
        for p in engine_tree.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert files == {pin.path for pin in pins}


def test_harness_loads_pinned_file(pinned_dir, pinned_path):
    engine_tree = fetch_tree(pinned_dir)
    engine_name = harness.split_pin_dir(pinned_dir)[0]
    module = harness.module_name(pinned_path)
    with harness.engine(engine_tree, package=engine_name) as ns:
        if pinned_path in NOT_LOADABLE:
            with pytest.raises((ImportError, AttributeError, RuntimeError)):
                ns.load(module)
            return
        mod = ns.load(module)
        assert ns.origin(module) == "tree"
        assert Path(mod.__file__) == engine_tree / pinned_path
        # Nothing it pulled in came from sys.path: every managed module is from
        # the tree, a stub, or an empty package.
        assert set(ns.loaded().values()) <= {"tree", "stub", "package"}
    assert module not in sys.modules, "the engine left its modules behind"


def _manifests(engine_name: str, engine_version: str) -> list[dict]:
    out = []
    for manifest in sorted(
        REPO_ROOT.glob(f"anchors/{engine_name}-{engine_version}/*.toml")
    ):
        try:
            out.append(tomllib.loads(manifest.read_text()))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError):
            continue  # the engine's manifest tests report a broken manifest
    return out


def _overlay_sources(engine_name: str, engine_version: str) -> dict[Path, str]:
    """Overlay file -> the module it runs as once applied: a new module runs as
    its target path, a fragment as the file it is injected into. Files no
    manifest names yet are not wired in, so they are not scanned."""
    out: dict[Path, str] = {}
    for data in _manifests(engine_name, engine_version):
        folder = REPO_ROOT / "overlays" / str(data.get("overlay", ""))
        for new_file in data.get("new_files", []):
            module = harness.module_name(str(new_file.get("path", "")))
            if module and new_file.get("source"):
                out[folder / new_file["source"]] = module
        for target in data.get("files", []):
            module = harness.module_name(str(target.get("path", "")))
            for edit in target.get("edits", []):
                if module and edit.get("fragment"):
                    out.setdefault(folder / edit["fragment"], module)
    return {path: module for path, module in out.items() if path.is_file()}


def _overlay_new_modules(engine_name: str, engine_version: str) -> set[str]:
    """Modules the overlays add to a patched tree (their manifests' new_files)."""
    return {
        name
        for data in _manifests(engine_name, engine_version)
        for new_file in data.get("new_files", [])
        if (name := harness.module_name(str(new_file.get("path", ""))))
    }


def _scanned_sources(
    engine_tree: Path, engine_name: str, engine_version: str, pins
) -> list[tuple[str, Path, str, bool]]:
    """(label, file, module name, is_package) for pinned files and overlay code."""
    out = [
        (pin.path, engine_tree / pin.path, pin.module, pin.path.endswith("__init__.py"))
        for pin in pins
        if pin.module is not None
    ]
    # Overlay fragments and new modules run inside the engine too; their imports
    # must be met the same way.
    # A new package's __init__.py resolves its relative imports inside itself.
    for path, module in sorted(_overlay_sources(engine_name, engine_version).items()):
        out.append(
            (str(path.relative_to(REPO_ROOT)), path, module, path.name == "__init__.py")
        )
    return out


def _installed(top: str) -> bool:
    return top in sys.stdlib_module_names or importlib.util.find_spec(top) is not None


def test_every_import_is_pinned_or_stubbed(
    engine_tree, engine_name, engine_version, pins
):
    """Parses every pinned file (and overlay file): each run-time import must be a
    pinned module, a stub, or an installed package; each imported name must
    exist. A new pin with an unmet import fails here, naming file and line."""
    problems = []
    added = _overlay_new_modules(engine_name, engine_version)
    with harness.engine(engine_tree, package=engine_name) as ns:
        for label, path, module, is_pkg in _scanned_sources(
            engine_tree, engine_name, engine_version, pins
        ):
            try:
                imports = runtime_imports(path.read_text(), module, is_pkg)
            except SyntaxError:
                continue  # a fragment that is not a whole statement: engine checks it
            for imp in imports:
                top = imp.module.partition(".")[0]
                where = f"{label}:{imp.line}: {imp.module}"
                if not top:
                    problems.append(f"{where}: relative import above the package")
                    continue
                if imp.module in added or f"{imp.module}.{imp.name}" in added:
                    continue  # an overlay's own new module: exists once applied
                if top not in ns.managed_tops:
                    if not _installed(top):
                        problems.append(f"{where}: not installed and no stub")
                    continue
                if ns.origin(imp.module) is None:
                    problems.append(f"{where}: neither pinned nor stubbed")
                    continue
                if imp.name is None or imp.name == "*":
                    continue
                submodule = f"{imp.module}.{imp.name}"
                if ns.origin(submodule) in ("tree", "stub"):
                    continue
                try:
                    target = ns.load(imp.module)
                except Exception as e:  # reported, not raised: list them all
                    problems.append(f"{where}: does not load: {e!r}")
                    continue
                if not hasattr(target, imp.name):
                    problems.append(f"{where}: has no name {imp.name}")
    assert not problems, "\n".join(problems)


def test_no_module_is_both_pinned_and_stubbed(pins):
    """The tree wins over a stub, so such a stub would be dead and misleading."""
    stubbed = {
        harness.module_name(p.relative_to(harness.STUBS_DIR).as_posix())
        for p in harness.STUBS_DIR.rglob("*.py")
    }
    both = stubbed & {pin.module for pin in pins}
    assert not both, f"pinned and stubbed: {sorted(both)}"


def test_every_stub_is_used():
    """Stubs stay minimal: each one stands for a module some pinned or overlay
    file of some pinned release imports (or is a package holding such stubs).
    The stubs are shared by every release, so one that only an older release
    imports (vllm.v1.hisparse for 0.32.0) is still used; so every pin set is
    read here, whatever KVTIER_ENGINE picks."""
    imported: set[str] = set()
    scanned = []
    for pin_dir in sorted(p.parent for p in REPO_ROOT.glob("fixtures/*/PINS")):
        name, version = harness.split_pin_dir(pin_dir)
        tree = fetch_tree(pin_dir)
        pins = harness.read_pins(pin_dir / "PINS")
        scanned += _scanned_sources(tree, name, version, pins)
    for _, path, module, is_pkg in scanned:
        try:
            for imp in runtime_imports(path.read_text(), module, is_pkg):
                imported.add(imp.module)
                if imp.name:
                    imported.add(f"{imp.module}.{imp.name}")
        except SyntaxError:
            continue
    for stub in sorted(harness.STUBS_DIR.rglob("*.py")):
        name = harness.module_name(stub.relative_to(harness.STUBS_DIR).as_posix())
        used = name in imported or any(i.startswith(name + ".") for i in imported)
        assert used, f"stub {name} is imported by no pinned or overlay file"
