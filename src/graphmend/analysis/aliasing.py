"""Whether a value is certainly a new tensor, one that no other name holds.

A predicated store (``self.buf = value`` in a branch) writes the merged value
into the tensor already stored there, while the original makes ``self.buf``
the very object ``value`` is.  The two agree only when nothing else can see
the difference: when ``value`` is a new tensor (the result of arithmetic, of a
torch function or of a tensor method that never returns its input or a view of
it), or a local that holds one and is not used after the ``if``.
"""

from __future__ import annotations

import ast
from collections.abc import Collection, Sequence

from graphmend.analysis.purity import PURE_TENSOR_METHODS, PURE_TORCH_FUNCTIONS, qualified_name
from graphmend.analysis.scopes import ModuleScopes

#: Calls that may return their input itself, or a view sharing its storage.
_MAY_ALIAS = frozenset(
    """
    view view_as reshape reshape_as expand expand_as permute transpose t squeeze unsqueeze
    flatten unflatten narrow movedim swapaxes detach contiguous to type type_as float double
    half bfloat16 int long bool short char byte cpu cuda pad dropout
    """.split()
)
_NEW_TORCH_FUNCTIONS = frozenset(
    name for name in PURE_TORCH_FUNCTIONS if name.rsplit(".", 1)[-1] not in _MAY_ALIAS
)
_NEW_TENSOR_METHODS = PURE_TENSOR_METHODS - _MAY_ALIAS


def is_new_tensor(
    expr: ast.expr,
    scopes: ModuleScopes,
    functions: Sequence[ast.AST],
    new_names: Collection[str] = (),
) -> bool:
    """Whether ``expr`` certainly evaluates to a new object (``new_names`` hold such)."""
    if isinstance(expr, ast.BinOp):
        return True
    if isinstance(expr, ast.UnaryOp):
        return isinstance(expr.op, ast.USub | ast.Invert)
    if isinstance(expr, ast.Name):
        return expr.id in new_names
    if isinstance(expr, ast.IfExp):
        return all(is_new_tensor(e, scopes, functions, new_names) for e in (expr.body, expr.orelse))
    if not isinstance(expr, ast.Call):
        return False
    name = qualified_name(expr.func, scopes, functions)
    if name is not None:
        return name in _NEW_TORCH_FUNCTIONS
    return isinstance(expr.func, ast.Attribute) and expr.func.attr in _NEW_TENSOR_METHODS
