"""Readable names for the code GraphMend generates, as ``diff`` shows it.

The rewrites name what they add ``_@gm_...`` (``_@gm_cond1``, ``_@gm_rt`` for
the runtime): no source can spell such a name, so it never collides with the
module's own, but it does not read as Python.  ``diff`` shows a copy instead:

* the runtime reads ``graphmend.runtime`` (the module it is), its tracing
  check ``graphmend.runtime.tracing()``, and the statement binding that check
  to a module global is left out;
* every other generated name reads ``graphmend_<role><n>`` (``graphmend_cond1``,
  ``graphmend_then1``).

A shown name must not be mistaken for one of the module's: when its source
spells a name starting with ``graphmend_``, the prefix takes one more
underscore (``graphmend__cond1``) until no name of the source starts with it;
when it binds ``graphmend`` to anything but the package (``graphmend = None``),
the runtime reads ``<prefix>runtime``, imported under that name.
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Iterator

from graphmend.rewrites.common import PREFIX, RUNTIME, TRACING

PACKAGE = "graphmend"
_NAME_FIELDS = ("id", "arg", "attr", "name", "asname", "rest")


class Display(ast.NodeTransformer):
    """Renders generated code of one module with readable names."""

    def __init__(self, original: ast.Module) -> None:
        spelled = list(_spelled_names(original))
        self.prefix = f"{PACKAGE}_"
        while any(name.startswith(self.prefix) for name, _ in spelled):
            self.prefix += "_"
        plain_imports = {
            id(alias)
            for node in ast.walk(original)
            if isinstance(node, ast.Import)
            for alias in node.names
            if alias.asname is None
        }
        means_package = all(
            id(node) in plain_imports
            or (isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load))
            for name, node in spelled
            if name == PACKAGE
        )
        self.runtime = f"{PACKAGE}.runtime" if means_package else f"{self.prefix}runtime"

    def render(self, statements: list[ast.stmt]) -> str:
        """The source of ``statements`` with readable names (they are left unchanged)."""
        shown = [self.visit(copy.deepcopy(statement)) for statement in statements]
        return "\n".join(ast.unparse(statement) for statement in shown if statement is not None)

    def _shown(self, generated: str) -> str:
        """``_@gm_cond1`` as ``graphmend_cond1``; a module-level function's digest
        (``_@gm_defer2@<digest>``) is left out."""
        return self.prefix + generated[len(PREFIX) :].partition("@")[0]

    def visit_Name(self, node: ast.Name) -> ast.expr:
        if node.id in (RUNTIME, TRACING):
            dotted = self.runtime + (".tracing" if node.id == TRACING else "")
            return ast.copy_location(ast.parse(dotted, mode="eval").body, node)
        if node.id.startswith(PREFIX):
            node.id = self._shown(node.id)
        return node

    def visit_Assign(self, node: ast.Assign) -> ast.Assign | None:
        targets = node.targets
        if len(targets) == 1 and isinstance(targets[0], ast.Name) and targets[0].id == TRACING:
            return None  # the check shows as graphmend.runtime.tracing itself
        return self.generic_visit(node)  # type: ignore[return-value]

    def visit_alias(self, node: ast.alias) -> ast.alias:
        if node.asname == RUNTIME:
            node.asname = None if self.runtime == node.name else self.runtime
        elif node.asname is not None and node.asname.startswith(PREFIX):
            node.asname = self._shown(node.asname)
        return node

    def visit_Global(self, node: ast.Global) -> ast.Global | None:
        """The runtime and its check read as ``graphmend.runtime``: not listed; the
        module's own names (``global COUNT``) are shown as they are."""
        node.names = [
            self._shown(n) if n.startswith(PREFIX) else n
            for n in node.names
            if n not in (RUNTIME, TRACING)
        ]
        return node if node.names else None

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.FunctionDef:
        if node.name.startswith(PREFIX):
            node.name = self._shown(node.name)
        return self.generic_visit(node)  # type: ignore[return-value]


def _spelled_names(tree: ast.AST) -> Iterator[tuple[str, ast.AST]]:
    """Every name the source spells (variables, parameters, attributes, definitions,
    imports, keywords...), with the node spelling it."""
    for node in ast.walk(tree):
        names = list(node.names) if isinstance(node, ast.Global | ast.Nonlocal) else []
        names += [getattr(node, field, None) for field in _NAME_FIELDS]
        for name in names:
            if isinstance(name, str):
                yield name.split(".", 1)[0], node
