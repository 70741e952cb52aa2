"""Recognise calls that only produce output: ``print``, module loggers, ``warnings.warn``.

A call is recognised only when the source proves what the callee is: the
builtin ``print`` with no binding of ``print`` anywhere in scope, a logging
method on a module-level name bound once by ``getLogger``/``get_logger``, the
root logging functions of the stdlib ``logging`` module, and ``warn`` from the
stdlib ``warnings`` module.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from graphmend.analysis.scopes import BindingKind, ModuleScopes, Resolution

#: Logger methods that only emit a record built from their arguments.
LOGGER_METHODS = frozenset(
    {
        "debug",
        "info",
        "warning",
        "warn",
        "error",
        "critical",
        "fatal",
        "log",
        "warning_once",
        "info_once",
        "warning_advice",
    }
)
#: Functions of the stdlib ``logging`` module that log on the root logger.
ROOT_LOGGING_FUNCTIONS = frozenset(
    {"debug", "info", "warning", "warn", "error", "critical", "fatal", "log"}
)
_LOGGER_FACTORIES = frozenset({"getLogger", "get_logger"})


class OutputKind(str, Enum):
    """The kinds of output call T2 defers."""

    PRINT = "print"
    LOGGER = "logger"
    WARNING = "warnings.warn"


@dataclass(frozen=True)
class OutputCall:
    """A call proven to be an output call, and what kind."""

    kind: OutputKind
    method: str  # "print", the logger method, or "warn"


@dataclass(frozen=True)
class NotProven:
    """A call that looks like an output call, but whose callee the source does not pin down."""

    reason: str


def _imports_module(
    scopes: ModuleScopes, name: str, enclosing: Sequence[ast.AST], module: str
) -> bool:
    binding = scopes.sole_global_binding(name, enclosing)
    return binding is not None and binding.kind is BindingKind.IMPORT and binding.imported == module


def _is_module_logger(scopes: ModuleScopes, name: str, enclosing: Sequence[ast.AST]) -> bool:
    binding = scopes.sole_global_binding(name, enclosing)
    if binding is None or binding.kind is not BindingKind.ASSIGN:
        return False
    value = binding.value
    if not isinstance(value, ast.Call):
        return False
    func = value.func
    factory = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    return factory in _LOGGER_FACTORIES


def classify(
    call: ast.Call, scopes: ModuleScopes, enclosing: Sequence[ast.AST]
) -> OutputCall | NotProven | None:
    """What ``call`` is: a proven output call, a look-alike, or neither (``None``)."""
    func = call.func
    if isinstance(func, ast.Name):
        if func.id == "print":
            resolution = scopes.resolve("print", enclosing)
            if resolution is Resolution.BUILTIN:
                return OutputCall(OutputKind.PRINT, "print")
            if resolution is Resolution.UNKNOWN:
                return NotProven("a star import may rebind print in this module")
            return NotProven("print is rebound in this module, so it may not be the builtin")
        binding = scopes.sole_global_binding(func.id, enclosing)
        if (
            binding is not None
            and binding.kind is BindingKind.IMPORT_FROM
            and binding.imported == "warnings.warn"
        ):
            return OutputCall(OutputKind.WARNING, "warn")
        return None
    if not isinstance(func, ast.Attribute):
        return None
    method = func.attr
    receiver = func.value
    if isinstance(receiver, ast.Name):
        if method == "warn" and _imports_module(scopes, receiver.id, enclosing, "warnings"):
            return OutputCall(OutputKind.WARNING, "warn")
        if method in ROOT_LOGGING_FUNCTIONS and _imports_module(
            scopes, receiver.id, enclosing, "logging"
        ):
            return OutputCall(OutputKind.LOGGER, method)
        if method in LOGGER_METHODS and _is_module_logger(scopes, receiver.id, enclosing):
            return OutputCall(OutputKind.LOGGER, method)
    if method in LOGGER_METHODS - {"log"} and _looks_like_logger(receiver):
        return NotProven(
            f"{ast.unparse(receiver)} is not a module-level logger bound once by "
            "getLogger()/get_logger()"
        )
    if method == "exception" and _looks_like_logger(receiver):
        return NotProven("logger.exception() reads the exception being handled; it cannot wait")
    return None


def _looks_like_logger(receiver: ast.expr) -> bool:
    name = receiver.attr if isinstance(receiver, ast.Attribute) else getattr(receiver, "id", "")
    return "log" in name.lower()
