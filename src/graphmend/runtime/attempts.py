"""Trying something while TorchDynamo traces, and taking it back if it fails.

Code traced by TorchDynamo cannot catch what fails while it is traced: an error
raised making a fake-tensor call (``x.reshape(3, -1)`` of a tensor of 8 elements,
``torch.cat`` of mismatched shapes) stops the whole compilation and reaches the
caller.  The rewrites evaluate code the original may not have run (both branches
of an ``if``, under T1), so they make such calls from a ``comptime`` hook, in
Python while tracing, where the error can be caught: :class:`Attempt` saves what
the call may change in the tracer (the graph's nodes, the side effects that wait
for the end of the graph, the calls deferred after it) and :meth:`Attempt.undo`
puts it back, so that the original code then runs as if nothing had been tried.
The tracer's internals are not public API: they have this shape on the torch
releases GraphMend is tested with (2.5 and 2.13).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from graphmend.runtime.fallbacks import record_at


class Attempt:
    """The tracer's state before something is tried, to take the attempt back: nothing
    of it may stay when the original code runs instead (a node left in the graph fails
    the backend or runs for nothing, an attribute stored or an output call deferred
    would happen again)."""

    def __init__(self, tracer: Any) -> None:
        self.tracer = tracer
        self.graph = tracer.output.graph
        self.nodes = set(self.graph.nodes)
        self.side_effects = tracer.output.side_effects.clone()
        self.deferred = len(tracer.debug_locals)

    def added(self, target: Any = None) -> list[Any]:
        """The nodes the attempt added, in graph order (those calling ``target``)."""
        return [
            node
            for node in self.graph.nodes
            if node not in self.nodes and (target is None or node.target is target)
        ]

    def undo(self) -> None:
        for node in reversed(self.added()):
            if node.op != "placeholder":
                self.tracer.output.remove_node(node)
        self.tracer.output.side_effects = self.side_effects
        del self.tracer.debug_locals[self.deferred :]


def tracer_control() -> tuple[type[BaseException], ...]:
    """TorchDynamo's own control flow (restart the analysis, skip the frame): it must
    pass through an attempt, whatever else the attempt catches."""
    from torch._dynamo import exc

    return (exc.RestartAnalysis, exc.SkipFrame)


def first_line(error: BaseException) -> str:
    """The first useful line of what an attempt raised, for the fallback's reason."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    useful = [line for line in lines if "doesn't work unless it is captured" not in line]
    return (useful or lines or [type(error).__name__])[0][:300]


def call_or_none(
    rewrite: str, function: Callable[..., Any], arguments: Sequence[Any]
) -> Any | None:
    """``function(*arguments)``, traced; ``None`` (the attempt undone, the reason
    recorded for ``rewrite``) where tracing it fails.  Called only while tracing."""
    result = None  # set by _call while TorchDynamo traces this frame
    torch._dynamo.comptime.comptime(_call)
    return result


def _call(context: Any) -> None:
    """Runs in Python while TorchDynamo traces :func:`call_or_none`."""
    rewrite = "predicate"  # the only caller; asked of TorchDynamo only in the try below
    try:
        rewrite = context.get_local("rewrite").as_python_constant()
        tracer = context._i_will_not_complain_if_bc_breaks_InstructionTranslator()
        function = _variable(context, "function")
        arguments = _variable(context, "arguments").items
        attempt = Attempt(tracer)
    except (AttributeError, ImportError, KeyError, TypeError) as error:
        record_at(context, rewrite, f"this torch release is not supported ({error})")
        return
    try:
        result = tracer.inline_user_function_return(function, list(arguments), {})
    except tracer_control():
        raise
    except Exception as error:
        attempt.undo()
        record_at(context, rewrite, f"a branch cannot be traced: {first_line(error)}")
        return
    tracer.symbolic_locals["result"] = result


def _variable(context: Any, name: str) -> Any:
    return context.get_local(name)._i_will_not_complain_if_bc_breaks_VariableTracker()
