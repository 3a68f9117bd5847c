"""Lists what a Python file imports at run time (for the stub coverage test).

Imports inside ``if TYPE_CHECKING:`` never run, so they are left out; so are
fallbacks in an ``except ImportError:`` handler (optional by design). Imports
inside functions do run (lazily), so they are kept.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass


@dataclass(frozen=True)
class Import:
    module: str  # absolute dotted module name
    name: str | None  # the imported name for `from module import name`, else None
    line: int


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(
        isinstance(t, ast.Name) and t.id in ("ImportError", "ModuleNotFoundError")
        for t in types
    )


def runtime_imports(source: str, module: str, is_package: bool) -> list[Import]:
    """Imports of one module's source; relative imports made absolute."""
    found: list[Import] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.ExceptHandler) and _catches_import_error(node):
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.append(Import(alias.name, None, node.lineno))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                if not is_package:
                    base = base[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                found.append(Import(target, alias.name, node.lineno))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(source))
    return found
