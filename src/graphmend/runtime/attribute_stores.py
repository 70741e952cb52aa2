"""The tensors a graph being traced stores an attribute on (``t.tag = v``, ``t.grad = g``).

An attribute stored on a merged tensor tells it apart from the branch's own: the
original stores it on the tensor the branch gave (often the caller's ``x``), the merge
on a new one.  TorchDynamo 2.13 drops such a store on a tensor the graph made that
nothing else holds before GraphMend's check at the graph's end
(:mod:`graphmend.runtime.aliasing`) sees it, so stores are noted as they are traced:
``torch._dynamo.side_effects.SideEffects.store_attr`` is wrapped once, from the first
merge recorded.  Torch 2.5's side effects do not know their graph, and nothing is noted
there (its TorchDynamo breaks the graph at such a store instead)."""

from __future__ import annotations

import functools
from typing import Any

import torch

_PATCHED = "_graphmend_notes_tensor_stores"
_NOTED = "_graphmend_tensors_stored_on"


def note_tensor_stores() -> None:
    """Note, on each graph being traced, the fake tensors an attribute is stored on
    (where the tracer's side effects know their graph: not on torch 2.5)."""
    from torch._dynamo.side_effects import SideEffects

    original = SideEffects.store_attr
    if getattr(original, _PATCHED, False):
        return

    @functools.wraps(original)
    def store_attr(self: Any, item: Any, *args: Any, **kwargs: Any) -> Any:
        tensor = _fake_of(item)
        graph = getattr(self, "output_graph_weakref", None)  # torch 2.5 has none
        output = graph() if graph is not None else None
        if tensor is not None and output is not None:
            output.__dict__.setdefault(_NOTED, []).append(tensor)
        return original(self, item, *args, **kwargs)

    setattr(store_attr, _PATCHED, True)
    SideEffects.store_attr = store_attr


def stored_on(output: Any, tensors: list[torch.Tensor]) -> bool:
    """Whether the graph ``output`` stored an attribute on one of ``tensors``."""
    noted = output.__dict__.get(_NOTED, [])
    return any(stored is tensor for stored in noted for tensor in tensors)


def _fake_of(item: Any) -> torch.Tensor | None:
    """The fake tensor of a TorchDynamo tensor variable; ``None`` for any other value."""
    from torch._dynamo.variables import TensorVariable

    if not isinstance(item, TensorVariable):
        return None
    value = item.proxy.node.meta.get("example_value")
    return value if isinstance(value, torch.Tensor) else None
