"""The sim's stand-ins cannot hide a vLLM rename (issue 43): every name a
harness stub defines, and every field the sim's fakes set on vLLM's objects,
exists in each pinned release that has the module or class it imitates (read
from the release's verified wheel with apipins' reader, never imported)."""

from __future__ import annotations

import ast
import sys
import zipfile
from pathlib import Path

import harness
import pytest
from conftest import PIN_DIRS, REPO_ROOT

sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "fixtures"))
import fetch  # noqa: E402

from apipins.index import Index, Sym  # noqa: E402

STUBS = harness.STUBS_DIR / "vllm"


class WheelFiles:
    def __init__(self, wheel: Path):
        self.zip = zipfile.ZipFile(wheel)
        self.names = set(self.zip.namelist())

    def read(self, path: str) -> str | None:
        return self.zip.read(path).decode() if path in self.names else None

    def is_ours(self, path: str, line: int) -> bool:
        return False


def release_index(pin_dir: Path) -> Index:
    name, version = fetch.split_pin_dir(pin_dir)
    sha, wheel_name = fetch.read_wheel_pin(pin_dir / "WHEEL")
    wheel = fetch.ensure_wheel(
        fetch.cache_root() / "wheels", wheel_name, sha, name, version
    )
    return Index(WheelFiles(wheel))


def stub_modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted(STUBS.rglob("*.py")):
        rel = path.relative_to(harness.STUBS_DIR).as_posix()
        out.append((harness.module_name(rel), path))
    return out


def public_defs(tree: ast.Module):
    """(name, node) of what a stub defines at module level, helpers (_x) and
    names it imports left out."""
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            names = [node.name]
        elif isinstance(node, ast.Assign):
            names = [
                n.id
                for t in node.targets
                for n in ast.walk(t)
                if isinstance(n, ast.Name)
            ]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names = [node.target.id]
        else:
            continue
        for name in names:
            if not name.startswith("_"):
                yield name, node


def class_members(node: ast.ClassDef) -> list[str]:
    out = []
    for stmt in node.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.append(stmt.name)
        elif isinstance(stmt, ast.Assign):
            out += [t.id for t in stmt.targets if isinstance(t, ast.Name)]
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            out.append(stmt.target.id)
    return [m for m in out if not m.startswith("_")]


def has_member(index: Index, cls: Sym, name: str) -> bool:
    if index.member(cls, name) is not None or index.outside_base(cls):
        return True
    # an enum's member, a NamedTuple's field, ... reached through the class body
    node = index.class_node(cls)
    return node is not None and any(
        isinstance(n, ast.Name) and n.id == name for n in ast.walk(node)
    )


def imported_names(index: Index, pin_dir: Path) -> set[tuple[str, str]]:
    """(module, name) every pinned file of the release and every overlay
    source imports by name: what a stub answers for this release."""
    from apipins.index import resolve_relative

    out: set[tuple[str, str]] = set()
    sources = [
        (p.module, p.path, index.sources.read(p.path))
        for p in harness.read_pins(pin_dir / "PINS")
        if p.module
    ]
    sources += [
        ("ours", str(f), f.read_text()) for f in (REPO_ROOT / "overlays").rglob("*.py")
    ]
    for module, path, text in sources:
        try:
            tree = ast.parse(text) if text is not None else None
        except SyntaxError:
            continue  # a fragment that is the head of vLLM's own block
        if tree is None:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (
                node.level == 0 or module != "ours"
            ):
                src = resolve_relative(
                    module, path.endswith("__init__.py"), node.module, node.level
                )
                out.update((src, a.name) for a in node.names)
    return out


def imported(index: Index, module: str, name: str) -> bool:
    """Whether the real module imports ``name`` from elsewhere (a re-export,
    such as prometheus_client's Counter)."""
    mod = index.module(module)
    return mod is not None and name in mod.imports


@pytest.mark.parametrize("pin_dir", PIN_DIRS, ids=[d.name for d in PIN_DIRS])
def test_every_stub_name_exists_in_the_release(pin_dir):
    """Each name a stub defines that this release's code imports (its pinned
    files, the overlays) exists in the release's real module, and so does
    each member the stub gives such a class."""
    index = release_index(pin_dir)
    wanted = imported_names(index, pin_dir)
    checked, missing = 0, []
    for module, path in stub_modules():
        if module == "vllm" or index.module(module) is None:
            continue  # this release has no such module (the stub is the other's)
        for name, node in public_defs(ast.parse(path.read_text())):
            if (module, name) not in wanted:
                continue  # the other release's name: this one never asks for it
            where, real = index.resolve(module, name)
            if real is None and not (
                index.exists(where.module + "." + where.name)
                or imported(index, module, name)
            ):
                missing.append(f"{module}.{name}")
                continue
            checked += 1
            if isinstance(node, ast.ClassDef) and isinstance(real, ast.ClassDef):
                for member in class_members(node):
                    if not has_member(index, where, member):
                        missing.append(f"{module}.{name}.{member}")
    assert checked > 15, checked
    assert not missing, f"stub names {pin_dir.name} does not have: {missing}"


def test_a_stub_naming_what_the_release_lacks_is_caught():
    """The check above is not vacuous: a renamed attribute fails it."""
    index = release_index(PIN_DIRS[-1])
    cls = Sym("vllm.v1.request", "Request")
    assert has_member(index, cls, "request_id")
    assert not has_member(index, cls, "skip_reading_prefix_cache_renamed")


@pytest.mark.parametrize("pin_dir", PIN_DIRS, ids=[d.name for d in PIN_DIRS])
def test_the_sim_sets_only_fields_the_release_has(pin_dir, tmp_path):
    """The Request the sim builds carries its release's own fields; setting
    one the release lacks is an error at construction."""
    from conftest import fetch_tree
    from hybrid_layout import HybridVllm

    tree = fetch_tree(pin_dir)
    with harness.engine(tree) as ns:
        vllm = HybridVllm(ns)
        request = vllm.request("r", [b"x" * 32], 16)
        real = harness.release.members(tree, "vllm.v1.request", "Request")
        assert set(vars(request)) <= real
        with pytest.raises(AttributeError, match="no a_field_vllm_lacks"):
            vllm.request_mod.Request(request_id="r", a_field_vllm_lacks=1)
