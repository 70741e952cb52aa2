"""Updates in place that a traced graph makes and fake tensors' version counters miss.

GraphMend tells whether the graph being traced updated a tensor in place from the
version counter of its fake tensor, which a traced in-place operation bumps, a view's
and its base's alike.  Two kinds of update escape it: one through ``t.data``, a tensor
sharing ``t``'s memory with a version counter of its own, and, on torch 2.5, one by
index (``t[0] = v``), which TorchDynamo does not run on the fake tensor.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable

import torch
from torch.multiprocessing.reductions import StorageWeakRef


def updated_uncounted(nodes: Iterable[torch.fx.Node], tensors: Iterable[torch.Tensor]) -> bool:
    """Whether one of ``nodes`` updates in place, uncounted by their version counters, a
    tensor sharing memory with one of ``tensors`` (fake): through its ``.data``
    (``y.data.add_(1)``) or by index (``y[0] = v``)."""
    storages = storages_of(tensors)
    for node in nodes:
        if node.target is torch._C._autograd._get_data_attr:
            value = _example(node)
            updated = value is not None and value._version != 0
        else:
            value = _example(node.args[0]) if node.target is operator.setitem else None
            updated = value is not None
        if updated and storages_of([value]) & storages:
            return True
    return False


def storages_of(tensors: Iterable[object]) -> set[StorageWeakRef]:
    """The storages of the tensors among ``tensors``."""
    return {
        StorageWeakRef(tensor.untyped_storage())
        for tensor in tensors
        if isinstance(tensor, torch.Tensor)
    }


def _example(node: object) -> torch.Tensor | None:
    value = node.meta.get("example_value") if isinstance(node, torch.fx.Node) else None
    return value if isinstance(value, torch.Tensor) else None
