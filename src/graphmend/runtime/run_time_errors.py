"""Operations that trace and then raise when they run, whatever the data.

A branch T1 merges with ``torch.where`` runs even where it is not taken, so
everything in it must succeed on the inputs it is given.  Tracing checks most of
that (a reshape to a size its tensor lacks fails on fake tensors), but not all:
``max()``, ``min()`` and ``mode()`` of an empty tensor, which have no identity to
return, a subtraction with one bool operand (``mask - 1``), and an integer tensor
raised to a negative integer power (``n ** -1``) are accepted by their fake kernels
and raise in the real ones (torch 2.13).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

#: Reductions without an identity: they raise on an empty tensor (with or without
#: ``dim``); ``max``/``min`` of two tensors are element-wise and never do.
_NO_IDENTITY = frozenset({"max", "min", "mode"})
#: Subtractions: their kernels refuse a bool operand, their fake kernels only two.
_SUBTRACTIONS = frozenset({"sub", "subtract", "rsub", "__sub__", "__rsub__"})
#: Powers: their kernels refuse an integer tensor to a negative integer power.
_POWERS = frozenset({"pow", "__pow__"})


def raising_operation(nodes: Iterable[Any]) -> str | None:
    """What an operation among ``nodes`` (graph nodes) does that raises when it runs,
    whatever the data, though it traced; ``None`` if none does."""
    nodes = list(nodes)
    reduction = reduction_of_empty(nodes)
    if reduction is not None:
        return f"takes {reduction}() of a tensor that may be empty"
    for node in nodes:
        name = _name(node)
        if name in _SUBTRACTIONS and any(_is_bool(value) for value in node.args):
            return "subtracts with a bool operand"
        if name in _POWERS and len(node.args) == 2 and _negative_integer_power(*node.args):
            return "raises an integer tensor to a negative integer power"
    return None


def reduction_of_empty(nodes: Iterable[Any]) -> str | None:
    """The name of a traced reduction in ``nodes`` (graph nodes) that may be given an
    empty tensor when it runs, or ``None``."""
    for node in nodes:
        name = _name(node)
        if name not in _NO_IDENTITY or not node.args:
            continue
        others = [*node.args[1:], *node.kwargs.values()]
        if any(_tensor(value) is not None for value in others):
            continue  # element-wise, between two tensors
        reduced = _tensor(node.args[0])
        if reduced is not None and not _surely_not_empty(reduced):
            return name
    return None


def _name(node: Any) -> str | None:
    """The name of the function or method a graph node calls."""
    target = node.target
    return target if isinstance(target, str) else getattr(target, "__name__", None)


def _is_bool(value: Any) -> bool:
    """A bool, or a (fake) bool tensor."""
    tensor = _tensor(value)
    return type(value) is bool or (tensor is not None and tensor.dtype == torch.bool)


def _negative_integer_power(base: Any, exponent: Any) -> bool:
    """An integer tensor to an integer power that is negative or may be (symbolic)."""
    tensor = _tensor(base)
    if tensor is None or tensor.is_floating_point() or tensor.is_complex():
        return False
    if type(exponent) is int:
        return exponent < 0
    example = getattr(exponent, "meta", {}).get("example_value")
    return isinstance(example, torch.SymInt)


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
