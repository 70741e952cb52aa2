"""The check at every rewritten site: is TorchDynamo tracing this code, or torch.export?

``torch.compiler.is_compiling()`` says so on torch releases before
``torch.compiler.is_exporting()`` existed.  From then on it is true whenever *some*
thread compiles (torch 2.13 holds it for a whole compile session): code another thread
ran eagerly meanwhile took the tracing path, and where that thread was inside a
compiled call (a frame TorchDynamo fell back on), GraphMend's runtime calls were
compiled as frames of their own (more graphs than plain ``torch.compile``).  There the
check is ``is_dynamo_compiling()`` (folded to a constant by TorchDynamo, False in
Python) or ``is_exporting()`` (non-strict export runs the code in Python).

TorchDynamo marks a frame that asks either as one whose traced history differs from
eager, and compiles it even when it traced no operation (an empty graph, where plain
compile runs the frame eagerly: one graph more, on a path that returns its argument).
Both paths of a rewritten site are the same program, so the check takes the mark back:
it is its own tracer's while TorchDynamo inlines it, merged into the caller's on return.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from graphmend.post_import import when_imported
from graphmend.runtime.dynamo_support import never_compiled
from graphmend.runtime.subgraphs import inside_a_programs_subgraph

#: What says that TorchDynamo traces (folded to True there).
_DYNAMO_TRACES: Callable[[], bool] = (
    torch.compiler.is_dynamo_compiling
    if hasattr(torch.compiler, "is_exporting")
    else torch.compiler.is_compiling
)
#: What says that non-strict torch.export runs the code (in Python).
_EXPORTS: Callable[[], bool] = getattr(torch.compiler, "is_exporting", lambda: False)


def tracing() -> bool:
    """True while TorchDynamo traces the caller or torch.export runs it, False when the
    code runs eagerly, or while TorchDynamo traces it into the body of a higher-order
    operator the program calls (:mod:`graphmend.runtime.subgraphs`)."""
    if _DYNAMO_TRACES():
        torch._dynamo.comptime.comptime(_consistent_with_eager)
        return not inside_a_programs_subgraph()
    return _EXPORTS()


def dynamo_traces() -> bool:
    """True while TorchDynamo traces the caller (not under non-strict export), taking
    back the mark as :func:`tracing` does."""
    if torch.compiler.is_dynamo_compiling():
        torch._dynamo.comptime.comptime(_consistent_with_eager)
        return True
    return False


def _consistent_with_eager(context: Any) -> None:
    """Runs in Python while TorchDynamo traces :func:`tracing`: takes back the mark its
    check left on its own (inlined) tracer."""
    try:
        tracer = context._i_will_not_complain_if_bc_breaks_InstructionTranslator()
    except AttributeError:
        return
    if getattr(tracer, "parent", None) is not None and hasattr(tracer, "inconsistent_side_effects"):
        tracer.inconsistent_side_effects = False


def _never_a_frame(_dynamo: object = None) -> None:
    # Called from a frame TorchDynamo runs in Python, the check would be compiled as a
    # frame of its own, where is_dynamo_compiling() is True.
    never_compiled(tracing)
    never_compiled(dynamo_traces)


when_imported("torch._dynamo", _never_a_frame)
