"""The functions of this module that a call runs, and which of their parameters receive
the call's arguments.

Followed: a module-level function called by its name (``helper(y, t)``) and a method of
the caller's own class called on the caller's first parameter (``self.helper(y)``),
defined in the class's body.  Anything else (an import, an inherited method, a
submodule's ``forward``) is not followed: :meth:`Callees.reached` gives ``None``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from graphmend.analysis.bindings import FunctionNode
from graphmend.analysis.scopes import BindingKind, ModuleScopes
from graphmend.analysis.walking import walk


@dataclass(frozen=True)
class Callee:
    """A function a call runs, and the scopes around it (to follow its own calls)."""

    function: FunctionNode
    enclosing: tuple[ast.AST, ...]
    bound_first: bool  # a method called on an instance: its first parameter is bound

    def receiving(self, call: ast.Call, argument: ast.expr) -> str | None:
        """The parameter that receives ``argument`` of ``call``; ``None`` where that is not
        known (a ``*args`` or ``**kwargs`` of the call or of the function)."""
        arguments = self.function.args
        positional = [*arguments.posonlyargs, *arguments.args][int(self.bound_first) :]
        for index, given in enumerate(call.args):
            if isinstance(given, ast.Starred):
                return None
            if given is argument:
                return positional[index].arg if index < len(positional) else None
        names = {a.arg for a in [*arguments.args, *arguments.kwonlyargs]}
        for keyword in call.keywords:
            if keyword.value is argument:
                return keyword.arg if keyword.arg in names else None
        return None


class Callees:
    """Finds the module's own functions that calls run (see the module docstring)."""

    def __init__(self, scopes: ModuleScopes) -> None:
        self.scopes = scopes
        self._classes: dict[ast.AST, ast.ClassDef | None] = {}

    def reached(self, call: ast.Call, enclosing: Sequence[ast.AST]) -> Callee | None:
        """The function ``call``, made inside ``enclosing`` functions, runs, if followed."""
        func = call.func
        if isinstance(func, ast.Name):
            binding = self.scopes.sole_global_binding(func.id, enclosing)
            if binding is not None and binding.kind is BindingKind.DEF:
                assert isinstance(binding.node, ast.FunctionDef | ast.AsyncFunctionDef)
                return Callee(binding.node, (binding.node,), bound_first=False)
            return None
        if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and enclosing):
            return None
        caller = enclosing[-1]
        owner = self._class_of(caller)
        if owner is None or not isinstance(caller, ast.FunctionDef | ast.AsyncFunctionDef):
            return None
        first = [*caller.args.posonlyargs, *caller.args.args][:1]
        if not first or first[0].arg != func.value.id or _is_static(caller):
            return None
        methods = [m for m in _methods(owner) if m.name == func.attr]
        if not methods:
            return None
        method = methods[-1]
        return Callee(method, (method,), bound_first=not _is_static(method))

    def _class_of(self, function: ast.AST) -> ast.ClassDef | None:
        """The class whose body defines ``function``, if any."""
        if function not in self._classes:
            self._classes[function] = next(
                (
                    node
                    for node in walk(self.scopes.tree)
                    if isinstance(node, ast.ClassDef)
                    and any(item is function for item in node.body)
                ),
                None,
            )
        return self._classes[function]


def _methods(owner: ast.ClassDef) -> Iterator[FunctionNode]:
    for item in owner.body:
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
            yield item


def _is_static(function: FunctionNode) -> bool:
    return any(
        isinstance(decorator, ast.Name) and decorator.id == "staticmethod"
        for decorator in function.decorator_list
    )
