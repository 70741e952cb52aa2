"""The changes TorchDynamo records to objects that existed before the trace, counted.

What the graph changes of Python objects (a list appended to, an attribute stored) is
applied after it; which objects change is in the side effects
(:func:`graphmend.runtime.pending_effects.changed_sources`), but not how often: a list
a frame appended to before a branch, appended to again in the branch, looks the same
afterwards.  So the calls recording such a change
(``torch._dynamo.side_effects.SideEffects.mutation`` and ``store_attr``) are counted,
once wrapped, for an attempt to compare before and after
(:meth:`graphmend.runtime.attempts.Attempt.changed_object`).
"""

from __future__ import annotations

import functools
import threading
from typing import Any

_PATCHED = "_graphmend_counts_changes"
_counted = threading.local()


def changes_so_far() -> int:
    """How many changes to objects that existed before their trace TorchDynamo has
    recorded in this thread (asked while tracing)."""
    _count_changes()
    return getattr(_counted, "changes", 0)


def _count_changes() -> None:
    from torch._dynamo.side_effects import SideEffects

    for name in ("mutation", "store_attr"):
        original = getattr(SideEffects, name)
        if getattr(original, _PATCHED, False):
            continue
        setattr(SideEffects, name, _counting(original))


def _counting(original: Any) -> Any:
    @functools.wraps(original)
    def recording(self: Any, item: Any, *args: Any, **kwargs: Any) -> Any:
        if _existed_before_the_trace(item):
            _counted.changes = getattr(_counted, "changes", 0) + 1
        return original(self, item, *args, **kwargs)

    setattr(recording, _PATCHED, True)
    return recording


def _existed_before_the_trace(item: Any) -> bool:
    """Whether a TorchDynamo variable stands for an object made before the trace: it has
    a source, and its mutation kind is not a ``...New`` one (``mutation_type`` on torch
    2.13, ``mutable_local`` on 2.5, where an iterator made while tracing has a plain
    ``MutableLocal``)."""
    mutation = getattr(item, "mutation_type", None) or getattr(item, "mutable_local", None)
    return (
        getattr(item, "source", None) is not None
        and mutation is not None
        and "New" not in type(mutation).__name__
    )
