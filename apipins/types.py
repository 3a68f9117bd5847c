"""The types a scan tracks, and reading them from annotations.

Only as much typing as finding vLLM's names needs: an instance of a class, a
class or module object, a function, the containers vLLM's annotations use
(list, dict, tuple, ...), and "outside" (torch, numpy, the standard library:
their members are not pinned). Anything else is unknown.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from .index import Index, Sym


@dataclass(frozen=True)
class T:
    """Unknown."""


@dataclass(frozen=True)
class Inst(T):
    cls: Sym


@dataclass(frozen=True)
class ClassObj(T):
    cls: Sym


@dataclass(frozen=True)
class ModuleObj(T):
    name: str


@dataclass(frozen=True)
class Func(T):
    sym: Sym  # a module-level function (or a class's, name "C.f")
    owner: Sym | None = None  # bound to an instance of this class
    method: str = ""


@dataclass(frozen=True)
class Gen(T):
    origin: str  # list | dict | tuple | set | iter
    args: tuple[T, ...] = ()


@dataclass(frozen=True)
class Outside(T):
    name: str


UNKNOWN = T()

_SEQUENCES = {
    "list": "list", "List": "list", "Sequence": "list", "MutableSequence": "list",
    "Iterable": "iter", "Iterator": "iter", "Collection": "list", "Generator": "iter",
    "deque": "list", "set": "set", "Set": "set", "frozenset": "set",
    "AbstractSet": "set", "KeysView": "set", "ValuesView": "list",
    "Array": "list",  # ctypes
}  # fmt: skip
_MAPPINGS = {"dict", "Dict", "Mapping", "MutableMapping", "defaultdict", "OrderedDict"}
_TUPLES = {"tuple", "Tuple"}
_TRANSPARENT = {"Optional", "Final", "ClassVar", "Annotated", "InitVar", "Required"}


def element(t: T) -> T:
    """What iterating ``t`` yields."""
    if isinstance(t, Gen):
        if t.origin in ("list", "set", "iter") and t.args:
            return t.args[0]
        if t.origin == "dict" and t.args:
            return t.args[0]
        if t.origin == "tuple" and t.args:
            if len(t.args) == 2 and t.args[1] == Gen("..."):
                return t.args[0]
            return t.args[0] if len(set(t.args)) == 1 else UNKNOWN
    return UNKNOWN


def item(t: T, index: ast.expr) -> T:
    """What ``t[index]`` is."""
    if isinstance(t, Gen):
        if t.origin == "list" and t.args:
            return t.args[0]
        if t.origin == "dict" and len(t.args) == 2:
            return t.args[1]
        if t.origin == "tuple" and t.args:
            if isinstance(index, ast.Constant) and isinstance(index.value, int):
                if t.args[-1] == Gen("...") or len(t.args) == 1:
                    return t.args[0]
                if -len(t.args) <= index.value < len(t.args):
                    return t.args[index.value]
            return element(t)
    return UNKNOWN


class Annotations:
    """Annotation expressions of a module -> types."""

    def __init__(self, index: Index):
        self.index = index

    def of(self, expr: ast.expr | None, module: str) -> T:
        if expr is None:
            return UNKNOWN
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            try:
                expr = ast.parse(expr.value, mode="eval").body
            except SyntaxError:
                return UNKNOWN
        if isinstance(expr, ast.Constant) and expr.value is None:
            return Outside("None")
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.BitOr):
            return self._union(
                [self.of(expr.left, module), self.of(expr.right, module)]
            )
        if isinstance(expr, ast.Subscript):
            return self._subscript(expr, module)
        if isinstance(expr, (ast.Name, ast.Attribute)):
            return self.named(expr, module)
        return UNKNOWN

    def named(self, expr: ast.expr, module: str) -> T:
        bare = expr.id if isinstance(expr, ast.Name) else expr.attr  # type: ignore[attr-defined]
        if bare in _SEQUENCES:
            return Gen(_SEQUENCES[bare], (UNKNOWN,))
        if bare in _MAPPINGS:
            return Gen("dict", (UNKNOWN, UNKNOWN))
        if bare in _TUPLES:
            return Gen("tuple", (UNKNOWN, Gen("...")))
        if bare in ("Any", "object", "TypeVar"):
            return UNKNOWN
        sym = self.index.name_of(module, expr)
        if sym is None:
            return UNKNOWN
        return self.instance(sym)

    def instance(self, sym: Sym) -> T:
        """An instance of what ``sym`` names, when it is a class of the tree."""
        if not sym.name:
            return Outside(sym.module)
        node = self.index.class_node(sym)
        if node is not None:
            where, _ = self.index.resolve(sym.module, sym.name)
            return Inst(where)
        if not self.index.exists(sym.module):
            return Outside(sym.dotted)
        return UNKNOWN

    def _subscript(self, expr: ast.Subscript, module: str) -> T:
        head = expr.value
        bare = head.id if isinstance(head, ast.Name) else getattr(head, "attr", "")
        args = expr.slice.elts if isinstance(expr.slice, ast.Tuple) else [expr.slice]
        if bare in _TRANSPARENT:
            return self.of(args[0], module)
        if bare == "Union":
            return self._union([self.of(a, module) for a in args])
        if bare in _SEQUENCES:
            return Gen(_SEQUENCES[bare], (self.of(args[0], module),))
        if bare in _MAPPINGS and len(args) == 2:
            return Gen("dict", (self.of(args[0], module), self.of(args[1], module)))
        if bare in _TUPLES:
            out = tuple(
                Gen("...")
                if isinstance(a, ast.Constant) and a.value is Ellipsis
                else self.of(a, module)
                for a in args
            )
            return Gen("tuple", out)
        if bare in ("type", "Type"):
            inner = self.of(args[0], module)
            return ClassObj(inner.cls) if isinstance(inner, Inst) else UNKNOWN
        return self.named(head, module)

    @staticmethod
    def _union(types: list[T]) -> T:
        """The first member that is not None (vLLM's ``X | None``)."""
        for t in types:
            if t != Outside("None"):
                return t
        return UNKNOWN
