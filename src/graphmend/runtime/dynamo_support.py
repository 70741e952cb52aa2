"""What TorchDynamo needs so that deferred calls are never lost.

TorchDynamo collects reordered calls (``config.reorderable_logging_functions``)
per frame being traced.  Up to at least torch 2.13 the list of an inlined
frame (a submodule's ``forward``, any function called from the compiled one)
is dropped when inlining ends: the calls silently never happen.  Model code is
almost always inlined, so GraphMend makes inlined frames share the list of the
frame that owns the graph, which then runs them after the graph in order.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

_PATCHED = "_graphmend_shares_debug_locals"


def keep_inlined_deferred_calls() -> bool:
    """Make inlined frames keep their reordered calls; False if this torch cannot."""
    try:
        from torch._dynamo.symbolic_convert import InliningInstructionTranslator
    except ImportError:
        return False
    original = InliningInstructionTranslator.__init__
    if getattr(original, _PATCHED, False):
        return True
    if _handles_inlined_calls_itself(InliningInstructionTranslator):
        return True

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        parent = getattr(self, "parent", None)
        if parent is not None and hasattr(parent, "debug_locals"):
            self.debug_locals = parent.debug_locals

    setattr(__init__, _PATCHED, True)
    InliningInstructionTranslator.__init__ = __init__
    return True


def _handles_inlined_calls_itself(translator: type) -> bool:
    """Whether this torch passes an inlined frame's reordered calls on by itself."""
    try:
        return "debug_locals" in inspect.getsource(translator)
    except (OSError, TypeError):
        return False
