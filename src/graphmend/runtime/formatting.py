"""Format a value while tracing, exactly, or not at all.

TorchDynamo formats some values wrongly (``format(3, ">4")`` ignores the spec;
a ``torch.Size`` of symbolic sizes prints as ``torch.Size([s77])``).
:func:`format_now` is marked as a constant-result function once TorchDynamo is
imported: TorchDynamo then calls it with the real Python values and bakes the
text into the trace, and refuses (a graph break) when a value is symbolic.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

from graphmend.runtime.post_import import when_imported

CONVERSIONS: dict[int, Callable[[Any], str]] = {ord("s"): str, ord("r"): repr, ord("a"): ascii}


def convert(value: Any, conversion: int) -> Any:
    """Apply an f-string conversion (``!s``, ``!r``, ``!a``; -1 for none)."""
    return value if conversion == -1 else CONVERSIONS[conversion](value)


def format_now(value: Any, conversion: int, spec: str) -> str:
    """``f"{value!conversion:spec}"``, computed by Python even while tracing."""
    return f"{convert(value, conversion):{spec}}"


def _mark_constant(dynamo: ModuleType) -> None:
    dynamo.assume_constant_result(format_now)


when_imported("torch._dynamo", _mark_constant)
