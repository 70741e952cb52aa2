"""The one path from source to code: parse, analyse, rewrite, compile.

Used alike by the import hook, ``python -m graphmend run``, ``cache warm``,
``explain`` and the tests.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Collection
from dataclasses import dataclass
from types import CodeType

from graphmend.analysis.scopes import ModuleScopes
from graphmend.findings import Finding
from graphmend.rewrites import REWRITES
from graphmend.rewrites.common import (
    RUNTIME,
    TRACING,
    ModuleContext,
    load,
    locate,
    mark_generated,
    store,
)


@dataclass(frozen=True)
class Rewritten:
    """A module after the rewrites: its tree and a finding per candidate site."""

    tree: ast.Module
    findings: tuple[Finding, ...]
    changed: bool


def parse(source: bytes | str, filename: str) -> ast.Module:
    """Parse like the interpreter does (coding cookie honoured); raises ``SyntaxError``."""
    tree = compile(source, filename, "exec", ast.PyCF_ONLY_AST, dont_inherit=True)
    assert isinstance(tree, ast.Module)
    return tree


def rewrite(source: bytes | str, filename: str, rewrites: Collection[str]) -> Rewritten:
    """Parse ``source`` and apply the named rewrites (in the pipeline's order)."""
    tree = parse(source, filename)
    text = importlib.util.decode_source(source) if isinstance(source, bytes) else source
    torch_import = _first_torch_import(tree)
    module = ModuleContext(
        filename=filename,
        lines=text.splitlines(),
        scopes=ModuleScopes(tree),
        imports_torch=torch_import is not None,
    )
    for name, rewriter in REWRITES.items():
        if name in rewrites:
            rewriter(module).run(tree)
    if module.changed:
        assert torch_import is not None
        _insert_prelude(tree, torch_import, module.module_level)
    return Rewritten(tree, tuple(module.findings), module.changed)


def compile_module(tree: ast.Module, filename: str) -> CodeType:
    """Compile a (rewritten) module tree with the interpreter's optimisation level."""
    return compile(tree, filename, "exec", dont_inherit=True)


def _is_torch(module: str | None) -> bool:
    return module is not None and (module == "torch" or module.startswith("torch."))


def _first_torch_import(tree: ast.Module) -> ast.stmt | None:
    """The first statement of the module body that imports torch unconditionally."""
    for statement in tree.body:
        if isinstance(statement, ast.Import) and any(_is_torch(a.name) for a in statement.names):
            return statement
        if (
            isinstance(statement, ast.ImportFrom)
            and statement.level == 0
            and _is_torch(statement.module)
        ):
            return statement
    return None


def _insert_prelude(tree: ast.Module, after: ast.stmt, generated: list[ast.stmt]) -> None:
    """Bind the runtime right after the module's own torch import, then the generated code.

    Placing it there keeps the module's import order: torch is imported where
    the module imports it, not earlier.
    """
    prelude: list[ast.stmt] = [
        ast.Import(names=[ast.alias(name="graphmend.runtime", asname=RUNTIME)]),
        ast.Assign(
            targets=[store(TRACING)],
            value=ast.Attribute(value=load(RUNTIME), attr="tracing", ctx=ast.Load()),
        ),
    ]
    for statement in prelude:
        mark_generated(locate(statement, after))
    index = tree.body.index(after) + 1
    tree.body[index:index] = prelude + generated
