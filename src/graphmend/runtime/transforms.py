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

from graphmend.runtime.asking import ask_tracer


def transform_active() -> bool:
    """Whether a ``torch.func`` transform is active now (asked in Python: from a
    ``comptime`` hook while TorchDynamo traces, its levels are pushed for real)."""
    peek = getattr(torch._C._functorch, "peek_interpreter_stack", None)
    return peek is not None and peek() is not None


def inside_a_transform() -> bool:
    """Whether the code being traced runs inside a ``torch.func`` transform; False
    outside TorchDynamo.  Called only while tracing."""
    return ask_tracer(_look, False)


def _look(_tracer: Any) -> bool:
    """Asked while TorchDynamo traces :func:`inside_a_transform`."""
    return transform_active()
