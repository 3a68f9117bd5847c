"""What a release's Python files define, read without importing them.

An ``Index`` answers three questions about a tree of Python files laid out
like site-packages (``vllm/a/b.py`` is module ``vllm.a.b``): which file a
module is, what a top-level name of a module is (following re-exports), and
where a class member is defined (following base classes). Files are parsed on
first use, so a scan reads only what it reaches.

The files come from a ``Sources`` (sources.py): the patched copy of the pinned
tree first, then the verified wheel. Each definition carries its file and
line, and whether it is ours (a new file or a line inside an injected region),
so the walker can tell vLLM's names from the overlays' own.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Protocol


class Sources(Protocol):
    def read(self, path: str) -> str | None: ...
    def is_ours(self, path: str, line: int) -> bool: ...


@dataclass(frozen=True)
class Sym:
    """A module-level name: ``module`` defines ``name`` ("" for the module)."""

    module: str
    name: str = ""

    @property
    def dotted(self) -> str:
        return f"{self.module}.{self.name}" if self.name else self.module


@dataclass
class Module:
    name: str
    path: str
    tree: ast.Module
    defs: dict[str, ast.AST] = field(default_factory=dict)
    # local name -> (module, name or "" for ``import x``), relative ones resolved
    imports: dict[str, tuple[str, str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Member:
    """Where a class member is defined and what defines it."""

    owner: Sym  # the class whose body (or method) defines it
    name: str
    kind: str  # method | property | attribute | class | enum-member
    node: ast.AST  # the def, or the annotation/assignment statement
    annotation: ast.expr | None
    value: ast.expr | None
    method: ast.FunctionDef | None  # the method assigning self.<name>, if any
    path: str
    line: int


_STOP_BASES = {"object", "ABC", "Generic", "Protocol", "NamedTuple", "Exception"}


class Index:
    def __init__(self, sources: Sources):
        self.sources = sources
        self._modules: dict[str, Module | None] = {}

    # -- modules -------------------------------------------------------------

    def module(self, name: str) -> Module | None:
        if name not in self._modules:
            self._modules[name] = self._load(name)
        return self._modules[name]

    def _load(self, name: str) -> Module | None:
        base = name.replace(".", "/")
        for path in (f"{base}.py", f"{base}/__init__.py"):
            text = self.sources.read(path)
            if text is None:
                continue
            try:
                tree = ast.parse(text, filename=path)
            except SyntaxError:
                return None
            mod = Module(name, path, tree)
            self._collect(mod, tree.body, path.endswith("__init__.py"))
            return mod
        return None

    def _collect(self, mod: Module, body: list[ast.stmt], is_pkg: bool) -> None:
        for stmt in body:
            if isinstance(stmt, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                mod.defs[stmt.name] = stmt
            elif isinstance(stmt, ast.Assign):
                for t in stmt.targets:
                    for n in _names(t):
                        mod.defs[n] = stmt
            elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                mod.defs[stmt.target.id] = stmt
            elif isinstance(stmt, ast.Import):
                for a in stmt.names:
                    if a.asname:
                        mod.imports[a.asname] = (a.name, "")
                    else:
                        top = a.name.split(".")[0]
                        mod.imports[top] = (top, "")
            elif isinstance(stmt, ast.ImportFrom):
                src = resolve_relative(mod.name, is_pkg, stmt.module, stmt.level)
                for a in stmt.names:
                    if a.name != "*":
                        mod.imports[a.asname or a.name] = (src, a.name)
            elif isinstance(stmt, ast.If):
                self._collect(mod, stmt.body, is_pkg)
                self._collect(mod, stmt.orelse, is_pkg)
            elif isinstance(stmt, ast.Try):
                self._collect(mod, stmt.body, is_pkg)
                # a fallback (``except ImportError: import x``) does not
                # replace what the body bound: the tree's own name wins
                fallback = Module(mod.name, mod.path, mod.tree)
                for h in stmt.handlers:
                    self._collect(fallback, h.body, is_pkg)
                for k, v in fallback.defs.items():
                    mod.defs.setdefault(k, v)
                for k, v in fallback.imports.items():
                    mod.imports.setdefault(k, v)

    def exists(self, module: str) -> bool:
        return self.module(module) is not None

    def is_ours(self, path: str, line: int) -> bool:
        return self.sources.is_ours(path, line)

    # -- names ---------------------------------------------------------------

    def resolve(
        self, module: str, name: str, depth: int = 0
    ) -> tuple[Sym, ast.AST | None]:
        """The definition ``name`` of ``module`` stands for: (where, node).

        A re-export (``from .x import name``) is followed to its definition; a
        name of a module outside the tree resolves to itself with no node. A
        submodule (``vllm.a`` has ``b``) is a module symbol.
        """
        mod = self.module(module)
        if mod is None or depth > 8:
            return Sym(module, name), None
        if name in mod.defs:
            return Sym(module, name), mod.defs[name]
        if name in mod.imports:
            src, orig = mod.imports[name]
            if not orig:
                return Sym(src), None
            if self.exists(f"{src}.{orig}"):
                return Sym(f"{src}.{orig}"), None
            return self.resolve(src, orig, depth + 1)
        if self.exists(f"{module}.{name}"):
            return Sym(f"{module}.{name}"), None
        return Sym(module, name), None

    def class_node(self, sym: Sym) -> ast.ClassDef | None:
        _, node = self.resolve(sym.module, sym.name) if sym.name else (sym, None)
        return node if isinstance(node, ast.ClassDef) else None

    def bases(self, sym: Sym) -> list[Sym]:
        node = self.class_node(sym)
        if node is None:
            return []
        out = []
        for b in node.bases:
            target = self.name_of(sym.module, b)
            if target is not None and target.name not in _STOP_BASES:
                out.append(target)
        return out

    def name_of(self, module: str, expr: ast.expr) -> Sym | None:
        """The symbol a ``Name`` or ``a.b.C`` expression of ``module`` names."""
        if isinstance(expr, ast.Subscript):  # Generic[T], Base[X]
            expr = expr.value
        if isinstance(expr, ast.Name):
            return self.resolve(module, expr.id)[0]
        if isinstance(expr, ast.Attribute):
            head = self.name_of(module, expr.value)
            if head is None:
                return None
            if not head.name:  # a module
                return self.resolve(head.module, expr.attr)[0]
            return Sym(head.module, f"{head.name}.{expr.attr}")
        return None

    # -- class members ---------------------------------------------------------

    def member(self, cls: Sym, name: str) -> Member | None:
        """Where ``name`` is defined for instances of ``cls`` (bases followed)."""
        seen: set[Sym] = set()
        todo = [cls]
        while todo:
            c = todo.pop(0)
            if c in seen:
                continue
            seen.add(c)
            found = self._own_member(c, name)
            if found is not None:
                return found
            todo.extend(self.bases(c))
        return None

    def _own_member(self, cls: Sym, name: str) -> Member | None:
        node = self.class_node(cls)
        if node is None:
            return None
        where, _ = self.resolve(cls.module, cls.name)
        mod = self.module(where.module)
        path = mod.path if mod else ""
        enum = self.is_enum(cls)
        for stmt in node.body:
            if (
                isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef))
                and stmt.name == name
            ):
                prop = any(
                    _decorator_name(d) in ("property", "cached_property")
                    for d in stmt.decorator_list
                )
                kind = "property" if prop else "method"
                return Member(
                    where,
                    name,
                    kind,
                    stmt,
                    stmt.returns if prop else None,
                    None,
                    None,
                    path,
                    stmt.lineno,
                )
            if isinstance(stmt, ast.ClassDef) and stmt.name == name:
                return Member(
                    where, name, "class", stmt, None, None, None, path, stmt.lineno
                )
            if (
                isinstance(stmt, ast.AnnAssign)
                and isinstance(stmt.target, ast.Name)
                and stmt.target.id == name
            ):
                return Member(
                    where,
                    name,
                    "attribute",
                    stmt,
                    stmt.annotation,
                    stmt.value,
                    None,
                    path,
                    stmt.lineno,
                )
            if isinstance(stmt, ast.Assign) and any(
                name in _names(t) for t in stmt.targets
            ):
                kind = "enum-member" if enum else "attribute"
                return Member(
                    where, name, kind, stmt, None, stmt.value, None, path, stmt.lineno
                )
        # self.<name> assigned in a method: the first annotated one, else the first
        best = None
        for stmt in node.body:
            if not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for sub in ast.walk(stmt):
                target, ann, value = None, None, None
                if isinstance(sub, ast.AnnAssign):
                    target, ann, value = sub.target, sub.annotation, sub.value
                elif isinstance(sub, ast.Assign) and len(sub.targets) == 1:
                    target, value = sub.targets[0], sub.value
                if not (
                    isinstance(target, ast.Attribute)
                    and target.attr == name
                    and isinstance(target.value, ast.Name)
                    and target.value.id == "self"
                ):
                    continue
                m = Member(
                    where, name, "attribute", sub, ann, value, stmt, path, sub.lineno
                )
                if ann is not None:
                    return m
                if best is None or (_is_none(best.value) and not _is_none(value)):
                    best = m
        return best

    def outside_base(self, cls: Sym) -> bool:
        """Whether ``cls`` derives from a class outside the tree (whose members
        a scan cannot list: logging.Logger, threading.Thread, ...)."""
        seen: set[Sym] = set()
        todo = [cls]
        while todo:
            c = todo.pop()
            if c in seen:
                continue
            seen.add(c)
            node = self.class_node(c)
            if node is None:
                if (
                    c.module not in ("enum", "abc", "typing", "builtins", "")
                    and c.name not in _STOP_BASES
                ):
                    return True
                continue
            for b in node.bases:
                target = self.name_of(c.module, b)
                if target is not None and target.name not in _STOP_BASES:
                    todo.append(target)
        return False

    def is_enum(self, cls: Sym) -> bool:
        seen: set[Sym] = set()
        todo = [cls]
        while todo:
            c = todo.pop()
            if c in seen:
                continue
            seen.add(c)
            node = self.class_node(c)
            if node is None:
                if c.module == "enum":
                    return True
                continue
            for b in node.bases:
                target = self.name_of(c.module, b)
                if target is None:
                    continue
                if target.module == "enum":
                    return True
                todo.append(target)
        return False

    def abstract_methods(self, cls: Sym) -> list[str]:
        """Names decorated @abstractmethod in ``cls`` and its bases."""
        out: set[str] = set()
        seen: set[Sym] = set()
        todo = [cls]
        while todo:
            c = todo.pop()
            if c in seen:
                continue
            seen.add(c)
            node = self.class_node(c)
            if node is None:
                continue
            for stmt in node.body:
                if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                    _decorator_name(d) == "abstractmethod" for d in stmt.decorator_list
                ):
                    out.add(stmt.name)
            todo.extend(self.bases(c))
        return sorted(out)


def resolve_relative(module: str, is_pkg: bool, target: str | None, level: int) -> str:
    if level == 0:
        return target or ""
    parts = module.split(".")
    if not is_pkg:
        parts = parts[:-1]
    if level > 1:
        parts = parts[: len(parts) - (level - 1)]
    base = ".".join(parts)
    return f"{base}.{target}" if target else base


def _names(target: ast.expr) -> list[str]:
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for e in target.elts for n in _names(e)]
    return []


def _is_none(e: ast.expr | None) -> bool:
    return isinstance(e, ast.Constant) and e.value is None


def _decorator_name(d: ast.expr) -> str:
    if isinstance(d, ast.Call):
        d = d.func
    if isinstance(d, ast.Attribute):
        return d.attr
    if isinstance(d, ast.Name):
        return d.id
    return ""


def params_of(fn: ast.FunctionDef | ast.AsyncFunctionDef, method: bool) -> list[str]:
    """Parameter names in order (positional ones, then keyword-only); the
    first one dropped for a method."""
    a = fn.args
    names = [p.arg for p in a.posonlyargs + a.args]
    if method and names:
        names = names[1:]
    names += [p.arg for p in a.kwonlyargs]
    if a.vararg:
        names.append("*" + a.vararg.arg)
    if a.kwarg:
        names.append("**" + a.kwarg.arg)
    return names


def is_static(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any(_decorator_name(d) == "staticmethod" for d in fn.decorator_list)
