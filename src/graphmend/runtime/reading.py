"""Read values while tracing without raising: a missing value is :data:`MISSING`.

Rewritten code evaluates some expressions before the original would have
(a guard's message, the submodules a branch calls).  Reading them through
these helpers turns an attribute that is not there, or a size asked of
something that is not a tensor, into :data:`MISSING`, which the runtime then
refuses (the original code runs), instead of an exception while tracing.
"""

from __future__ import annotations

from typing import Any

import torch

#: What an expression read early evaluates to when its value is missing.
MISSING = object()


def attribute(owner: Any, name: str) -> Any:
    """``owner.name``, or :data:`MISSING` where there is none."""
    return MISSING if owner is MISSING else getattr(owner, name, MISSING)


#: What :func:`callee` reads for a method of a tensor.
TENSOR_METHOD = object()


def callee(owner: Any, name: str) -> Any:
    """``owner.name``, where a branch calls it and it may be a submodule; for a tensor's
    method :data:`TENSOR_METHOD`: it is no submodule, and TorchDynamo cannot tell the
    type of a computed tensor's bound method (``isinstance`` of it breaks the graph)."""
    return TENSOR_METHOD if isinstance(owner, torch.Tensor) else attribute(owner, name)


def metadata(value: Any, query: str) -> Any:
    """``value.size()``/``dim()``/``numel()``/``len(value)`` of a tensor, or :data:`MISSING`."""
    if not isinstance(value, torch.Tensor) or (query == "__len__" and value.dim() == 0):
        return MISSING
    return len(value) if query == "__len__" else getattr(value, query)()


def sequence(value: Any, kind: str) -> Any:
    """``tuple(value)`` / ``list(value)`` of a size, tuple or list, or :data:`MISSING`."""
    if type(value) not in (tuple, list, torch.Size):
        return MISSING
    return tuple(value) if kind == "tuple" else list(value)


def type_name(value: Any) -> str:
    """``type(value).__name__``."""
    return type(value).__name__
