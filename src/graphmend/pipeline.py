"""The one path from source to code: parse, analyse, rewrite, compile.

Used alike by the import hook, ``python -m graphmend run``, ``cache warm``,
``explain`` and the tests.  What the source asks to leave alone (a
``# graphmend: skip-file`` comment, ``@graphmend.do_not_rewrite``) is honoured
here, before any analysis, and recorded as a finding.
"""

from __future__ import annotations

import ast
import re
import warnings
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import CodeType
from typing import TypeVar

from graphmend.analysis.scopes import ModuleScopes
from graphmend.compiling import parse_source, source_text
from graphmend.directives import LeftAlone, skipped_module
from graphmend.findings import Decision, Finding
from graphmend.rewrites import REWRITES
from graphmend.rewrites.common import (
    PREFIX,
    RUNTIME,
    TRACING,
    ModuleContext,
    leave_alone,
    load,
    locate,
    make_function,
    mark_generated,
    store,
)
from graphmend.rewrites.left_alone import left_alone_definitions

# The rewrites' findings name the rewrite; a directive concerns them all.
ALL_REWRITES = "all"


@dataclass(frozen=True)
class Rewritten:
    """A module after the rewrites: its tree and a finding per candidate site."""

    tree: ast.Module
    findings: tuple[Finding, ...]
    changed: bool


def parse(source: bytes | str, filename: str, *, quiet: bool = False) -> ast.Module:
    """Parse like the interpreter does (coding cookie honoured); raises ``SyntaxError``.

    ``quiet``: without the parser's warnings (the caller's compile issued them).
    """
    if quiet:
        return parse_quietly(source, filename)[0]
    return parse_source(source, filename)


def parse_quietly(source: bytes | str, filename: str) -> tuple[ast.Module, bool]:
    """:func:`parse` without the parser's warnings; and whether it issued any."""
    return _quietly(lambda: parse(source, filename), filename)


def rewrite(
    source: bytes | str,
    filename: str,
    rewrites: Collection[str],
    *,
    tree: ast.Module | None = None,
) -> Rewritten:
    """Apply the named rewrites (in the pipeline's order) to ``source``.

    ``tree`` is ``parse(source, filename)`` when the caller has parsed it already;
    parsing errors come only from :func:`parse`, so that a caller can tell them
    from a failure of a rewrite.
    """
    skipped = skipped_module(source)
    if tree is None:
        tree = parse(source, filename)
    if skipped is not None:
        return Rewritten(tree, (finding(skipped, filename, _lines(source)),), changed=False)
    text = _text(source)
    module = ModuleContext(
        filename=filename,
        text=text,
        lines=text.split("\n"),  # numbered as the parser numbers them: not at a form feed
        scopes=ModuleScopes(tree),
    )
    for definition, left_alone in left_alone_definitions(tree, module.scopes):
        leave_alone(definition)
        module.findings.append(finding(left_alone, filename, module.lines))
    for name, rewriter in REWRITES.items():
        if name in rewrites:
            rewriter(module).run(tree)
    if module.changed:
        torch_import = _first_torch_import(tree)  # found again: rewrites rebuild blocks
        if torch_import is None:
            _insert_late_prelude(tree, module.module_level)
        else:
            _insert_prelude(tree, torch_import, module.module_level)
    return Rewritten(tree, tuple(module.findings), module.changed)


def finding(left_alone: LeftAlone, filename: str, lines: list[str]) -> Finding:
    """The finding of a directive: every rewrite declines the module or definition."""
    return Finding(
        rewrite=ALL_REWRITES,
        filename=filename,
        lineno=left_alone.lineno,
        col=left_alone.col,
        function=left_alone.qualname,
        decision=Decision.DECLINED,
        reason=left_alone.reason,
        source=lines[left_alone.lineno - 1].strip(),
    )


def _lines(source: bytes | str) -> list[str]:
    return _text(source).split("\n")


def _text(source: bytes | str) -> str:
    """The source as text, newlines translated as the interpreter reads it."""
    if isinstance(source, bytes):
        return source_text(source)
    return source.replace("\r\n", "\n").replace("\r", "\n")


def compile_module(tree: ast.Module, filename: str) -> CodeType:
    """Compile a (rewritten) module tree with the interpreter's optimisation level,
    without the compiler's warnings (see :func:`compile_noting_warnings`)."""
    return compile_noting_warnings(tree, filename)[0]


