"""Whether TorchDynamo traces the caller into the body of a higher-order operator the
program calls itself: a ``torch.utils.checkpoint`` region, a ``torch.cond`` of its own.

There every rewritten site keeps its original code.  Plain compile breaks the graph in
that body, and the operator falls back on what it does without TorchDynamo: a
checkpoint runs in Python, recomputing with the random numbers it drew and raising as
``use_reentrant`` says.  Without the break TorchDynamo captures the operator, which
computes otherwise: under the eager backend, torch 2.13's captured checkpoint draws
another dropout mask when it recomputes (other gradients, other random numbers after
the call), and a reentrant one gives parameters gradients where the original raises;
a program's ``torch.cond`` succeeds where the original fails.

The branches of a ``torch.cond`` GraphMend makes (:mod:`graphmend.runtime.selection`,
:mod:`graphmend.runtime.continuation`) are its own: sites there are rewritten as
anywhere else.  While it makes one, the subgraph it is made in is noted: the subgraphs
TorchDynamo opens on it meanwhile are that ``cond``'s branches.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from graphmend.runtime.asking import ask_tracer

#: The subgraphs (TorchDynamo's ``SubgraphTracer``) a ``torch.cond`` of GraphMend's is
#: being made in now.
_opening: weakref.WeakSet[Any] = weakref.WeakSet()


@contextmanager
def making_a_cond(output: Any) -> Iterator[None]:
    """GraphMend makes a ``torch.cond`` in this block, in ``output``'s current subgraph."""
    subgraph = output.current_tracer
    _opening.add(subgraph)
    try:
        yield
    finally:
        _opening.discard(subgraph)


def cond_begins(context: Any) -> None:
    """A ``comptime`` hook before a ``torch.cond`` GraphMend calls from traced code."""
    _opening.add(_current_subgraph(context))


def cond_made(context: Any) -> None:
    """A ``comptime`` hook after that ``torch.cond``.  (Where TorchDynamo gave the cond
    up, the trace ends there, and its subgraphs with it.)"""
    _opening.discard(_current_subgraph(context))


def inside_a_programs_subgraph() -> bool:
    """Whether TorchDynamo traces the caller into a higher-order operator's body that is
    not GraphMend's own; False outside TorchDynamo.  Called only while tracing."""
    return ask_tracer(_look, False)


def _current_subgraph(context: Any) -> Any:
    return context._i_will_not_complain_if_bc_breaks_InstructionTranslator().output.current_tracer


def _look(tracer: Any) -> bool:
    """Asked while TorchDynamo traces :func:`inside_a_programs_subgraph`: whether a
    subgraph being traced was opened on one no ``torch.cond`` of GraphMend's is being
    made in."""
    subgraph = tracer.output.current_tracer
    while subgraph.parent is not None:
        if subgraph.parent not in _opening:
            return True
        subgraph = subgraph.parent
    return False
