"""The graph breaks TorchDynamo takes in a call, located at the user's line and sorted by kind.

Breaks are observed with ``torch._dynamo.explain`` (a fresh Dynamo state, its
own recording backend, nothing compiled for real).  Each break is placed at the
innermost frame of the user's code (neither torch's nor GraphMend's runtime),
and given a category from TorchDynamo's reason, so that a report can say, per
line, what kind of break remains and what GraphMend decided there.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

import graphmend
from graphmend.runtime.fallbacks import user_function

#: Frames in these directories are not the user's.
_NOT_USER = tuple(os.path.dirname(package.__file__) + os.sep for package in (torch, graphmend))

#: (category, words of TorchDynamo's reason that mark it), first match wins; the
#: words cover torch 2.5 ("generic_jump", "call_function BuiltinVariable(print)")
#: through 2.13 ("Data-dependent branching", "Unsupported Tensor.item() call").
_CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("branch", ("data-dependent branching", "generic_jump", "data dependent jump")),
    (
        "dynamic shape",
        ("dynamic shape", "unbacked", "data-dependent expression", "guard on data-dependent"),
    ),
    ("host value", (".item()", "tensor.item", "tolist", "_local_scalar_dense", "scalar output")),
    ("output call", ("print", "logging", "logger", "warnings.warn", "warn(")),
    ("unsupported call", ("skip", "unsupported", "builtin", "not supported", "cannot trace")),
)


@dataclass(frozen=True)
class ObservedBreak:
    """A graph break at a line of user code."""

    filename: str
    lineno: int
    function: str
    category: str
    reason: str

    def location(self) -> str:
        """``file:line``."""
        return f"{self.filename}:{self.lineno}"

    def to_json(self) -> dict[str, object]:
        """The break as plain JSON values."""
        return asdict(self)


@dataclass(frozen=True)
class Observation:
    """What TorchDynamo made of one call: its graphs and where it broke."""

    graphs: int
    breaks: tuple[ObservedBreak, ...]

    def to_json(self) -> dict[str, object]:
        """The observation as plain JSON values."""
        return {"graphs": self.graphs, "breaks": [b.to_json() for b in self.breaks]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Observation:
        """The observation :meth:`to_json` wrote."""
        breaks = tuple(ObservedBreak(**entry) for entry in data["breaks"])
        return cls(int(data["graphs"]), breaks)


def observe(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Observation:
    """Trace ``function(*args, **kwargs)`` with TorchDynamo and locate each graph break."""
    explained = torch._dynamo.explain(function)(*args, **kwargs)
    seen: dict[ObservedBreak, None] = {}
    for reason in explained.break_reasons:
        located = _locate(reason.user_stack, reason.reason)
        if located is not None:
            seen.setdefault(located, None)
    return Observation(explained.graph_count, tuple(seen))


def category(reason: str) -> str:
    """The kind of a break, from TorchDynamo's reason: ``branch``, ``host value``, …"""
    text = reason.lower()
    for name, words in _CATEGORIES:
        if any(word in text for word in words):
            return name
    return "other"


def _locate(stack: list[traceback.FrameSummary], reason: str) -> ObservedBreak | None:
    for frame in reversed(stack):
        if not frame.filename.startswith(_NOT_USER) and frame.lineno:
            first_line = reason.strip().splitlines()[0] if reason.strip() else reason
            function = user_function(frame.name)
            return ObservedBreak(
                frame.filename, frame.lineno, function, category(reason), first_line
            )
    return None
