"""The graph breaks TorchDynamo takes in a call, located at the user's line and sorted by kind.

Breaks are observed with ``torch._dynamo.explain`` (a fresh Dynamo state, its
own recording backend, nothing compiled for real).  Each break is placed at the
innermost frame of the user's code (neither torch's nor GraphMend's runtime),
and given a category from TorchDynamo's reason, so that a report can say, per
line, what kind of break remains and what GraphMend decided there.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Callable, Iterator
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
    (
        "host value",
        (".item()", "tensor.item", "tolist", "_local_scalar_dense", "data dependent operator"),
    ),
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
    """Trace ``function(*args, **kwargs)`` with TorchDynamo and locate each graph break.

    Breaks come from ``explain``'s reasons (a break that ends a graph) and from
    TorchDynamo's ``graph_breaks`` log (every break, once per site and kind), since
    each misses some.
    """
    log = _BreakLog()
    with graph_break_log(log):
        explained = torch._dynamo.explain(function)(*args, **kwargs)
    seen: dict[tuple[str, int], ObservedBreak] = {}
    for reason in explained.break_reasons:
        located = _locate(
            [(frame.filename, frame.lineno or 0, frame.name) for frame in reason.user_stack],
            reason.reason,
        )
        if located is not None:
            seen.setdefault((located.filename, located.lineno), located)
    for located in log.breaks:
        seen.setdefault((located.filename, located.lineno), located)
    return Observation(explained.graph_count, tuple(seen.values()))


def category(reason: str) -> str:
    """The kind of a break, from TorchDynamo's reason: ``branch``, ``host value``, …"""
    text = reason.lower()
    for name, words in _CATEGORIES:
        if any(word in text for word in words):
            return name
    return "other"


def _locate(stack: list[tuple[str, int, str]], reason: str) -> ObservedBreak | None:
    for filename, lineno, name in reversed(stack):
        if not filename.startswith(_NOT_USER) and lineno:
            lines = [line.strip() for line in reason.splitlines() if line.strip()]
            first = next((line for line in lines if not line.startswith(_WRAPPERS)), "")
            return ObservedBreak(filename, lineno, user_function(name), category(reason), first)
    return None


_WRAPPERS = ("Encountered graph break", "Failed to handle graph break", "Graph Break Reason:")
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


class _BreakLog(logging.Handler):
    """TorchDynamo's ``graph_breaks`` log records, as located breaks."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.breaks: list[ObservedBreak] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        frames = [(name, int(line), function) for name, line, function in _FRAME.findall(message)]
        head = message.partition("User code traceback:")[0]
        reason = head.partition("Graph Break Reason:")[2] or message
        located = _locate(frames, reason)
        if located is not None:
            self.breaks.append(located)


@contextlib.contextmanager
def graph_break_log(handler: logging.Handler) -> Iterator[None]:
    """Hand TorchDynamo's ``graph_breaks`` log records to ``handler``, and to no other
    handler (nothing is printed), while active."""
    import torch._dynamo.symbolic_convert  # noqa: F401  (creates the artifact logger)

    saved = []
    for name in list(logging.root.manager.loggerDict):
        if name.endswith(".__graph_breaks"):
            logger = logging.getLogger(name)
            saved.append((logger, logger.propagate, logger.level))
            logger.addHandler(handler)
            logger.propagate = False
            logger.setLevel(logging.DEBUG)
    try:
        yield
    finally:
        for logger, propagate, level in saved:
            logger.removeHandler(handler)
            logger.propagate = propagate
            logger.setLevel(level)
