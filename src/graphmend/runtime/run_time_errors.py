"""Operations that trace and then raise when they run, whatever the data.

A branch T1 merges with ``torch.where`` runs even where it is not taken, so
everything in it must succeed on the inputs it is given.  Tracing checks most of
that (a reshape to a size its tensor lacks fails on fake tensors), but not all:
``max()``, ``min()`` and ``mode()`` of an empty tensor, which have no identity to
return, are accepted by their fake kernels and raise in the real ones.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

#: Reductions without an identity: they raise on an empty tensor (with or without
#: ``dim``); ``max``/``min`` of two tensors are element-wise and never do.
_NO_IDENTITY = frozenset({"max", "min", "mode"})


def reduction_of_empty(nodes: Iterable[Any]) -> str | None:
    """The name of a traced reduction in ``nodes`` (graph nodes) that may be given an
    empty tensor when it runs, or ``None``."""
    for node in nodes:
        target = node.target
        name = target if isinstance(target, str) else getattr(target, "__name__", None)
        if name not in _NO_IDENTITY or not node.args:
            continue
        others = [*node.args[1:], *node.kwargs.values()]
        if any(_tensor(value) is not None for value in others):
            continue  # element-wise, between two tensors
        reduced = _tensor(node.args[0])
        if reduced is not None and not _surely_not_empty(reduced):
            return name
    return None


def _tensor(value: Any) -> torch.Tensor | None:
    """The (fake) tensor a graph node stands for, if it stands for one."""
    example = getattr(value, "meta", {}).get("example_value")
    return example if isinstance(example, torch.Tensor) else None


def _surely_not_empty(tensor: torch.Tensor) -> bool:
    numel = tensor.numel()
    if isinstance(numel, int):
        return numel > 0
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    return statically_known_true(numel > 0)
