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
"""

from __future__ import annotations

from collections.abc import Sequence

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
    for node in computed:
        if versions.get(node) != node.meta["example_value"]._version:
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
