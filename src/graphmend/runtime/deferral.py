"""Runtime side of T2: capture values at the call point, make the call after the graph.

TorchDynamo runs calls to functions in ``config.reorderable_logging_functions``
after the graph, with arguments that are tensors or constants.  Rewritten code
calls one generated function per site (decorated with :func:`deferred`), with
values captured by :func:`carry`, :func:`print_arg` and :func:`piece`.
Registration waits until TorchDynamo is imported, so that importing a
rewritten module never imports it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from graphmend.runtime import dynamo_support
from graphmend.runtime.formatting import IMMUTABLE_TYPES, format_now, formattable_now
from graphmend.runtime.post_import import when_imported

F = TypeVar("F", bound=Callable[..., None])

# What TorchDynamo can carry out of a graph besides tensors.
_deferred_functions: list[Callable[..., None]] = []
_enabled = False


def carry(value: Any) -> Any:
    """``value`` as it is now: a tensor is copied, so later in-place updates do not show."""
    if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
        return value.clone()
    return value


def print_arg(value: Any) -> Any:
    """A ``print`` argument: tensors and constants carried, fixed values printed to text now.

    ``print`` writes ``str(value)``; doing that at the call point is exact and
    turns values TorchDynamo cannot carry (a ``torch.Size``) into text.  Other
    objects are passed on as they are: TorchDynamo refuses to carry them, and
    the original call runs where it was.
    """
    if isinstance(value, torch.Tensor) or type(value) in IMMUTABLE_TYPES:
        return carry(value)
    return format_now(value, ord("s"), "") if formattable_now(value) else value


def piece(value: Any, conversion: int, spec: str) -> Any:
    """A replacement field of an f-string: a tensor is carried, a fixed value formatted now."""
    if isinstance(value, torch.Tensor) or type(value) in (int, float, bool):
        return carry(value)  # a number may be symbolic: render() formats it after the graph
    return format_now(value, conversion, spec) if formattable_now(value) else value


def render(value: Any, conversion: int, spec: str) -> str:
    """Format a :func:`piece` after the graph (text was formatted at the call point)."""
    if type(value) is str:
        return value
    return format_now(value, conversion, spec)


def deferred(qualname: str) -> Callable[[F], F]:
    """Register a generated per-site function with TorchDynamo's reorderable calls.

    Its code is renamed after the function holding the site, so that log
    records (``funcName``), warnings and tracebacks name the user's function.
    """

    def register(function: F) -> F:
        code = function.__code__
        renamed = {"co_name": qualname.rsplit(".", 1)[-1]}
        if sys.version_info >= (3, 11):
            renamed["co_qualname"] = qualname
        function.__code__ = code.replace(**renamed)
        _deferred_functions.append(function)
        if _enabled:
            _register_with_dynamo(function)
        return function

    return register


def _register_with_dynamo(function: Callable[..., None]) -> None:
    from torch._dynamo import config, eval_frame

    config.reorderable_logging_functions.add(function)
    # Called after the graph from compiled code, the function's own frame would
    # be handed to TorchDynamo to compile (and fail on the call it makes).
    skip_code = getattr(eval_frame, "skip_code", None)
    if skip_code is not None:
        skip_code(function.__code__)


def _enable(_dynamo: object = None) -> None:
    global _enabled
    if _enabled or not dynamo_support.keep_inlined_deferred_calls():
        # Unregistered, a generated function is an ordinary function that makes
        # the original call: TorchDynamo breaks the graph there, as it did before.
        return
    _enabled = True
    for function in _deferred_functions:
        _register_with_dynamo(function)


when_imported("torch._dynamo", _enable)
