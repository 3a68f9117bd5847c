"""What a tree's vLLM release defines, for stubs and fakes that must follow it.

The harness never runs the files fixtures/*/INTERFACE fetched (they import all
of vLLM); a stub stands in. But a stub answers whatever it was written with,
so a name the release renamed would pass unnoticed (issue 43). These helpers
read the real files of the tree (apipins' reader, no import) so a stub or fake
can refuse a name its release does not have, and the sim can set the fields
each release has.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from apipins.index import Index  # noqa: E402


class _TreeFiles:
    """The tree's files as apipins reads them (nothing of it is ours)."""

    def __init__(self, tree: Path):
        self.tree = tree

    def read(self, path: str) -> str | None:
        p = self.tree / path
        return p.read_text(encoding="utf-8") if p.is_file() else None

    def is_ours(self, path: str, line: int) -> bool:
        return False


@functools.cache
def _index(tree: Path) -> Index:
    return Index(_TreeFiles(tree))


def members(
    tree: str | Path, module: str, cls: str, class_level: bool = False
) -> frozenset[str] | None:
    """Every member name of the real ``module.cls`` in ``tree`` (bases
    followed), or None when the tree does not hold that class's file.
    ``class_level``: only what the class itself defines (methods,
    properties, class attributes), not what its instances are given."""
    index = _index(Path(tree).resolve())
    from apipins.index import Sym

    node = index.class_node(Sym(module, cls))
    if node is None:
        return None
    out: set[str] = set()
    seen: set[Sym] = set()
    todo = [index.resolve(module, cls)[0]]
    while todo:
        c = todo.pop()
        if c in seen:
            continue
        seen.add(c)
        n = index.class_node(c)
        if n is None:
            continue
        import ast

        for stmt in ast.walk(n):
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.add(stmt.name)
            elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                out.add(stmt.target.id)
            elif isinstance(stmt, ast.Assign):
                out.update(t.id for t in stmt.targets if isinstance(t, ast.Name))
            elif (
                not class_level
                and isinstance(stmt, ast.Attribute)
                and isinstance(stmt.ctx, ast.Store)
                and isinstance(stmt.value, ast.Name)
                and stmt.value.id == "self"
            ):
                out.add(stmt.attr)
        todo.extend(index.bases(c))
    return frozenset(out)


def imitate(cls: type, tree: str | Path | None, qualname: str) -> None:
    """Give a stub class a placeholder for each method or property the
    release's real class has and the stub does not, so a probe of the
    class (``hasattr(Request, "x")``) answers as vLLM's would; a value is
    still set per instance by the sim."""
    if tree is None:
        return
    module, _, name = qualname.rpartition(".")
    for member in members(tree, module, name, class_level=True) or ():
        if not member.startswith("__") and not hasattr(cls, member):
            setattr(cls, member, None)


def check_fields(tree: str | Path, qualname: str, names) -> None:
    """Raises AttributeError when the real class ``qualname`` ("vllm.a.b.C")
    of the tree's release lacks one of ``names`` (a stub must not answer a
    name its release does not have). A class the tree does not hold is not
    checked."""
    module, _, cls = qualname.rpartition(".")
    real = members(tree, module, cls)
    if real is None:
        return
    missing = sorted(set(names) - real)
    if missing:
        raise AttributeError(
            f"{qualname} of the release in {tree} has no {', '.join(missing)}: "
            "the stub or fake setting it no longer imitates vLLM"
        )
