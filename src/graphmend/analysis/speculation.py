"""Can a branch be evaluated although it may not be taken?

Predication evaluates both branches of an ``if`` (or the taken one, under
``torch.cond``), so every branch must be free of observable side effects and
must not fail where the original would not have run it.  This module checks
branches statically and reports what the runtime must still check (the types
of the submodules a branch calls) and what the choice of ``torch.where`` or
``torch.cond`` depends on (whether a branch is costly).
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from dataclasses import dataclass, field

from graphmend.analysis.bindings import is_attribute_chain, is_name_target
from graphmend.analysis.host_reads import HostReads
from graphmend.analysis.purity import (
    PURE_BUILTINS,
    PURE_TENSOR_METHODS,
    PURE_TORCH_FUNCTIONS,
    is_host_conversion,
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
#: Functions that draw random numbers when given this argument (keyword, position),
#: unless it is a literal zero.
_RANDOM_WITH = {"torch.nn.functional.scaled_dot_product_attention": ("dropout_p", 4)}

#: Methods that convert in place when the receiver is an ``nn.Module``.
_MODULE_CONVERSIONS = frozenset(
    "to float double half bfloat16 cpu cuda type int long bool short char byte".split()
)


@dataclass
class BranchFacts:
    """What the static analysis learned about the branches of one site."""

    problem: str | None = None
    expensive: bool = False
    modules: list[ast.expr] = field(default_factory=list)

    def refuse(self, problem: str) -> None:
        if self.problem is None:
            self.problem = problem


class SpeculationChecker:
    """Checks expressions of a branch; collects :class:`BranchFacts`.

    ``in_branch``: the expressions run inside a generated branch function (T1),
    where reading tensor data on the host would break the graph inside it (or
    make ``torch.cond`` fail), so host reads are refused too.
    """

    def __init__(
        self, scopes: ModuleScopes, functions: Sequence[ast.AST], *, in_branch: bool = False
    ) -> None:
        self.scopes = scopes
        self.functions = functions
        self.in_branch = in_branch
        self.facts = BranchFacts()
        self._checking: set[str] = set()

    def expression(self, expr: ast.expr) -> None:
        """Record any reason ``expr`` cannot be evaluated ahead of time."""
        if self.in_branch:
            host_read = HostReads(self.scopes, self.functions).problem(expr)
            if host_read is not None:
                self.facts.refuse(host_read)
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

    def condition(self, test: ast.expr) -> None:
        """Check the condition of an ``if`` nested in a branch: its ``and``/``or``/``not``
        are combined on the device (:mod:`graphmend.rewrites.conditions`), so only their
        operands are checked as expressions."""
        if isinstance(test, ast.BoolOp):
            for value in test.values:
                self.condition(value)
        elif isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            self.condition(test.operand)
        else:
            for operand in self._compared_on_device(test):
                self.expression(operand)

    def _compared_on_device(self, test: ast.expr) -> list[ast.expr]:
        """What a condition reads: a host read (``t.item()``, ``float(t)``) alone or compared
        with a number is compared on the device, exactly (``runtime.conditions``), so only
        the tensor read counts."""
        operands = [test.left, *test.comparators] if isinstance(test, ast.Compare) else [test]
        if len(operands) > 2 or not all(
            _is_number(operand) or self._host_read(operand) for operand in operands
        ):
            return [test]
        return [_read_value(operand) for operand in operands if isinstance(operand, ast.Call)]

    def _host_read(self, expr: ast.expr) -> bool:
        return isinstance(expr, ast.Call) and is_host_conversion(expr, self.scopes, self.functions)

    def _subscript(self, node: ast.Subscript) -> None:
        if not _is_basic_index(node.slice):
            self.facts.refuse(
                f"{ast.unparse(node)} indexes with a value that may be an out-of-range tensor"
            )

    def _operator(self, node: ast.BinOp) -> None:
        if isinstance(node.op, ast.MatMult):
            self.facts.expensive = True
        if isinstance(node.op, ast.FloorDiv | ast.Mod) and not _is_nonzero_number(node.right):
            self._dividing(ast.unparse(node))

    def _dividing(self, what: str) -> None:
        # Integer tensors (and Python numbers) raise ZeroDivisionError on a zero divisor,
        # which the untaken branch may hold: the condition often guards against it.
        self.facts.refuse(f"{what} divides by a value that may be zero, as an integer")

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
            if name in _RANDOM_WITH and _may_draw(call, *_RANDOM_WITH[name]):
                # Both branches are traced to plan the merge; what the untaken one
                # draws would change the random numbers everything after it gets.
                self.facts.refuse(
                    f"it calls {ast.unparse(func)}() with {_RANDOM_WITH[name][0]}, which may "
                    "draw random numbers"
                )
            return
        if isinstance(func, ast.Attribute) and func.attr in PURE_TENSOR_METHODS:
            if func.attr == "div" and any(k.arg == "rounding_mode" for k in call.keywords):
                self._dividing(ast.unparse(call))
            if func.attr in _MODULE_CONVERSIONS and isinstance(func.value, ast.Attribute):
                self.facts.refuse(
                    f"it calls {ast.unparse(func)}(), which converts a module in place if "
                    f"{ast.unparse(func.value)} is one"
                )
            self._note_cost(func.attr in _EXPENSIVE_METHODS)
            return
        if isinstance(func, ast.Name):
            self._module_function(func)
            return
        if isinstance(func, ast.Attribute) and is_attribute_chain(func):
            if self._checking:
                self.facts.refuse(
                    f"a function it calls calls {ast.unparse(func)}(), a submodule that "
                    "cannot be checked from here"
                )
                return
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
        self._note_cost(name in _EXPENSIVE_FUNCTIONS)

    def _note_cost(self, expensive: bool) -> None:
        self.facts.expensive |= expensive

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
            is_name_target(target) for target in statement.targets
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


def speculation_problem(
    expr: ast.expr, scopes: ModuleScopes, functions: Sequence[ast.AST]
) -> str | None:
    """Why ``expr`` cannot be evaluated ahead of time on its own (``None``: it can)."""
    checker = SpeculationChecker(scopes, functions)
    checker.expression(expr)
    if checker.facts.problem is None and checker.facts.modules:
        return f"it calls {ast.unparse(checker.facts.modules[0])}(), a submodule"
    return checker.facts.problem


def _is_number(expr: ast.expr) -> bool:
    if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.USub | ast.UAdd):
        expr = expr.operand
    return isinstance(expr, ast.Constant) and type(expr.value) in (int, float, bool)


def _may_draw(call: ast.Call, keyword: str, position: int) -> bool:
    """Whether ``call`` passes the argument ``keyword`` (or at ``position``) as anything
    but a literal zero."""
    values = [k.value for k in call.keywords if k.arg == keyword]
    values += call.args[position : position + 1]
    return any(not (_is_number(value) and ast.literal_eval(value) == 0) for value in values)


def _is_nonzero_number(expr: ast.expr) -> bool:
    return _is_number(expr) and ast.literal_eval(expr) != 0


def _read_value(call: ast.Call) -> ast.expr:
    """The tensor ``t`` of a host read ``t.item()`` / ``float(t)``."""
    return call.func.value if isinstance(call.func, ast.Attribute) else call.args[0]


def _is_basic_index(index: ast.expr) -> bool:
    """Constants, slices and ``None``/``...``: indexing that selects, never gathers."""
    if isinstance(index, ast.Tuple):
        return all(_is_basic_index(element) for element in index.elts)
    if isinstance(index, ast.Slice):
        return True
    if isinstance(index, ast.Constant):
        return index.value is None or index.value is Ellipsis or isinstance(index.value, int)
    return isinstance(index, ast.UnaryOp) and isinstance(index.operand, ast.Constant)
