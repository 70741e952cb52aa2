"""A faster ``ast.walk``, for the analyses that read a tree many times.

``ast.walk`` yields through two nested generators per node (``iter_child_nodes``
over ``iter_fields``); on a large module the analyses spend about a third of
their time there.  :func:`walk` gives the same nodes in the same order as a list,
about twice as fast.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator


def walk(node: ast.AST) -> list[ast.AST]:
    """``node`` and every node below it, in ``ast.walk``'s (breadth-first) order.

    The list is built at once: the tree's shape must not change while it is used.
    """
    nodes = [node]
    append = nodes.append
    for current in nodes:  # grows while it is read: breadth first
        for name in current._fields:
            value = getattr(current, name, None)
            if isinstance(value, ast.AST):
                append(value)
            elif isinstance(value, list):
                for item in value:
                    if isinstance(item, ast.AST):
                        append(item)
    return nodes


def own_nodes(body: list[ast.stmt]) -> Iterator[ast.AST]:
    """The nodes of ``body``, not entering nested functions, lambdas or classes (whose
    own node is given)."""
    pending: list[ast.AST] = list(body)
    while pending:
        node = pending.pop()
        yield node
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            pending.extend(ast.iter_child_nodes(node))