def compile_noting_warnings(tree: ast.Module, filename: str) -> tuple[CodeType, bool]:
    """Compile a (rewritten) module tree with the interpreter's optimisation level;
    and whether the compiler warned.

    The compiler's own warnings (``"is" with a literal``, ``assertion is always
    true``) concern the original code, which the rewrites copy into generated
    functions: compiling the copies would issue each once per copy.  The tree is
    compiled without them; the caller has Python compile the original when Python
    would (no valid ``.pyc``), which issues them as Python's own import does.
    """
    return _quietly(lambda: compile(tree, filename, "exec", dont_inherit=True), filename)


_T = TypeVar("_T")


def _quietly(step: Callable[[], _T], filename: str) -> tuple[_T, bool]:
    """Run ``step``, a parse or compile of ``filename``, without the warnings it issues
    about that file; and whether it issued any.  Those warnings are made errors first,
    which stops the step at the first (the parser and the compiler raise
    ``SyntaxError`` for it); the step then runs again with them ignored."""
    try:
        with _warnings_about(filename, "error"):
            return step(), False
    except (SyntaxError, Warning):
        pass  # a real syntax error is raised again below
    with _warnings_about(filename, "ignore"):
        return step(), True


@contextmanager
def _warnings_about(filename: str, action: str) -> Iterator[None]:
    """Apply ``action`` to the warnings about ``filename`` (the parser's and the
    compiler's name it, and their module is its name without ``.py``) in this block,
    and to no other: a filter put first into the list of filters in place, and taken
    out of that list after.

    Swapping the filters or ``showwarning`` (as ``catch_warnings`` does) would change
    them for every thread, and a ``catch_warnings`` block another thread entered
    meanwhile would put the swapped ones back for good.  The filters' version is left
    as it is, so no module's ``__warningregistry__`` is reset (the parser and the
    compiler pass none, so no registry hides these warnings from the filter).
    """
    stem = filename[:-3] if filename.lower().endswith(".py") else filename
    module = re.compile(re.escape(stem) + r"(?:\.[pP][yY])?\Z")
    entry = (action, None, Warning, module, 0)
    filters = warnings.filters
    filters.insert(0, entry)
    try:
        yield
    finally:
        # and from the list in force now: another thread's catch_warnings block entered
        # meanwhile holds a copy of the filters, the entry included
        for held in {id(filters): filters, id(warnings.filters): warnings.filters}.values():
            for index, item in enumerate(held):
                if item is entry:
                    del held[index]
                    break


def _is_torch(module: str | None) -> bool:
    return module is not None and (module == "torch" or module.startswith("torch."))


def _imports_torch(statement: ast.stmt) -> bool:
    if isinstance(statement, ast.Import):
        return any(_is_torch(alias.name) for alias in statement.names)
    return (
        isinstance(statement, ast.ImportFrom)
        and statement.level == 0
        and _is_torch(statement.module)
    )


@dataclass(frozen=True)
class _TorchImport:
    """Where the module first imports torch: a statement in a block of the module."""

    block: list[ast.stmt]
    statement: ast.stmt


def _first_torch_import(tree: ast.Module) -> _TorchImport | None:
    """The module's first unconditional torch import, else its first one an ``if``/``try``
    deep (``if is_torch_available(): import torch``; never under ``if TYPE_CHECKING:``)."""
    for statement in tree.body:
        if _imports_torch(statement):
            return _TorchImport(tree.body, statement)
    for statement in tree.body:
        if isinstance(statement, ast.If | ast.Try) and not _is_type_checking(statement):
            for block in (statement.body, statement.orelse):
                for inner in block:
                    if _imports_torch(inner):
                        return _TorchImport(block, inner)
    return None


def _is_type_checking(statement: ast.stmt) -> bool:
    if not isinstance(statement, ast.If):
        return False
    test = statement.test
    name = test.attr if isinstance(test, ast.Attribute) else getattr(test, "id", None)
    return name == "TYPE_CHECKING"


def _insert_prelude(
    tree: ast.Module, torch_import: _TorchImport, generated: list[ast.stmt]
) -> None:
    """Bind the runtime right after the module's own torch import, then the generated code.

    Placing it there keeps the module's import order: torch is imported where
    the module imports it, not earlier.  Before anything else the module binds
    the tracing check to ``bool`` (so ``_@gm_tracing()`` is False): code that runs
    before the torch import, or when a conditional one is skipped, cannot be
    traced anyway; and a module ``__dir__`` that hides the injected names.
    """
    after = torch_import.statement
    prelude = _bind_runtime()
    for statement in prelude:
        mark_generated(locate(statement, after))
    index = torch_import.block.index(after) + 1
    torch_import.block[index:index] = prelude + _defined_at(generated, after)
    _insert_top(tree, [])


