"""Whether a caller of the frame being traced may catch what that frame raises.

A guard lowered into the graph raises from inside it, where no ``try`` of the traced
code can catch it.  The rewrite sees only the guard's own function (a guard inside
its ``try`` keeps its break); the functions calling it are known only while
TorchDynamo traces: each frame TorchDynamo inlines has its caller's translator as
``parent``, stopped at the call.  A call covered by an exception handler (a ``try``,
an ``except`` block) may catch the exception, and one in a ``with`` block expects
the block's exit to run (the exit the graph makes is skipped: ``torch.no_grad()``
would stay in force), so there the guard keeps its break, as without GraphMend.
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
    caller = getattr(innermost_translator(), "parent", None)
    while caller is not None:
        if _handles(caller):
            return True
        caller = getattr(caller, "parent", None)
    return False


def innermost_translator() -> Any:
    """The TorchDynamo translator running the instruction that led to this call (from a
    constant-result function, while tracing): the nearest Python frame that is one of
    its methods; ``None`` outside TorchDynamo."""
    from torch._dynamo.symbolic_convert import InstructionTranslatorBase

    frame = sys._getframe(1)
    while frame is not None:
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, InstructionTranslatorBase):
            return candidate
        frame = frame.f_back
    return None


def _handles(translator: Any) -> bool:
    """Whether the call ``translator`` stands at is covered by an exception handler of its
    frame: a ``try``, an ``except`` block's clean-up, or a ``with`` block's exit (which an
    exception raised from inside the graph would skip: ``torch.no_grad()`` would stay
    in force)."""
    if sys.version_info < (3, 11):  # a block per try, with and except being handled
        return bool(getattr(translator, "block_stack", None))
    instruction = getattr(translator, "current_instruction", None)
    return getattr(instruction, "exn_tab_entry", None) is not None


def _mark_constant(dynamo: Any) -> None:
    assume_constant_result(dynamo, caught_by_caller)


when_imported("torch._dynamo", _mark_constant)
