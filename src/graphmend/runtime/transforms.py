"""Whether TorchDynamo traces inside a ``torch.func`` transform (``vmap``, ``grad``,
``jvp``...).

There TorchDynamo traces the transformed function with wrapped fake tensors (a
``BatchedTensor``, a ``GradTrackingTensor``), whose storage cannot be read and
whose text names the transform's level.  A merged site's aliasing check failed the
compile with an internal error (plain compile falls back to the transform run
eagerly), and a deferred ``print`` of a tensor printed it after the transform had
ended (``GradTrackingTensor(lvl=-2, ...)`` where the original prints ``lvl=1``).
Sites there keep their original code.
"""

from __future__ import annotations

from typing import Any

import torch


def transform_active() -> bool:
    """Whether a ``torch.func`` transform is active now (asked in Python: from a
    ``comptime`` hook while TorchDynamo traces, its levels are pushed for real)."""
    peek = getattr(torch._C._functorch, "peek_interpreter_stack", None)
    return peek is not None and peek() is not None


def inside_a_transform() -> bool:
    """Whether the code being traced runs inside a ``torch.func`` transform; False
    outside TorchDynamo.  Called only while tracing."""
    inside = False  # set by _look while TorchDynamo traces this frame
    torch._dynamo.comptime.comptime(_look)
    return inside


def _look(context: Any) -> None:
    """Runs in Python while TorchDynamo traces :func:`inside_a_transform`."""
    if not transform_active():
        return
    try:
        from torch._dynamo.variables import ConstantVariable

        tracer = context._i_will_not_complain_if_bc_breaks_InstructionTranslator()
        tracer.symbolic_locals["inside"] = ConstantVariable.create(True)
    except (AttributeError, ImportError):
        return