def _insert_late_prelude(tree: ast.Module, generated: list[ast.stmt]) -> None:
    """Bind the runtime into a module that never imports torch, once torch is imported.

    Code of such a module is traced when torch code calls it (a configuration's
    property read in ``forward``), and until torch is imported nothing can be
    traced, so the module does not import torch earlier than it would: a function
    binds the runtime and defines the generated code as globals, and
    :func:`graphmend.post_import.when_imported` calls it once torch is imported.
    """
    names = [RUNTIME, TRACING, *(statement.name for statement in generated)]  # type: ignore[attr-defined]
    body = [ast.Global(names=names), *_bind_runtime(), *_defined_at(generated, _top(tree))]
    bind = make_function(f"{PREFIX}bind", ["torch_module"], body, [])
    post_import = f"{PREFIX}post_import"
    when_imported = ast.Attribute(value=load(post_import), attr="when_imported", ctx=ast.Load())
    schedule = [
        ast.Import(names=[ast.alias(name="graphmend.post_import", asname=post_import)]),
        ast.Expr(
            ast.Call(func=when_imported, args=[ast.Constant("torch"), load(bind.name)], keywords=[])
        ),
    ]
    _insert_top(tree, [bind, *schedule])


def _bind_runtime() -> list[ast.stmt]:
    """``import graphmend.runtime as _@gm_rt; _@gm_tracing = _@gm_rt.tracing``."""
    return [
        ast.Import(names=[ast.alias(name="graphmend.runtime", asname=RUNTIME)]),
        ast.Assign(
            targets=[store(TRACING)],
            value=ast.Attribute(value=load(RUNTIME), attr="tracing", ctx=ast.Load()),
        ),
    ]


def _insert_top(tree: ast.Module, after_top: list[ast.stmt]) -> None:
    """Before anything else: the tracing check bound to ``bool`` and ``__dir__``, then
    ``after_top``, all on the line of the statement they precede, which runs next: a
    tracer (coverage.py, pdb) sees the lines run that Python runs, in the same order."""
    where = _top(tree)
    top = [
        ast.Assign(targets=[store(TRACING)], value=load("bool")),
        *_unlocated(ast.parse(_DIR).body),
        *after_top,
    ]
    for statement in top:
        mark_generated(locate(statement, where))
    index = _after_future_imports(tree)
    tree.body[index:index] = top


def _top(tree: ast.Module) -> ast.stmt:
    """The module's first statement after its docstring and ``__future__`` imports."""
    return tree.body[min(_after_future_imports(tree), len(tree.body) - 1)]


def _unlocated(statements: list[ast.stmt]) -> list[ast.stmt]:
    """``statements`` without source locations (parsed from GraphMend's text, whose
    lines are not the module's), for :func:`locate` to give them one."""
    for node in (node for statement in statements for node in ast.walk(statement)):
        for attribute in ("lineno", "col_offset", "end_lineno", "end_col_offset"):
            if hasattr(node, attribute):
                delattr(node, attribute)
    return statements


def _defined_at(definitions: list[ast.stmt], anchor: ast.stmt) -> list[ast.stmt]:
    """Generated functions defined on ``anchor``'s line, their bodies left on the lines
    of the code they run: on those lines, the definitions made a tracer (coverage.py,
    pdb) see code run at import that Python runs only when the function does."""
    for definition in definitions:
        decorators = getattr(definition, "decorator_list", [])
        for node in (definition, *(node for each in decorators for node in ast.walk(each))):
            if "lineno" in node._attributes:
                node.lineno = node.end_lineno = anchor.lineno
                node.col_offset = node.end_col_offset = anchor.col_offset
    return definitions


# ``dir(module)`` as without GraphMend (PEP 562).  It reads its own globals, so it needs
# no name the module could rebind; a ``__dir__`` the module defines replaces it.  A loop,
# not a comprehension: the code object's marshal bytes then do not depend on whether it
# was just compiled or read back from the cache.
_DIR = f"""
def __dir__():
    names = []
    for name in __dir__.__globals__:
        if name != "__dir__" and not name.startswith({PREFIX!r}):
            names.append(name)
    return names
"""


def _after_future_imports(tree: ast.Module) -> int:
    """The index after the docstring and ``from __future__`` imports."""
    index = 0
    for index, statement in enumerate(tree.body):
        docstring = (
            index == 0
            and isinstance(statement, ast.Expr)
            and isinstance(statement.value, ast.Constant)
        )
        future = isinstance(statement, ast.ImportFrom) and statement.module == "__future__"
        if not (docstring or future):
            return index
    return len(tree.body)
