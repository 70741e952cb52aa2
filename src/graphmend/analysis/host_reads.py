"""Which expressions may read tensor data on the host (and so break a graph there).

A predicated branch runs as a generated function inside the graph, and under
``torch.cond`` as a subgraph of its own: a host read there (``bool()`` of a
tensor through ``and``/``or``/``not``/``a if t else b``, ``.item()``,
``float(t)``, ``min(t, u)``, ``torch.equal``...) would break the graph inside
the branch function, or make ``torch.cond`` fail, where the original program
broke only at the ``if``.  Any local may be a tensor here: the question is what
*might* read the host, so unknown values count.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence

from graphmend.analysis.purity import may_hold_tensor_data, qualified_name
from graphmend.analysis.scopes import ModuleScopes

#: Tensor methods that return a Python value read from the tensor's data.
_HOST_METHODS = frozenset(
    {"item", "tolist", "equal", "allclose", "is_nonzero", "numpy", "__bool__"}
)
#: torch functions that return a Python value read from tensor data.
_HOST_FUNCTIONS = frozenset({"torch.equal", "torch.allclose", "torch.is_nonzero"})
#: Builtins that read a tensor argument on the host (its truth, its value or its text).
_HOST_BUILTINS = frozenset(
    f"builtins.{name}"
    for name in "bool int float complex round min max any all range str repr format".split()
)


class HostReads:
    """Finds host reads in expressions of the functions ``functions`` (innermost last)."""

    def __init__(
        self,
        scopes: ModuleScopes,
        functions: Sequence[ast.AST],
        tensor_names: frozenset[str] | None = None,
    ) -> None:
        """``tensor_names``: the locals that may hold tensors (default: every local)."""
        self.scopes = scopes
        self.functions = functions
        if tensor_names is None:
            tensor_names = scopes.locals_of(functions[-1]) if functions else frozenset()
        self._unknown = tensor_names

    def problem(self, expr: ast.expr) -> str | None:
        """Why ``expr`` may read tensor data on the host (``None``: it cannot)."""
        found = self.first(expr)
        return (
            None
            if found is None
            else f"{found}, which reads tensor data on the host inside a branch"
        )

    def first(self, expr: ast.expr) -> str | None:
        """The first part of ``expr`` that may read tensor data on the host, described."""
        for node in ast.walk(expr):
            found = self._node(node)
            if found is not None:
                return found
        return None

    def _may_be_tensor(self, expr: ast.expr) -> bool:
        return may_hold_tensor_data(expr, self.scopes, self.functions, self._unknown)

    def _node(self, node: ast.AST) -> str | None:
        if isinstance(node, ast.IfExp) and self._may_be_tensor(node.test):
            return f"a conditional expression on `{ast.unparse(node.test)}`"
        if isinstance(node, ast.BoolOp) and any(self._may_be_tensor(v) for v in node.values[:-1]):
            return f"`{ast.unparse(node)}`"
        if (
            isinstance(node, ast.UnaryOp)
            and isinstance(node.op, ast.Not)
            and self._may_be_tensor(node.operand)
        ):
            return f"`{ast.unparse(node)}`"
        if isinstance(node, ast.Compare) and len(node.ops) > 1 and self._may_be_tensor(node):
            return f"the chained comparison `{ast.unparse(node)}`"
        if isinstance(node, ast.Call):
            return self._call(node)
        return None

    def _call(self, call: ast.Call) -> str | None:
        func = call.func
        name = qualified_name(func, self.scopes, self.functions)
        if name in _HOST_FUNCTIONS or (
            name is None and isinstance(func, ast.Attribute) and func.attr in _HOST_METHODS
        ):
            return f"it calls {ast.unparse(func)}()"
        arguments = [*call.args, *(keyword.value for keyword in call.keywords)]
        if name in _HOST_BUILTINS and any(self._may_be_tensor(a) for a in arguments):
            return f"it calls {ast.unparse(func)}() on a possible tensor"
        return None
