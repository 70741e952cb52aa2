"""Format a value while tracing, exactly, or not at all.

TorchDynamo formats some values wrongly (``format(3, ">4")`` ignores the spec;
a ``torch.Size`` of symbolic sizes prints as ``torch.Size([s77])``).
:func:`format_now` formats with a function marked as a constant-result function
once TorchDynamo is imported: TorchDynamo then calls it with the real Python
values and bakes the text into the trace, and refuses (a graph break) when a
value is symbolic.
Baked text is not guarded, so only values whose text cannot change while the
compiled code is reused qualify (:func:`formattable_now`): immutable builtins,
dtypes, devices, sizes, and tuples of them, which TorchDynamo guards on.

TorchDynamo before ``AsPythonConstantNotImplementedError`` (2.5, 2.6) fails the
whole compile, instead of breaking the graph, when a value is symbolic; there
a value that holds numbers (the ones that can be symbolic) is formatted by a
function TorchDynamo does not trace: a graph break, as without GraphMend.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from graphmend.notices import warn
from graphmend.post_import import when_imported
from graphmend.runtime.asking import ask_tracer

CONVERSIONS: dict[int, Callable[[Any], str]] = {ord("s"): str, ord("r"): repr, ord("a"): ascii}


def convert(value: Any, conversion: int) -> Any:
    """Apply an f-string conversion (``!s``, ``!r``, ``!a``; -1 for none)."""
    return value if conversion == -1 else CONVERSIONS[conversion](value)


#: Immutable values TorchDynamo treats as constants (and so can carry out of a graph).
IMMUTABLE_TYPES = (int, float, str, bool, type(None), torch.dtype, torch.device)


def formattable_now(value: Any) -> bool:
    """Whether ``value``'s text is fixed for as long as a trace that saw it is used."""
    if type(value) in (tuple, torch.Size):
        return all(formattable_now(item) for item in value)
    return type(value) in IMMUTABLE_TYPES


def format_now(value: Any, conversion: int, spec: str) -> str:
    """``f"{value!conversion:spec}"``, computed by Python even while tracing."""
    if not _symbolic_values_break and not _numbers_known(value):
        return _format_unbaked(value, conversion, spec)
    return _format(value, conversion, spec)


def _numbers_known(value: Any) -> bool:
    """Whether every number ``value`` holds is a constant to TorchDynamo (False outside
    it): text made of those is baked on every torch release (a size that never changed,
    under ``torch.export`` on torch 2.5)."""
    if type(value) in (tuple, torch.Size):
        return all(_numbers_known(item) for item in value)
    return type(value) not in (int, float, bool) or known_while_tracing(value)


def known_while_tracing(value: int | float) -> bool:
    """Whether TorchDynamo holds ``value`` as a constant (a symbolic size or float it
    does not: those travel as tensors).  Under TorchDynamo, ``type()`` says ``int``
    for both; its own variable for the local says which."""
    return held_while_tracing(value) == "constant"


def symbolic_while_tracing(value: int | float) -> bool:
    """Whether TorchDynamo holds ``value`` as a symbolic number: a size, a float made
    dynamic, or a number it captured from ``.item()`` (``capture_scalar_outputs``),
    which is an int64 or a float64 in the graph, and which GraphMend must not compare
    (a comparison guards on it: on a captured one it is a graph break).  False where
    TorchDynamo cannot be asked, and outside it."""
    return held_while_tracing(value) == "symbolic"


def held_while_tracing(value: int | float) -> str:
    """How TorchDynamo holds the number ``value``: ``"constant"``, ``"symbolic"``, or
    ``"unknown"`` (outside TorchDynamo, or a release that cannot be asked)."""
    return ask_tracer(_look, "unknown", value)


def _look(_tracer: Any, value: Any) -> str | None:
    """Asked while TorchDynamo traces :func:`held_while_tracing`."""
    try:
        return "constant" if value.is_python_constant() else "symbolic"
    except (AttributeError, ImportError, KeyError, TypeError):
        return None  # another torch release: the value travels as a tensor


def _format(value: Any, conversion: int, spec: str) -> str:
    """The formatting itself; a constant-result function once TorchDynamo is imported."""
    return f"{convert(value, conversion):{spec}}"


#: Whether TorchDynamo breaks the graph when a constant-result function gets a
#: symbolic value (else :data:`_format_unbaked` is not traced at all).
_symbolic_values_break = True
_format_unbaked = _format


def assume_constant_result(dynamo: ModuleType, function: Callable[..., Any]) -> None:
    """Mark ``function`` as a constant-result function, under a name no one else uses.

    TorchDynamo (2.5 to 2.13) stores each result it bakes in the globals of the
    module whose frame it compiles, under the function's code name: a plain
    name would overwrite a global of that name there (on torch 2.5 and 2.6 it replaced
    the formatting function itself in GraphMend's modules with a string).
    """
    name = f"__graphmend_{function.__name__}"
    function.__name__ = name
    function.__code__ = function.__code__.replace(co_name=name)
    dynamo.assume_constant_result(function)


def _mark_constant(dynamo: ModuleType) -> None:
    global _symbolic_values_break, _format_unbaked
    assume_constant_result(dynamo, _format)
    from torch._dynamo.variables import base

    if not hasattr(base, "AsPythonConstantNotImplementedError"):
        _symbolic_values_break = False
        _format_unbaked = dynamo.disable(_format)
        warn(
            f"GraphMend: on torch {torch.__version__}, TorchDynamo fails to compile, instead of "
            "breaking the graph, when text is made of a size that turns dynamic: print and "
            "logging calls that format sizes or tuples of numbers keep their graph breaks"
        )


when_imported("torch._dynamo", _mark_constant)
