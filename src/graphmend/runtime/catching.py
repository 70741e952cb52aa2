"""Whether a caller of the frame being traced may catch what that frame raises.

A guard lowered into the graph raises from inside it, where no ``try`` of the traced
code can catch it.  The rewrite sees only the guard's own function (a guard inside
its ``try`` keeps its break); the functions calling it are known only while
TorchDynamo traces: each frame TorchDynamo inlines has its caller's translator as
``parent``, stopped at the call.  A call covered by an exception handler (a ``try``,
an ``except`` block) may catch the exception, and one in a ``with`` block expects
the block's exit to run (the exit the graph makes is skipped: ``torch.no_grad()``
would stay in force), so there the guard keeps its break, as without GraphMend.

``torch.export``'s non-strict mode runs the code in Python, with
``torch.compiler.is_compiling()`` true and no translator: there the callers are real
frames, up to the one where the export called the root module, and each is asked the
same question at the instruction it stands at.
"""

from __future__ import annotations

import dis
import functools
import os
import sys
from types import CodeType, FrameType
from typing import Any

import torch

import graphmend
from graphmend.post_import import when_imported
from graphmend.runtime.formatting import assume_constant_result


def caught_by_caller() -> bool:
    """Whether a frame that (directly or not) called the one being traced, and is traced
    with it, would handle an exception raised there (asked while tracing; marked as a
    constant-result function, so that Python runs it then)."""
    translator = innermost_translator()
    if translator is None:
        return _caught_in_python(sys._getframe(1))
    caller = getattr(translator, "parent", None)
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


_TORCH = os.path.dirname(torch.__file__) + os.sep
_GRAPHMEND = os.path.dirname(graphmend.__file__) + os.sep
#: Where non-strict ``torch.export`` calls the module it exports (``torch/export/``).
_EXPORT = os.path.join(_TORCH, "export") + os.sep


def _caught_in_python(frame: FrameType | None) -> bool:
    """Whether a frame from ``frame`` up to where ``torch.export`` called the root module
    stands at a call covered by an exception handler (torch's and GraphMend's own frames,
    the tracing machinery between the user's calls, are passed over).  True where no
    such export frame is found: code run in Python by an unknown tracer (or eagerly, by
    a thread while another compiles) keeps its original raise."""
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename.startswith(_EXPORT):
            return False
        if not filename.startswith((_TORCH, _GRAPHMEND)) and _covered(frame.f_code, frame.f_lasti):
            return True
        frame = frame.f_back
    return True


def _covered(code: CodeType, offset: int) -> bool:
    """Whether the instruction at byte ``offset`` of ``code`` lies in a ``try``, an
    ``except`` block or a ``with`` block."""
    return any(start <= offset < end for start, end in _protected_ranges(code))


@functools.lru_cache(maxsize=256)
def _protected_ranges(code: CodeType) -> tuple[tuple[int, int], ...]:
    """The byte ranges of ``code`` that an exception handler covers."""
    if sys.version_info >= (3, 11):
        return tuple((entry.start, entry.end) for entry in dis.Bytecode(code).exception_entries)
    # 3.10: a block from its SETUP instruction to its handler (bytecode is laid out
    # in order: the protected body lies between the two)
    setups = ("SETUP_FINALLY", "SETUP_WITH", "SETUP_ASYNC_WITH")
    return tuple(
        (instruction.offset, instruction.argval)
        for instruction in dis.get_instructions(code)
        if instruction.opname in setups
    )


def _mark_constant(dynamo: Any) -> None:
    assume_constant_result(dynamo, caught_by_caller)


when_imported("torch._dynamo", _mark_constant)
