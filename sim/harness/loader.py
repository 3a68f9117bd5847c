"""Loads modules of an engine tree by file path, under a private module namespace.

An `Engine` owns every module whose top-level name it manages (the engine's
package, e.g. ``vllm``, plus each top-level stub such as ``torch``). A module
name resolves, in this order, to:

1. the engine tree: ``<tree>/vllm/a/b.py`` or ``<tree>/vllm/a/b/__init__.py``
   (the real, pristine or patched, code);
2. a stub: ``harness/stubs/vllm/a/b.py`` (or ``.../__init__.py``);
3. an empty package, when the tree or the stubs have a folder of that name
   (so ``vllm/__init__.py``, which would import all of vLLM, is never run);
4. otherwise ``ModuleNotFoundError`` naming both places looked in. A managed name
   never falls through to ``sys.path``: an installed vLLM or torch cannot leak in.

Source is compiled in memory, so no byte code is written into the tree.

Entering an engine swaps its modules into ``sys.modules`` and the previous
entries out; leaving swaps them back. So a pristine and a patched tree can be
used one after the other (or alternately, or nested) in one test session
without seeing each other's modules. Functions keep working after the engine is left, but a
lazy import inside them would then not resolve: call them inside the ``with``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Iterable
from pathlib import Path

from .pins import interface_only

STUBS_DIR = Path(__file__).resolve().parent / "stubs"


class _SourceLoader(importlib.abc.Loader):
    """Executes one source file; compiles in memory so nothing is written."""

    def __init__(self, path: Path | None, tree: Path | None = None) -> None:
        self.path = path
        self.tree = tree  # set for a stub: the tree whose release it imitates

    def create_module(self, spec):
        return None  # default module creation

    def exec_module(self, module: types.ModuleType) -> None:
        if self.path is None:
            return  # an empty package: nothing to run
        code = compile(
            self.path.read_bytes(), str(self.path), "exec", dont_inherit=True
        )
        if self.tree is not None:
            module.__dict__["__harness_tree__"] = self.tree
        exec(code, module.__dict__)


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def find_spec(self, fullname, path=None, target=None):
        if fullname.partition(".")[0] not in self.engine.managed_tops:
            return None
        origin, file, pkg_dir = self.engine.resolve(fullname)
        if origin is None:
            raise ModuleNotFoundError(
                f"{fullname}: not in engine tree {self.engine.tree} and no stub"
                f" in {self.engine.stubs}",
                name=fullname,
            )
        spec = importlib.machinery.ModuleSpec(
            fullname,
            _SourceLoader(file, self.engine.tree if origin == "stub" else None),
            origin=str(file) if file else None,
            is_package=pkg_dir is not None,
        )
        if pkg_dir is not None:
            spec.submodule_search_locations = [str(pkg_dir)]
        spec.has_location = file is not None
        return spec


class Engine:
    """One engine tree's private module namespace; a re-enterable context manager.

    tree:    a site-packages-like folder holding ``<package>/...`` (pristine pins,
             a patched copy, or a container's site-packages).
    package: the engine's top-level package name.
    real:    if given, only these tree files (paths relative to ``tree``, e.g.
             ``vllm/v1/kv_cache_interface.py``) load for real; any other module
             must have a stub. Use it on a full install, where loading arbitrary
             real modules would pull in torch.
    stubs:   the stub tree (default: this package's ``stubs/``).
    """

    def __init__(
        self,
        tree: str | Path,
        *,
        package: str = "vllm",
        real: Iterable[str] | None = None,
        stubs: str | Path = STUBS_DIR,
    ) -> None:
        self.tree = Path(tree).resolve()
        if not (self.tree / package).is_dir():
            raise FileNotFoundError(f"{self.tree}: no {package}/ package folder")
        self.package = package
        self.stubs = Path(stubs).resolve()
        self.real = None if real is None else frozenset(real)
        # Files fetched only for the interface pins (fixtures/*/INTERFACE):
        # never run, a stub stands in (they import all of vLLM and torch).
        self.skip = (
            frozenset() if real is not None else interface_only(self.tree, package)
        )
        self.managed_tops = frozenset(
            {package}
            | {p.stem for p in self.stubs.glob("*.py")}
            | {
                p.name
                for p in self.stubs.iterdir()
                if p.is_dir() and p.name.isidentifier()
            }
        )
        self._modules: dict[str, types.ModuleType] = {}
        self._saved: dict[str, types.ModuleType] | None = None
        self._finder = _Finder(self)

    # Resolution -------------------------------------------------------------

    def resolve(self, fullname: str) -> tuple[str | None, Path | None, Path | None]:
        """Returns (origin, file, package_dir) for a managed module name.

        origin is "tree", "stub", "package" (empty package) or None (not found).
        """
        rel = fullname.replace(".", "/")
        if fullname.partition(".")[0] == self.package:
            for file, pkg_dir in (
                (self.tree / f"{rel}.py", None),
                (self.tree / rel / "__init__.py", self.tree / rel),
            ):
                rel_file = file.relative_to(self.tree).as_posix()
                allowed = (
                    self.real is None or rel_file in self.real
                ) and rel_file not in self.skip
                if allowed and file.is_file():
                    return "tree", file, pkg_dir
        for file, pkg_dir in (
            (self.stubs / f"{rel}.py", None),
            (self.stubs / rel / "__init__.py", self.stubs / rel),
        ):
            if file.is_file():
                return "stub", file, pkg_dir
        for base in (self.tree, self.stubs):
            if (base / rel).is_dir():
                return "package", None, base / rel
        return None, None, None

    def origin(self, fullname: str) -> str | None:
        return self.resolve(fullname)[0]

    # Namespace swapping -----------------------------------------------------

    def _is_managed(self, name: str) -> bool:
        return name.partition(".")[0] in self.managed_tops

    def __enter__(self) -> Engine:
        if self._saved is not None:
            raise RuntimeError(f"engine {self.tree} is already active")
        self._saved = {n: m for n, m in sys.modules.items() if self._is_managed(n)}
        for name in self._saved:
            del sys.modules[name]
        sys.modules.update(self._modules)
        sys.meta_path.insert(0, self._finder)
        return self

    def __exit__(self, *exc) -> None:
        assert self._saved is not None
        sys.meta_path.remove(self._finder)
        self._modules = {n: m for n, m in sys.modules.items() if self._is_managed(n)}
        for name in self._modules:
            del sys.modules[name]
        sys.modules.update(self._saved)
        self._saved = None

    @property
    def active(self) -> bool:
        return self._saved is not None

    # Loading ----------------------------------------------------------------

    def load(self, name: str) -> types.ModuleType:
        """Imports ``name`` (and what it imports) inside this engine; returns it."""
        if not self.active:
            raise RuntimeError("Engine.load() needs the engine active: use `with`")
        if not self._is_managed(name):
            raise ValueError(f"{name}: not under {self.package} or a stub")
        return importlib.import_module(name)

    def loaded(self) -> dict[str, str]:
        """Module name -> origin ("tree", "stub", "package") of what is loaded."""
        source = sys.modules if self.active else self._modules
        out = {}
        for name, mod in source.items():
            if not self._is_managed(name):
                continue
            file = getattr(mod, "__file__", None)
            if file is None:
                out[name] = "package"
            elif Path(file).is_relative_to(self.stubs):
                out[name] = "stub"
            else:
                out[name] = "tree"
        return out


def engine(tree: str | Path, **kwargs) -> Engine:
    """``with engine(tree) as vllm_ns: mod = vllm_ns.load("vllm.x.y")``."""
    return Engine(tree, **kwargs)
