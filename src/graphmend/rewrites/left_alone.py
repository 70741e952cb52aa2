"""The definitions the source asks GraphMend to leave alone, found before any analysis.

A function or class decorated with ``graphmend.do_not_rewrite``, or a function
with ``torch.compiler.disable`` / ``torch._dynamo.disable`` (TorchDynamo never
traces such a function nor anything it calls, so a rewrite there could never
take effect), or with ``functools.lru_cache`` / ``functools.cache`` (TorchDynamo
traces through the cache, calling the function afresh each time, where the
original's graph break inside it runs the cache: a cached tensor the caller
updates in place would be a new one on every call, a message printed once printed
every time).  So is a function that reads its own frame's locals by no name
(``locals()``, ``vars()``, ``dir()``, ``eval``, ``exec``): the names a rewrite adds
to the frame would be among them (``combine(**locals())`` would be given one).

A decorator is recognised by the name it resolves to through the module's imports,
as AutoGraph resolves its directives;
``disable(recursive=False)`` skips only the function's own frame, so it is not a
reason to leave the function alone.  (A module marked ``# graphmend: skip-file``
is found without parsing, by :func:`graphmend.directives.skipped_module`.)
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Sequence

from graphmend.analysis.purity import qualified_name
from graphmend.analysis.scopes import ModuleScopes
from graphmend.analysis.walking import own_nodes
from graphmend.directives import LeftAlone

_DIRECTIVES = frozenset({"graphmend.do_not_rewrite", "graphmend.directives.do_not_rewrite"})
_DYNAMO_DISABLES = frozenset({"torch.compiler.disable", "torch._dynamo.disable"})
_CACHES = frozenset({"functools.lru_cache", "functools.cache"})
#: Builtins that read the calling frame's locals when called without arguments (``eval``
#: and ``exec`` with any: their code may).
_READING_LOCALS = frozenset({"builtins.locals", "builtins.vars", "builtins.dir"})
_RUNNING_CODE = frozenset({"builtins.eval", "builtins.exec"})


_Definition = tuple[ast.FunctionDef | ast.ClassDef, LeftAlone]


def left_alone_definitions(tree: ast.Module, scopes: ModuleScopes) -> Iterator[_Definition]:
    """The outermost functions and classes of ``tree`` that a decorator leaves alone, and
    the module's functions it wraps in a cache by a call (``f = lru_cache()(_f)``)."""
    cached = _cached_by_a_call(tree, scopes)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in cached:
            reason = f"left alone: {cached[node.name]}, which {_THROUGH_THE_CACHE}"
            yield node, LeftAlone(node.lineno, node.col_offset, node.name, reason)
    rest = [
        node
        for node in tree.body
        if not (isinstance(node, ast.FunctionDef) and node.name in cached)
    ]
    yield from _visit(rest, "", (), scopes)


#: Why a function a cache wraps is left alone.
_THROUGH_THE_CACHE = "TorchDynamo calls through without its cache where no graph break stops it"


def _cached_by_a_call(tree: ast.Module, scopes: ModuleScopes) -> dict[str, str]:
    """The module's functions wrapped in ``functools.lru_cache``/``cache`` by a call at
    module level (``f = lru_cache(maxsize=None)(_f)``, ``f = cache(_f)``), by name, with
    how it is spelled."""
    cached = {}
    for node in tree.body:
        value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
        if not isinstance(value, ast.Call) or len(value.args) != 1:
            continue
        wrapper = value.func.func if isinstance(value.func, ast.Call) else value.func
        wrapped = value.args[0]
        if isinstance(wrapped, ast.Name) and qualified_name(wrapper, scopes, ()) in _CACHES:
            cached[wrapped.id] = f"wrapped by {ast.unparse(value)}"
    return cached


def _visit(
    block: Sequence[ast.AST], prefix: str, functions: tuple[ast.AST, ...], scopes: ModuleScopes
) -> Iterator[_Definition]:
    for node in block:
        if isinstance(node, ast.AsyncFunctionDef):
            continue  # no rewrite enters a coroutine
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            reason = _reason(node, scopes, functions)
            if reason is not None:
                yield node, LeftAlone(node.lineno, node.col_offset, prefix + node.name, reason)
            elif isinstance(node, ast.FunctionDef):
                inner = f"{prefix}{node.name}.<locals>."
                yield from _visit(node.body, inner, (*functions, node), scopes)
            else:
                yield from _visit(node.body, f"{prefix}{node.name}.", functions, scopes)
        else:  # a statement, handler or case, maybe holding blocks (if, try, with, match...)
            children = [child for child in ast.iter_child_nodes(node) if _in_block(child)]
            yield from _visit(children, prefix, functions, scopes)


def _in_block(node: ast.AST) -> bool:
    return isinstance(node, ast.stmt | ast.excepthandler | ast.match_case)


def _reason(
    definition: ast.FunctionDef | ast.ClassDef,
    scopes: ModuleScopes,
    functions: tuple[ast.AST, ...],
) -> str | None:
    """Why a decorator leaves ``definition`` alone, or ``None``."""
    for decorator in definition.decorator_list:
        spelled = ast.unparse(decorator)
        if qualified_name(decorator, scopes, functions) in _DIRECTIVES:
            return f"left alone: decorated with @{spelled}"
        if isinstance(definition, ast.FunctionDef) and _disables_dynamo(
            decorator, scopes, functions
        ):
            return f"left alone: decorated with @{spelled}, so TorchDynamo never traces it"
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if qualified_name(target, scopes, functions) in _CACHES:
            return f"left alone: decorated with @{spelled}, which {_THROUGH_THE_CACHE}"
    if isinstance(definition, ast.FunctionDef):
        reader = _reads_its_locals(definition, scopes, (*functions, definition))
        if reader is not None:
            return (
                f"left alone: it calls {reader}, which would list the names GraphMend adds to "
                "its frame"
            )
    return None


def _reads_its_locals(
    function: ast.FunctionDef, scopes: ModuleScopes, functions: tuple[ast.AST, ...]
) -> str | None:
    """``locals()``, ``vars()``, ``dir()``, ``eval(...)`` or ``exec(...)`` called in
    ``function``'s own body (as it is spelled), or ``None``."""
    for node in own_nodes(function.body):
        if not isinstance(node, ast.Call):
            continue
        name = qualified_name(node.func, scopes, functions)
        if (name in _READING_LOCALS and not node.args and not node.keywords) or (
            name in _RUNNING_CODE
        ):
            return f"{ast.unparse(node.func)}()"
    return None


def _disables_dynamo(
    decorator: ast.expr, scopes: ModuleScopes, functions: tuple[ast.AST, ...]
) -> bool:
    """``@torch.compiler.disable``, or called with no arguments but ``recursive=True``."""
    call = decorator if isinstance(decorator, ast.Call) else None
    target = call.func if call is not None else decorator
    if qualified_name(target, scopes, functions) not in _DYNAMO_DISABLES:
        return False
    if call is None:
        return True
    return not call.args and all(
        keyword.arg == "reason"
        or (
            keyword.arg == "recursive"
            and isinstance(keyword.value, ast.Constant)
            and keyword.value.value is True
        )
        for keyword in call.keywords
    )
