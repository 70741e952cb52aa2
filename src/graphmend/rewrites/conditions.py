"""Translate a condition so that its tensor parts stay tensors while tracing.

``not``/``and``/``or`` become runtime helpers that keep Python's short circuit
for Python values and combine tensors with logical operators; a host read
(``.item()``, ``float(x)``, ``int(x)``, ``bool(x)``) that feeds a comparison or
the truth of the condition becomes a device value compared exactly;
``torch.equal``/``torch.allclose`` become their on-device equivalents.  The
right side of ``and``/``or`` is evaluated ahead of time only when it is pure.
Everything else is left as written, so that the translated condition always
computes what the original computes, and whatever it cannot keep on the
device is decided on the host exactly as before.
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Sequence

from graphmend.analysis.purity import PurityChecker, is_host_conversion, qualified_name
from graphmend.analysis.scopes import ModuleScopes
from graphmend.rewrites.common import runtime_call, thunk

_COMPARISON_SYMBOLS: dict[type[ast.cmpop], str] = {
    ast.Eq: "==",
    ast.NotEq: "!=",
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
}
_ON_DEVICE = {"torch.equal": "equal", "torch.allclose": "allclose"}


class Untranslatable(Exception):
    """A condition whose host reads cannot be kept on the device exactly."""


class ConditionTranslator:
    """Builds the tracing-time version of a condition."""

    def __init__(self, scopes: ModuleScopes, functions: Sequence[ast.AST]) -> None:
        self.scopes = scopes
        self.functions = functions
        self.purity = PurityChecker(scopes, functions)

    def translate(self, condition: ast.expr) -> ast.expr:
        """The condition with its boolean structure and host reads made tensor-friendly."""
        translated = self._condition(condition)
        for node in ast.walk(translated):
            if isinstance(node, ast.Call) and is_host_conversion(node, self.scopes, self.functions):
                raise Untranslatable(
                    f"{ast.unparse(node)} reads a tensor on the host for something other than "
                    "a comparison or a truth test"
                )
        return translated

    def _condition(self, node: ast.expr) -> ast.expr:
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return runtime_call("not_", self._condition(node.operand))
        if isinstance(node, ast.BoolOp):
            return self._bool_op(node)
        if isinstance(node, ast.Compare):
            return self._compare(node)
        if isinstance(node, ast.Call):
            return self._call(node) or copy.deepcopy(node)
        return copy.deepcopy(node)

    def _bool_op(self, node: ast.BoolOp) -> ast.expr:
        helper = "and_" if isinstance(node.op, ast.And) else "or_"
        # a and b and c == a and (b and c), evaluation order kept.
        result = self._condition(node.values[-1])
        original_rest = node.values[-1]
        for value in reversed(node.values[:-1]):
            speculable = self.purity.impure_part(original_rest) is None
            result = runtime_call(
                helper, thunk(self._condition(value)), thunk(result), ast.Constant(speculable)
            )
            original_rest = ast.BoolOp(op=node.op, values=[value, original_rest])
        return result

    def _compare(self, node: ast.Compare) -> ast.expr:
        operands = [node.left, *node.comparators]
        host = [self._is_host_read(operand) for operand in operands]
        if not any(host):
            return copy.deepcopy(node)
        if len(node.ops) != 1:
            raise Untranslatable("a chained comparison of values read on the host")
        symbol = _COMPARISON_SYMBOLS.get(type(node.ops[0]))
        if symbol is None:
            raise Untranslatable(f"`{ast.unparse(node)}` compares host values by identity")
        left, right = (
            self._host_value(operand) if read else copy.deepcopy(operand)
            for operand, read in zip(operands, host, strict=True)
        )
        return runtime_call(
            "compare",
            left,
            ast.Constant(symbol),
            right,
            ast.Constant(host[0]),
            ast.Constant(host[1]),
        )

    def _call(self, node: ast.Call) -> ast.expr | None:
        if self._is_host_read(node):
            return self._host_value(node)
        name = qualified_name(node.func, self.scopes, self.functions)
        helper = _ON_DEVICE.get(name or "")
        if helper is None:
            return None
        call = runtime_call(helper, *(copy.deepcopy(arg) for arg in node.args))
        call.keywords = [copy.deepcopy(keyword) for keyword in node.keywords]
        return call

    def _is_host_read(self, node: ast.expr) -> bool:
        return isinstance(node, ast.Call) and is_host_conversion(node, self.scopes, self.functions)

    def _host_value(self, call: ast.expr) -> ast.expr:
        assert isinstance(call, ast.Call)
        if isinstance(call.func, ast.Attribute):
            value, conversion = call.func.value, "item"
        else:
            value, conversion = call.args[0], call.func.id  # type: ignore[attr-defined]
        return runtime_call("host_value", copy.deepcopy(value), ast.Constant(conversion))
