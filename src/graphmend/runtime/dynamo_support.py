"""What TorchDynamo needs so that deferred calls are never lost.

TorchDynamo collects reordered calls (``config.reorderable_logging_functions``)
per frame being traced.  From torch 2.5 to 2.15 the list of an inlined frame (a
submodule's ``forward``, any function called from the compiled one) is dropped
when inlining ends (2.5 has no list there at all): the calls silently never
happen.  Model code is almost always inlined, so GraphMend makes inlined frames
share the list of the frame that owns the graph, which then runs them after the
graph in order.

A frame inlined into the body of a higher-order operator (a ``torch.cond`` branch,
a ``torch.utils.checkpoint`` region) is traced into a subgraph that runs when the
operator decides: once for the branch taken, once more for a checkpoint's
recomputation in backward.  A call deferred there would run once after the graph
whatever the body does, both branches' calls included; so there a reordered call
is refused as the original call is (a graph break, which the operator reports or
falls back on, as without GraphMend).

Upper bound policy.  The one internal patched is
``torch._dynamo.symbolic_convert.InliningInstructionTranslator.__init__``
(wrapped: the new instance's ``debug_locals`` becomes its ``parent``'s).  The
decision is made from torch's version, never by reading Dynamo's source: the
patch is applied on the releases the test suite runs on
(:data:`graphmend.torch_releases.TESTED`, both ends tested).  On a newer torch, whose
Dynamo may drop, duplicate or already keep those calls, GraphMend does not guess:
deferred calls stay off (the import hook leaves output calls as written, so they keep
their graph breaks, as without GraphMend) and one warning says so.
The patch is one attribute assignment, made when TorchDynamo is imported; its
code runs only while Dynamo inlines a frame, that is while compiling.  A second
patch (:func:`watch_frame_traces`) wraps ``InstructionTranslator.run``, the tracing of
the frame that owns the graph: GraphMend is shown its start, and the error that ends
it before it goes on (deferred calls would be lost with the trace).  (A
start-of-compile callback would be later still, but ``torch._dynamo.reset()``
removes those callbacks, and a reset before the first compile would lose the
calls silently.)  That one is applied on any release: it serves the branches and
guards rewritten too, which stay on where deferred calls are off, and whatever
GraphMend's checks there raise is contained (reported, and the trace goes on as
without them).
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from typing import Any

import torch

from graphmend import torch_releases
from graphmend.notices import warn

_PATCHED = "_graphmend_shares_debug_locals"


def keep_inlined_deferred_calls(version: str = torch.__version__) -> bool:
    """Make inlined frames keep their reordered calls; False (and a warning) on untested torch."""
    if not torch_releases.is_tested(version):
        torch_releases.warn_untested(version)
        return False
    from torch._dynamo.symbolic_convert import InliningInstructionTranslator

    original = InliningInstructionTranslator.__init__
    if getattr(original, _PATCHED, False):
        return True

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        in_subgraph = self.output.current_tracer.parent is not None
        self.debug_locals = _RefusedCalls() if in_subgraph else self.parent.debug_locals

    setattr(__init__, _PATCHED, True)
    InliningInstructionTranslator.__init__ = __init__
    return True


class _RefusedCalls(list):  # type: ignore[type-arg]
    """The reordered calls of a frame traced into a higher-order operator's subgraph:
    none is taken, each is a graph break there."""

    def append(self, call: Any) -> None:
        from torch._dynamo.exc import Unsupported

        raise Unsupported(
            "GraphMend: an output call in the body of a higher-order operator "
            "(torch.cond, checkpoint) runs where it stands"
        )


def never_compiled(function: Callable[..., Any]) -> None:
    """Called after the graph from compiled code, a function's own frame would be handed
    to TorchDynamo to compile (and fail on the call it makes, or on ``int()`` of a
    carried number: torch 2.5 compiles it with the graph's ``fullgraph``, and refuses a
    generator expression's frame there).  The code it holds (a generator expression's,
    a comprehension's) is skipped too."""
    from torch._dynamo import eval_frame

    skip_code = getattr(eval_frame, "skip_code", None)
    if skip_code is None:
        return
    codes = [function.__code__]
    while codes:
        code = codes.pop()
        skip_code(code)
        codes.extend(const for const in code.co_consts if isinstance(const, types.CodeType))


def watch_frame_traces(
    on_start: Callable[[Any], None], on_error: Callable[[Any, BaseException], None]
) -> None:
    """Call ``on_start(translator)`` as the tracing of a frame that owns a graph begins
    (``InstructionTranslator.run``), and ``on_error(translator, error)`` with the error
    that ends it, before it propagates; either may raise TorchDynamo's
    ``RestartAnalysis`` or ``SkipFrame`` instead.  Anything else either raises is
    GraphMend's own failure: it is reported once, and the tracing goes on as without
    GraphMend.  Applied once, when TorchDynamo is imported, on any release: what it
    calls is GraphMend's own, contained so."""
    from torch._dynamo import exc
    from torch._dynamo.symbolic_convert import InstructionTranslator

    original = InstructionTranslator.run
    if getattr(original, _PATCHED, False):
        return

    def contained(handler: Callable[..., None], *arguments: Any) -> None:
        try:
            handler(*arguments)
        except (exc.RestartAnalysis, exc.SkipFrame):
            raise
        except Exception as failure:
            warn(
                f"GraphMend: {handler.__name__} failed while TorchDynamo traced a frame "
                f"({type(failure).__name__}: {failure}); the frame is traced as without "
                "GraphMend's check; please report it"
            )

    @functools.wraps(original)
    def run(self: Any) -> None:
        contained(on_start, self)
        try:
            original(self)
        except Exception as error:
            contained(on_error, self, error)
            raise

    setattr(run, _PATCHED, True)
    InstructionTranslator.run = run
