"""What T1's sites share, an ``if`` statement (:mod:`graphmend.rewrites.predicate`) or a
conditional expression (:mod:`graphmend.rewrites.conditional_expressions`): reading
ahead of time the submodules a branch calls, and the check that code after a site
cannot tell a merged value (a new tensor) from the object the original binds.
"""

from __future__ import annotations

import ast

from graphmend.analysis.bindings import identity_used_after, used_in_place_after
from graphmend.rewrites.common import (
    Decline,
    FunctionStatementRewriter,
    load,
    mangled,
    runtime_call,
)


def safe_attribute_chain(
    chain: ast.expr, bound: frozenset[str] | set[str], class_name: str | None
) -> ast.expr:
    """``a.b.c`` as ``_@gm_rt.attribute(_@gm_rt.attribute(a, "b"), "c")``: read ahead of time,
    a missing attribute (``a`` is ``None``) gives MISSING instead of an exception.
    Private names are mangled as in ``class_name``, where the chain is written.

    ``a`` must be bound at that point; else the site is declined.
    """
    if isinstance(chain, ast.Attribute):
        inner = safe_attribute_chain(chain.value, bound, class_name)
        return runtime_call("attribute", inner, ast.Constant(mangled(chain.attr, class_name)))
    if isinstance(chain, ast.Name) and chain.id in bound:
        return load(chain.id)
    raise Decline(f"it calls {ast.unparse(chain)}..., which may not be bound before the if")


def submodule_read(
    chain: ast.expr, bound: frozenset[str] | set[str], class_name: str | None
) -> ast.expr:
    """What a branch calls (``self.proj``, ``h.tril``), read as :func:`safe_attribute_chain`
    does, its last attribute through ``_@gm_rt.callee``: a tensor's method is no submodule."""
    if isinstance(chain, ast.Attribute):
        owner = safe_attribute_chain(chain.value, bound, class_name)
        return runtime_call("callee", owner, ast.Constant(mangled(chain.attr, class_name)))
    return safe_attribute_chain(chain, bound, class_name)


def check_not_told_apart_after(
    rewriter: FunctionStatementRewriter, site: ast.stmt, name: str, what: str
) -> None:
    """Decline when code after ``site`` could tell a merged ``name`` (a new tensor) from
    the object the original binds there: by updating it in place, or by its identity
    (there, or in a function of the module it is passed to)."""
    functions = rewriter.enclosing.functions
    function = functions[-1]
    assert isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef)
    if used_in_place_after(function, site, name):
        raise Decline(
            f"{name} is updated in place after {what}; a merged value is a new tensor, so "
            "the update would no longer reach the object it held"
        )
    if identity_used_after(function, site, name, rewriter.module.callees, functions):
        raise Decline(
            f"{name}'s identity is used after {what} (is, id(), data_ptr()); a merged "
            "value is a new tensor, not the object the original holds"
        )
