"""Updates in place that a traced graph makes and fake tensors' version counters miss.

GraphMend tells whether the graph being traced updated a tensor in place from the
version counter of its fake tensor, which a traced in-place operation bumps, a view's
and its base's alike.  Two kinds of update escape it: one through ``t.data``, a tensor
sharing ``t``'s memory with a version counter of its own, and, on torch 2.5, one by
index (``t[0] = v``), which TorchDynamo does not run on the fake tensor
(:func:`updated_uncounted`).  torch 2.5's ``torch.cond`` lets such an update of an
operand through, so a branch's graph is read for them as written
(:func:`updates_an_input`).
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
    updated = []
    for node in nodes:
        if node.target is torch._C._autograd._get_data_attr:
            value = example_of(node)
            if value is not None and value._version != 0:
                updated.append(value)
        elif node.target is operator.setitem:
            updated.append(example_of(node.args[0]))
    # the storages of ``tensors`` (a model's parameters, say) only where a node updates
    return bool(updated) and bool(storages_of(updated) & storages_of(tensors))


#: Tensor methods and ``torch`` functions whose result is a view of their first argument
#: (or, ``_get_data_attr``, shares its memory), through which an update reaches it.
_VIEWS = frozenset(
    {
        "getitem",
        "_get_data_attr",
        "view",
        "view_as",
        "reshape",
        "reshape_as",
        "flatten",
        "unflatten",
        "transpose",
        "permute",
        "t",
        "T",
        "mT",
        "expand",
        "expand_as",
        "narrow",
        "select",
        "squeeze",
        "unsqueeze",
        "split",
        "chunk",
        "unbind",
        "as_strided",
        "detach",
        "diagonal",
        "movedim",
        "swapaxes",
        "unfold",
        "real",
        "imag",
        "contiguous",
        "to",
        "type_as",
        "float",
    }
)


def updates_an_input(module: torch.fx.GraphModule) -> bool:
    """Whether the graph of ``module`` (a ``torch.cond`` branch's, whose inputs are the
    operands) may update one of its inputs in place, directly or through a view of it
    or what may be it (``.to()``, ``.contiguous()``), in it or in a ``torch.cond`` it
    holds: by index (``x[0] = v``, which torch 2.5's ``cond`` lets through, the update
    lost under AOTAutograd), through ``.data``, by an in-place method or ``out=``."""
    reaching = {node for node in module.graph.nodes if node.op in ("placeholder", "get_attr")}
    for node in module.graph.nodes:
        first = node.args[0] if node.args else None
        if _is_cond(node):
            if any(updates_an_input(getattr(module, branch.target)) for branch in node.args[1:3]):
                return True
            continue
        if first not in reaching and not any(
            value in reaching for value in node.kwargs.values() if isinstance(value, torch.fx.Node)
        ):
            continue
        name = _name(node)
        if name == "setitem" or "out" in node.kwargs:
            return True
        if name.endswith("_") and not name.startswith("__"):
            return True
        if name in _VIEWS:
            reaching.add(node)
    return False


def _is_cond(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and node.target is torch.ops.higher_order.cond


def _name(node: torch.fx.Node) -> str:
    """The name of what ``node`` calls: a method's, or a function's."""
    target = node.target
    return target if isinstance(target, str) else getattr(target, "__name__", "")


def storages_of(tensors: Iterable[object]) -> set[StorageWeakRef]:
    """The storages of the tensors among ``tensors``."""
    return {
        StorageWeakRef(tensor.untyped_storage())
        for tensor in tensors
        if isinstance(tensor, torch.Tensor)
    }


def example_of(node: object) -> torch.Tensor | None:
    """The fake tensor ``node`` (a graph's) computes, or ``None``."""
    value = node.meta.get("example_value") if isinstance(node, torch.fx.Node) else None
    return value if isinstance(value, torch.Tensor) else None
