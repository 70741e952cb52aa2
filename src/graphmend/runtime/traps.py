"""Runtime side of T3: a failing guard fails the compiled call, inside the graph.

``if <tensor condition>: raise E(message)`` is lowered, while tracing, to an
operation in the graph that raises when the condition holds:

* on CPU (and any device but CUDA) the custom operator
  ``graphmend::raise_if``, whose kernel raises ``E(message)`` itself, so the
  compiled call fails with the original exception type and message, under
  every backend (eager, aot_eager, inductor);
* on CUDA ``torch._assert_async``, which never synchronises with the host and
  so keeps CUDA graphs possible: a failing guard becomes a device-side assert,
  reported at a later synchronisation as ``RuntimeError: CUDA error:
  device-side assert triggered``, after which the CUDA context is unusable.
  ``GRAPHMEND_CUDA_GUARDS=sync`` uses ``graphmend::raise_if`` on CUDA too: the
  original exception, at the price of a host synchronisation per guard (and no
  CUDA graphs).

The message is formatted at trace time, so it may only hold values known then
(shapes, dtypes, Python values); a message that needs tensor data keeps the
original graph break.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import torch

from graphmend.runtime.conditions import is_scalar_tensor, truth
from graphmend.runtime.deferral import output_pending
from graphmend.runtime.formatting import format_now, formattable_now
from graphmend.runtime.post_import import when_imported

_SYNC_ON_CUDA = os.environ.get("GRAPHMEND_CUDA_GUARDS", "").strip().lower() == "sync"
_operator_ready = False


Piece = str | tuple[str, list[Any]]


def text(value: Any, conversion: int, spec: str) -> Piece | None:
    """A field of a guard's message: text now, or integers to format when the guard fires.

    Integers and shapes travel into the graph as integers (they may be
    symbolic sizes) and are formatted by the kernel; other values whose text is
    fixed are formatted now.  ``None``: the field needs tensor data, or an
    object whose text could change, and the guard keeps its graph break.
    """
    if _is_int(value):
        return f"int:1:{conversion}:{spec}", [value]
    if type(value) in (tuple, list, torch.Size) and all(_is_int(item) for item in value):
        kind = "size" if type(value) is torch.Size else type(value).__name__
        return f"{kind}:{len(value)}:{conversion}:{spec}", list(value)
    if not formattable_now(value):
        return None
    return format_now(value, conversion, spec)


def _is_int(value: Any) -> bool:
    # type() rather than isinstance(): an IntEnum must keep its own text; under
    # TorchDynamo a symbolic size's type is int.
    return type(value) is int


_SEPARATOR = "\x1f"  # ASCII unit separator


def _encode(pieces: list[Piece]) -> tuple[str, list[Any]]:
    """Pieces as one template string plus the symbolic integers.

    Built with f-strings and ``join`` only: TorchDynamo 2.13 traces neither
    ``str + str``, ``len(str)`` nor ``in`` on formatted text.  The rewrite
    declines messages whose literal text holds the separator.
    """
    template: list[str] = []
    numbers: list[Any] = []
    for piece in pieces:
        if isinstance(piece, str):
            template.append(f"s{piece}")
        else:
            template.append(f"v{piece[0]}")
            numbers.extend(piece[1])
    return _SEPARATOR.join(template), numbers


def _decode(template: str, numbers: list[int]) -> str:
    """The message :func:`_encode` describes, with the integers' run-time values."""
    parts: list[str] = []
    remaining = iter(numbers)
    for encoded in template.split(_SEPARATOR) if template else []:
        if encoded[0] == "s":
            parts.append(encoded[1:])
            continue
        kind, count, conversion, spec = encoded[1:].split(":", 3)
        values = [next(remaining) for _ in range(int(count))]
        value: Any = {"int": lambda v: v[0], "size": torch.Size, "tuple": tuple, "list": list}[
            kind
        ](values)
        parts.append(format_now(value, int(conversion), spec))
    return "".join(parts)


def lowerable(condition: Any, *earlier: Any) -> bool:
    """Whether :func:`lower_guard` can put this guard into the graph (message not built yet)."""
    if is_scalar_tensor(condition):
        return True
    return bool(condition) and any(is_scalar_tensor(value) for value in earlier)


def exact_text(value: Any) -> str | None:
    """A message given as a name: usable only if it is a string at trace time."""
    return value if type(value) is str else None


def lower_guard(
    condition: Any,
    exception: type[BaseException],
    message: list[Piece | None],
    has_message: bool,
    *earlier: Any,
) -> bool:
    """Put ``if condition: raise exception(message)`` into the graph; False if it cannot.

    ``earlier`` are the conditions of the preceding guards of an ``if/elif``
    chain: this guard fires only where none of them did.  When False is
    returned the caller decides in Python, exactly as the original code.
    """
    path = f"{exception.__module__}:{exception.__qualname__}"
    refused = not _operator_ready or any(piece is None for piece in message) or output_pending()
    if refused or "<locals>" in path or not lowerable(condition, *earlier):
        return False
    earlier_tensors = [value for value in earlier if is_scalar_tensor(value)]
    if is_scalar_tensor(condition):
        fires = truth(condition)
    else:  # a true Python condition that fires where no earlier guard did
        fires = torch.ones((), dtype=torch.bool, device=earlier_tensors[0].device)
    for value in earlier_tensors:
        fires = torch.logical_and(fires, torch.logical_not(truth(value)))
    template, numbers = _encode(message)  # type: ignore[arg-type]
    if fires.device.type == "cuda" and not _SYNC_ON_CUDA:
        static = "".join(piece if isinstance(piece, str) else "?" for piece in message)  # type: ignore[misc]
        torch._assert_async(torch.logical_not(fires), static)
    else:
        torch.ops.graphmend.raise_if(fires, path, template, numbers, has_message)
    return True


def _exception_class(path: str) -> type[BaseException] | None:
    module_name, _, qualname = path.partition(":")
    target: Any = sys.modules.get(module_name)
    for attribute in qualname.split("."):
        target = getattr(target, attribute, None)
    if isinstance(target, type) and issubclass(target, BaseException):
        return target
    return None


def _raise_if(
    cond: torch.Tensor, exception: str, template: str, numbers: list[int], has_message: bool
) -> None:
    if not bool(cond):
        return
    exception_class = _exception_class(exception) or RuntimeError
    raise exception_class(_decode(template, numbers)) if has_message else exception_class()


def _define_operator(_dynamo: object = None) -> None:
    """Register ``graphmend::raise_if`` (once TorchDynamo is imported: tracing needs it)."""
    global _operator_ready
    custom_op = getattr(torch.library, "custom_op", None)
    if _operator_ready or custom_op is None:
        return
    operator = custom_op("graphmend::raise_if", mutates_args=())(_raise_if)
    operator.register_fake(lambda cond, exception, template, numbers, has_message: None)
    from torch.fx.node import has_side_effect

    has_side_effect(torch.ops.graphmend.raise_if.default)
    _operator_ready = True


when_imported("torch._dynamo", _define_operator)
