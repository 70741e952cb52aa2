"""The ``kept`` argument of T1's runtime ``branch``: what of a site's function outlives a merge.

A merge gives a name a new tensor where the original's branch gives an existing one.
The function's other names keep their values (``kept = h`` before ``if c: h =
h.abs()``, then ``return h, kept``), and a caller traced into the same graph that gets
one back could compare it by identity with the merged tensor.  The runtime
(:mod:`graphmend.runtime.callers`) searches the values of the names listed here; this
module decides which: the function's locals and free variables live after the site, but
those the site rebinds, each with the constant subscripts it is only read through
afterwards (``outputs[2:]``: only those items may reach a caller).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Sequence

from graphmend.analysis.bindings import FunctionNode, items_read_after, live_after, names_read
from graphmend.analysis.scopes import ModuleScopes, Resolution
from graphmend.rewrites.common import FRAME_INTROSPECTION, tuple_of

#: Builtins that read a function's locals by no name (``locals()``, ``vars()``, ``eval``);
#: ``dir()`` lists only their names.
_READ_EVERY_LOCAL = FRAME_INTROSPECTION - {"dir"}


def kept_argument(
    scopes: ModuleScopes,
    functions: Sequence[ast.AST],
    statement: ast.stmt,
    rebound: Sequence[str],
    also: Iterable[str] = (),
) -> ast.expr:
    """``kept`` for the site ``statement`` of the innermost of ``functions``: the names
    that may be read after it, but ``rebound`` (those it binds to its results), with
    ``also`` (read whole); ``None`` (every local) where the function may read its locals
    by no name (``return locals()``)."""
    function = functions[-1]
    assert isinstance(function, FunctionNode)
    read = names_read(function)
    local = {name for name in read if scopes.resolve(name, functions) is Resolution.LOCAL}
    if read & (_READ_EVERY_LOCAL - local):
        return ast.Constant(None)
    candidates = (scopes.locals_of(function) | local) - set(rebound)  # free variables too
    live = {name for name in candidates if live_after(function, statement, name)}
    also = set(also)
    return tuple_of(
        _entry(name, None if name in also else items_read_after(function, statement, name))
        for name in sorted(live | also)
    )


def _entry(name: str, subscripts: list[ast.expr] | None) -> ast.expr:
    """``name``, an entry of ``kept``; with the constant ``subscripts`` that are all it is
    read by after the site (``outputs[2:]``), ``(name, 2, (2, None, None))`` (an int, or
    a slice as its three parts)."""
    if subscripts is None:
        return ast.Constant(name)
    selectors = [
        tuple_of(ast.Constant(_literal(part)) for part in (each.lower, each.upper, each.step))
        if isinstance(each, ast.Slice)
        else ast.Constant(_literal(each))
        for each in subscripts
    ]
    return tuple_of([ast.Constant(name), *selectors])


def _literal(node: ast.expr | None) -> int | None:
    return None if node is None else ast.literal_eval(node)
