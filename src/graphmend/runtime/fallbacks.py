"""Trace-time fallbacks: where a rewritten site ran its original code while tracing, and why.

A rewritten site checks while TorchDynamo traces what its source could not
prove (shapes, dtypes, submodule types, what waits for the end of the graph).
When a check fails the original code runs there and keeps its graph break;
:func:`declined` records which check failed, with the values it saw, and
``GRAPHMEND_LOG=debug`` prints each record as it is made (with the process id,
and the rank where ``RANK`` is set, so that ``torchrun`` lines can be told
apart).  :func:`graphmend.report` ties the records to the breaks that remain.

The record is made at trace time through TorchDynamo's ``comptime`` hook
(:mod:`graphmend.runtime.asking`), which runs a function in Python while tracing
and leaves nothing in the graph: the values are described from what the tracer
knows of them (a tensor's dtype and shape, symbolic sizes included), never read
from a tensor.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass
from typing import Any

import torch

from graphmend.config import ConfigError, debug_log
from graphmend.notices import write_stderr
from graphmend.runtime.asking import ask_tracer

#: The name TorchDynamo gives the rest of a function after a graph break.
_RESUMED = re.compile(r"^torch_dynamo_resume_in_(.+)_at_\d+$")
#: Files whose frames are GraphMend's, skipped when looking for the user's line.
_RUNTIME_DIR = os.path.dirname(__file__)
#: The attribute of the tracer of a site's runtime function that is called with the
#: reason before a decline there is recorded (set by ``runtime/attempts.open_site``).
ON_DECLINE = "graphmend_on_decline"


@dataclass(frozen=True)
class Fallback:
    """A rewritten site that ran its original code while tracing, and why."""

    filename: str
    lineno: int
    function: str
    rewrite: str
    reason: str

    def location(self) -> str:
        """``file:line``."""
        return f"{self.filename}:{self.lineno}"

    def to_json(self) -> dict[str, object]:
        """The record as plain JSON values."""
        return asdict(self)


_records: dict[Fallback, None] = {}  # insertion-ordered set


def records() -> list[Fallback]:
    """The fallbacks recorded in this process so far, each once, in order."""
    return list(_records)


def clear() -> None:
    """Forget the recorded fallbacks (``graphmend.report`` starts from none)."""
    _records.clear()


def declined(rewrite: str, template: str, *values: Any) -> None:
    """Record that the site being traced runs its original code: ``template`` says
    why, its ``{0}``, ``{1}``, … are filled with descriptions of ``values`` ("None",
    "a float32[2, 8] tensor").  Called only while TorchDynamo traces."""
    ask_tracer(_record, None, rewrite, template, values)


def _record(
    tracer: Any, rewrite_variable: Any, template_variable: Any, values_variable: Any
) -> None:
    """Asked while TorchDynamo traces :func:`declined`.

    A site that traced code before declining (``runtime/attempts.open_site``) is told
    the reason first: it may restart the analysis, and record it then."""
    rewrite = rewrite_variable.as_python_constant()
    template = template_variable.as_python_constant()
    reason = template.format(*(describe(value) for value in values_variable.items))
    caller = tracer
    while caller is not None and os.path.dirname(caller.f_code.co_filename) == _RUNTIME_DIR:
        site_declines = getattr(caller, ON_DECLINE, None)
        if site_declines is not None:
            site_declines(reason)
            break
        caller = getattr(caller, "parent", None)
    record_at(tracer, rewrite, reason)


def record_at(tracer: Any, rewrite: str, reason: str) -> None:
    """Record a fallback at the user's line being traced, from a ``comptime`` hook given
    ``tracer``, the translator of a runtime function (:mod:`graphmend.runtime.asking`)."""
    while tracer is not None and os.path.dirname(tracer.f_code.co_filename) == _RUNTIME_DIR:
        tracer = getattr(tracer, "parent", None)
    if tracer is None:
        return
    code = tracer.f_code
    fallback = Fallback(
        code.co_filename, tracer.lineno, user_function(code.co_name), rewrite, reason
    )
    if fallback not in _records:
        _records[fallback] = None
        _log(fallback)


def resumes_after_break(name: str) -> bool:
    """Whether ``name`` is one TorchDynamo gives the rest of a function after a break."""
    return _RESUMED.match(name) is not None


def user_function(name: str) -> str:
    """The user's name for a function TorchDynamo resumed after a break, else ``name``."""
    return _RESUMED.sub(r"\1", name)


def describe(variable: Any) -> str:
    """A value as the tracer knows it: ``None``, ``the int 3``, ``a float32[2, 8] tensor``."""
    if variable.is_python_constant():
        try:
            value = variable.as_python_constant()
        except NotImplementedError:  # a constant the tracer cannot hand out
            return f"a {variable.python_type().__name__}"
        if value is None or type(value) is bool:
            return repr(value)
        return f"the {type(value).__name__} {value!r}"
    kind = variable.python_type()
    if issubclass(kind, torch.Tensor):
        example = variable.as_proxy().node.meta.get("example_value")
        if isinstance(example, torch.Tensor):
            dtype = str(example.dtype).removeprefix("torch.")
            shape = ", ".join(str(size) for size in example.shape)
            return f"a {dtype}[{shape}] tensor"
        return "a tensor"
    if kind in (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool):
        return f"a {kind.__name__.removeprefix('Sym').lower()} known only at run time"
    if kind in (tuple, list) and hasattr(variable, "items"):
        return f"a {kind.__name__} of " + ", ".join(describe(item) for item in variable.items)
    return f"a {kind.__name__}"


def _log(fallback: Fallback) -> None:
    try:
        wanted = debug_log()
    except ConfigError:  # reported when the hook was installed
        return
    if wanted:
        rank = os.environ.get("RANK")
        who = f"pid {os.getpid()}" + (f" rank {rank}" if rank is not None else "")
        write_stderr(
            f"graphmend [{who}]: {fallback.location()} ({fallback.function}): "
            f"{fallback.rewrite} site runs its original code while tracing: {fallback.reason}\n"
        )
