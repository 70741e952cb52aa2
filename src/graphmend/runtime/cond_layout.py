"""The layout of ``torch.cond``'s operands, pinned for TorchInductor.

TorchInductor (2.13) lowers each branch of a ``torch.cond`` as a subgraph that
asserts, when it runs, that its inputs have the strides the traced (fake) operands
had; but ``ir.Conditional.create`` passes the operands through
``ExternKernel.realize_input``, which does not fix their layout (only the outputs
get ``require_exact_strides``).  An operand computed in the graph keeps a flexible
layout, and ``ComputedBuffer.decide_layout`` later lays it out in the order of the
buffers it reads: ``x.transpose(0, 1).contiguous()`` stays transposed, since
``aten.clone``'s lowering leaves the layout to its users, and the branch's
``assert_size_stride`` fails at run time (ChatGLM2/3, whose hidden states are
``[seq, batch, hidden]``).

:func:`pin_operands` edits the traced graph after TorchDynamo has captured the
``cond``: each operand computed in the graph goes through TorchInductor's own
``prims.inductor_force_stride_order`` with the operand's traced strides, whose
lowering fixes the layout (``require_stride_order``; no copy when the buffer is
still flexible).  Elsewhere it is a copy where the strides differ, an alias where
they do not: the values are the operand's, bit for bit.  Graph inputs and constants
have a fixed layout already and are left as they are.  An operand a branch updates
in place cannot go through a copy (the update would be lost), so such a ``cond`` is
:class:`Unpinnable`.

Continuation calls :func:`pin_operands` itself; T1's costly branches call
``torch.cond`` from traced code, between the hooks :func:`remember_graph` and
:func:`pin_traced_conds`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import torch
from torch.fx import Graph, Node

#: Nodes whose value has a fixed layout in TorchInductor: graph inputs, constants.
_FIXED = ("placeholder", "get_attr")


class Unpinnable(Exception):
    """A ``cond`` operand whose layout cannot be pinned without changing the program."""


def tensor_versions(graph: Graph) -> dict[Node, int]:
    """The version counter of each tensor the graph computes so far (bumped by an
    in-place update, traced ones included): taken before the ``cond`` is traced."""
    return {
        node: value._version
        for node in graph.nodes
        if isinstance(value := node.meta.get("example_value"), torch.Tensor)
    }


def pin_operands(graph: Graph, cond: Node, versions: dict[Node, int]) -> int:
    """Put ``inductor_force_stride_order`` before each operand of ``cond`` computed in
    the graph; ``versions``: :func:`tensor_versions` before the ``cond`` was traced.
    Raises :class:`Unpinnable` (the graph untouched) where a branch updates such an
    operand in place.  Returns how many operands were pinned."""
    operands: Sequence[object] = cond.args[-1]
    computed = [operand for operand in operands if _computed_tensor(operand)]
    before = _VersionsBefore(versions)
    for node in computed:
        value = node.meta["example_value"]
        version = before.of(node, value)
        if version is None:
            raise Unpinnable(
                f"{node.name} was computed while the branches were traced, sharing memory "
                "with a tensor made before them: whether a branch updates it in place is "
                "unknown"
            )
        if version != value._version:
            raise Unpinnable(f"a branch updates {node.name} in place")
    force = _force_stride_order()
    pinned: dict[Node, Node] = {}
    with graph.inserting_before(cond):
        for node in computed:
            value = node.meta["example_value"]
            strides = [_stride(graph, node, dim, s) for dim, s in enumerate(value.stride())]
            pinned[node] = graph.call_function(force, (node, strides))
            with value.fake_mode:
                pinned[node].meta["example_value"] = force(value, list(value.stride()))
    replaced = type(operands)(pinned.get(operand, operand) for operand in operands)
    cond.update_arg(len(cond.args) - 1, replaced)
    return len(pinned)


class _VersionsBefore:
    """The version counter of an operand's tensor before the branches were traced.  An
    operand TorchDynamo computed in the graph while it traced them (``x[0]`` of ``for t
    in x``, a returned view's ``_base``) has no entry in :func:`tensor_versions`: it may
    be a tensor made before (``v._base``), a view counts its base's updates, and a
    tensor of new memory started at 0."""

    def __init__(self, versions: dict[Node, int]) -> None:
        self.versions = versions
        self.by_tensor = {id(node.meta["example_value"]): n for node, n in versions.items()}
        self.storages = {_storage(node.meta["example_value"]) for node in versions} - {None}

    def of(self, node: Node, value: torch.Tensor) -> int | None:
        """``None`` where it cannot be told (a tensor sharing memory, and perhaps its
        counter, with one made before: ``detach()`` does, and is no view)."""
        if node in self.versions:
            return self.versions[node]
        for known in (value, value._base if value._is_view() else None):
            if known is not None and id(known) in self.by_tensor:
                return self.by_tensor[id(known)]  # the same tensor, or its base
        storage = _storage(value)
        return 0 if storage is not None and storage not in self.storages else None


def _storage(value: torch.Tensor) -> int | None:
    """The identity of ``value``'s storage; ``None`` for a tensor without one (sparse)."""
    try:
        return value.untyped_storage()._cdata
    except (AttributeError, NotImplementedError, RuntimeError):
        return None


#: The tracer's attribute holding, per ``torch.cond`` traced in user code (T1's
#: costly branches), the graph's nodes and tensor versions before it: a stack, so
#: that a ``cond`` traced while another is being traced pins only its own operands.
_BEFORE = "graphmend_before_cond"


def remember_graph(context: Any) -> None:
    """A ``comptime`` hook before a ``torch.cond`` called from traced code: notes the
    graph's nodes and :func:`tensor_versions` for :func:`pin_traced_conds`."""
    try:
        output = context._i_will_not_complain_if_bc_breaks_InstructionTranslator().output
        snapshot = (set(output.graph.nodes), tensor_versions(output.graph))
        output.__dict__.setdefault(_BEFORE, []).append(snapshot)
    except (AttributeError, TypeError):
        return  # this torch release: the cond's operands keep the layout TorchInductor picks


def pin_traced_conds(context: Any) -> None:
    """A ``comptime`` hook after that ``torch.cond``: :func:`pin_operands` of each
    ``cond`` it added.  One a branch updates in place is left as it is (``torch.cond``
    refuses such branches in any case)."""
    try:
        output = context._i_will_not_complain_if_bc_breaks_InstructionTranslator().output
        nodes, versions = output.__dict__[_BEFORE].pop()
        added = [
            node
            for node in output.graph.nodes
            if node not in nodes and node.target is torch.ops.higher_order.cond
        ]
    except (AttributeError, IndexError, KeyError, TypeError):
        return
    for cond in added:
        with contextlib.suppress(Unpinnable):
            pin_operands(output.graph, cond, versions)


def unpinned(operand: Any) -> Any:
    """The node a ``cond`` operand pinned by :func:`pin_operands` stands for (``operand``
    itself where it is not pinned)."""
    if isinstance(operand, Node) and operand.target is _force_stride_order():
        return operand.args[0]
    return operand


def strided_view(value: Any) -> bool:
    """A tensor with gaps between its elements (a slice) or elements sharing memory:
    not laid out densely in any order.  (Dense, its elements span exactly its size;
    no sorting of strides, which TorchDynamo cannot do when they are symbolic.)"""
    if not isinstance(value, torch.Tensor) or value.is_contiguous():
        return False
    span = 1
    for stride, size in zip(value.stride(), value.shape, strict=True):
        if stride == 0 and size > 1:
            return True
        span += (size - 1) * stride
    return span != value.numel()


def _computed_tensor(operand: object) -> bool:
    return (
        isinstance(operand, Node)
        and operand.op not in _FIXED
        and isinstance(operand.meta.get("example_value"), torch.Tensor)
    )


def _stride(graph: Graph, node: Node, dim: int, stride: int | torch.SymInt) -> object:
    """A stride as an argument of the graph: an int, or a node reading a symbolic one."""
    if isinstance(stride, int):
        return stride
    read = graph.call_function(torch.ops.aten.sym_stride.int, (node, dim))
    read.meta["example_value"] = stride
    return read


def _force_stride_order() -> torch._ops.OpOverload:
    from torch._inductor import inductor_prims  # noqa: F401  (registers the prim)

    return torch.ops.prims.inductor_force_stride_order.default
