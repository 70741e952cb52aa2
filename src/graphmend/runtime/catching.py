"""Whether a caller of the frame being traced may catch what that frame raises.

A guard lowered into the graph raises from inside it, where no ``try`` of the traced
code can catch it.  The rewrite sees only the guard's own function (a guard inside
its ``try`` keeps its break); the functions calling it are known only while
TorchDynamo traces: each frame TorchDynamo inlines has its caller's translator as
``parent``, stopped at the call.  A call covered by an exception handler (a ``try``,
a ``with`` whose manager is not one of torch's own, an ``except`` block) may catch
the exception, so there the guard keeps its break, as without GraphMend.
"""

from __future__ import annotations

import sys
from typing import Any

from graphmend.post_import import when_imported
from graphmend.runtime.formatting import assume_constant_result


def caught_by_caller() -> bool:
    """Whether a frame that (directly or not) called the one being traced, and is traced
    with it, would handle an exception raised there (asked while tracing; marked as a
    constant-result function, so that Python runs it then)."""
    from torch._dynamo.symbolic_convert import InstructionTranslatorBase

    translator = _innermost(InstructionTranslatorBase)
    caller = getattr(translator, "parent", None)
    while caller is not None:
        if _handles(caller):
            return True
        caller = getattr(caller, "parent", None)
    return False


def _innermost(translator_type: type) -> Any:
    """The translator running the instruction that called this function: the nearest
    Python frame that is one of its methods."""
    frame = sys._getframe(1)
    while frame is not None:
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, translator_type):
            return candidate
        frame = frame.f_back
    return None


def _handles(translator: Any) -> bool:
    """Whether an exception raised by the call ``translator`` stands at would be handled
    in its frame (by anything but a torch context manager, which never swallows one)."""
    blocks = getattr(translator, "block_stack", [])
    only_torch_contexts = all(_torch_context(block) for block in blocks)
    if sys.version_info < (3, 11):  # a block per try, with and except being handled
        return not only_torch_contexts
    instruction = getattr(translator, "current_instruction", None)
    entry = getattr(instruction, "exn_tab_entry", None)
    if entry is None:
        return False
    # TorchDynamo's block stack holds the with blocks outside any try; a handler that is
    # not the innermost of them is a try's (or an except block's clean-up)
    return not blocks or entry.target is not blocks[-1].target or not only_torch_contexts


def _torch_context(block: Any) -> bool:
    from torch._dynamo.variables.ctx_manager import ContextWrappingVariable

    return isinstance(getattr(block, "with_context", None), ContextWrappingVariable)


def _mark_constant(dynamo: Any) -> None:
    assume_constant_result(dynamo, caught_by_caller)


when_imported("torch._dynamo", _mark_constant)
