"""Can a branch be evaluated although it may not be taken?

Predication evaluates both branches of an ``if`` (or the taken one, under
``torch.cond``), so every branch must be free of observable side effects,
must not fail where the original would not have run it, and, when gradients
flow, must not produce infinities whose zero-weighted gradient still poisons
the result.  This module checks branches statically and reports what the
runtime must still check: the types of the submodules a branch calls.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from dataclasses import dataclass, field

from graphmend.analysis.purity import (
    PURE_BUILTINS,
    PURE_TENSOR_METHODS,
    PURE_TORCH_FUNCTIONS,
    qualified_name,
)
from graphmend.analysis.scopes import BindingKind, ModuleScopes

#: Calls whose cost grows with a weight matrix or a sequence: run only the taken branch.
_EXPENSIVE_FUNCTIONS = frozenset(
    "torch." + name for name in "matmul mm bmm einsum".split()
) | frozenset(
    "torch.nn.functional." + name
    for name in "linear conv1d conv2d conv3d scaled_dot_product_attention".split()
)
_EXPENSIVE_METHODS = frozenset({"matmul", "mm", "bmm"})

#: Calls whose derivative is finite everywhere: a zero-weighted gradient stays zero.
_GRAD_SAFE_NAMES = frozenset(
    """
    abs amax amin bfloat16 bmm cat clamp clip clone contiguous detach double einsum elu expand
    expand_as flatten float full full_like gelu half layer_norm leaky_relu linear long
    masked_fill matmul max maximum mean min minimum mm neg new_full new_ones new_zeros ones
    ones_like permute relu relu6 reshape reshape_as rms_norm round sigmoid sign silu size
    softmax squeeze stack sum t tanh tensor to transpose tril triu trunc type_as unsqueeze view
    view_as where zeros zeros_like arange numel dim finfo iinfo is_floating_point
    """.split()
)
_GRAD_SAFE_OPERATORS = (ast.Add, ast.Sub, ast.Mult, ast.BitAnd, ast.BitOr, ast.BitXor)


@dataclass
class BranchFacts:
    """What the static analysis learned about the branches of one site."""

    problem: str | None = None
    expensive: bool = False
    grad_safe: bool = True
    modules: list[ast.expr] = field(default_factory=list)

    def refuse(self, problem: str) -> None:
        if self.problem is None:
            self.problem = problem


class SpeculationChecker:
    """Checks expressions of a branch; collects :class:`BranchFacts`."""

    def __init__(self, scopes: ModuleScopes, functions: Sequence[ast.AST]) -> None:
        self.scopes = scopes
        self.functions = functions
        self.facts = BranchFacts()
        self._checking: set[str] = set()

    def expression(self, expr: ast.expr) -> None:
        """Record any reason ``expr`` cannot be evaluated ahead of time."""
        for node in ast.walk(expr):
            if isinstance(node, ast.NamedExpr):
                self.facts.refuse("it assigns a name with :=")
            elif isinstance(node, ast.Await | ast.Yield | ast.YieldFrom):
                self.facts.refuse("it suspends (await/yield)")
            elif isinstance(
                node, ast.Lambda | ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp
            ):
                self.facts.refuse(f"it builds {type(node).__name__.lower()}s, kept out of scope")
            elif isinstance(node, ast.Subscript):
                self._subscript(node)
            elif isinstance(node, ast.BinOp):
                self._operator(node)
            elif isinstance(node, ast.Call):
                self._call(node)

    def _subscript(self, node: ast.Subscript) -> None:
        if not _is_basic_index(node.slice):
            self.facts.refuse(
                f"{ast.unparse(node)} indexes with a value that may be an out-of-range tensor"
            )

    def _operator(self, node: ast.BinOp) -> None:
        if isinstance(node.op, ast.MatMult):
            self.facts.expensive = True
        if isinstance(node.op, _GRAD_SAFE_OPERATORS):
            return
        if isinstance(node.op, ast.Div) and _is_number(node.right):
            return
        if isinstance(node.op, ast.Pow) and _is_number(node.right, integer=True):
            return
        if isinstance(node.op, ast.MatMult):
            return
        self.facts.grad_safe = False

    def _call(self, call: ast.Call) -> None:
        if any(isinstance(arg, ast.Starred) for arg in call.args) or any(
            keyword.arg is None for keyword in call.keywords
        ):
            self.facts.refuse("it calls with *args/**kwargs")
            return
        func = call.func
        name = qualified_name(func, self.scopes, self.functions)
        if name is not None:
            self._known_function(name, func)
            return
        if isinstance(func, ast.Attribute) and func.attr in PURE_TENSOR_METHODS:
            self._note_cost(func.attr, func.attr in _EXPENSIVE_METHODS)
            return
        if isinstance(func, ast.Name):
            self._module_function(func)
            return
        if isinstance(func, ast.Attribute) and _is_attribute_chain(func):
            # self.proj(x): a submodule, whose type is checked while tracing.
            self.facts.modules.append(func)
            self.facts.expensive = True
            return
        self.facts.refuse(f"it calls {ast.unparse(func)}(), which is not known to be pure")

    def _known_function(self, name: str, func: ast.expr) -> None:
        if name.startswith("builtins."):
            short = name.removeprefix("builtins.")
            if short not in PURE_BUILTINS:
                self.facts.refuse(f"it calls {short}(), which is not known to be pure")
            return
        if name not in PURE_TORCH_FUNCTIONS and name not in _EXPENSIVE_FUNCTIONS:
            self.facts.refuse(f"it calls {ast.unparse(func)}(), which is not known to be pure")
            return
        self._note_cost(name.rsplit(".", 1)[-1], name in _EXPENSIVE_FUNCTIONS)

    def _note_cost(self, short_name: str, expensive: bool) -> None:
        self.facts.expensive |= expensive
        if short_name not in _GRAD_SAFE_NAMES:
            self.facts.grad_safe = False

    def _module_function(self, func: ast.Name) -> None:
        """A function of this module: pure if its body is (checked once, recursively)."""
        binding = self.scopes.sole_global_binding(func.id, self.functions)
        if binding is None or binding.kind is not BindingKind.DEF:
            self.facts.refuse(f"it calls {func.id}(), which is not known to be pure")
            return
        if func.id in self._checking:
            self.facts.refuse(f"it calls {func.id}(), which is recursive")
            return
        definition = binding.node
        assert isinstance(definition, ast.FunctionDef | ast.AsyncFunctionDef)
        if isinstance(definition, ast.AsyncFunctionDef) or definition.decorator_list:
            self.facts.refuse(f"it calls {func.id}(), which is decorated or a coroutine")
            return
        self._checking.add(func.id)
        outer = self.functions
        self.functions = (definition,)
        try:
            for statement in definition.body:
                self._function_statement(statement, func.id)
        finally:
            self.functions = outer
            self._checking.discard(func.id)

    def _function_statement(self, statement: ast.stmt, function: str) -> None:
        if isinstance(statement, ast.Assign) and all(
            _is_name_target(target) for target in statement.targets
        ):
            self.expression(statement.value)
        elif isinstance(statement, ast.Return):
            if statement.value is not None:
                self.expression(statement.value)
        elif isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
            return  # docstring
        else:
            self.facts.refuse(
                f"it calls {function}(), whose {type(statement).__name__} statement at line "
                f"{statement.lineno} may have side effects"
            )


def _is_attribute_chain(expr: ast.expr) -> bool:
    while isinstance(expr, ast.Attribute):
        expr = expr.value
    return isinstance(expr, ast.Name)


def _is_name_target(target: ast.expr) -> bool:
    if isinstance(target, ast.Name):
        return True
    return isinstance(target, ast.Tuple | ast.List) and all(
        _is_name_target(element) for element in target.elts
    )


def _is_number(expr: ast.expr, integer: bool = False) -> bool:
    if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.USub):
        return not integer and _is_number(expr.operand)
    if not isinstance(expr, ast.Constant) or isinstance(expr.value, bool):
        return False
    if integer:
        return isinstance(expr.value, int) and expr.value >= 1
    return isinstance(expr.value, int | float) and expr.value != 0


def _is_basic_index(index: ast.expr) -> bool:
    """Constants, slices and ``None``/``...``: indexing that selects, never gathers."""
    if isinstance(index, ast.Tuple):
        return all(_is_basic_index(element) for element in index.elts)
    if isinstance(index, ast.Slice):
        return True
    if isinstance(index, ast.Constant):
        return index.value is None or index.value is Ellipsis or isinstance(index.value, int)
    return isinstance(index, ast.UnaryOp) and isinstance(index.operand, ast.Constant)
