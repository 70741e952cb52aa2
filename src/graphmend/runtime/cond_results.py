"""Continuation's results, given back by ``torch.cond`` laid out as the original's.

``torch.cond`` (2.13) gives each output as a new tensor, dense, at storage offset 0:
its fake implementation refuses an output whose strides are not dense in some order
("not a simple accumulative multiplication of sizes"), however the branch made it,
and makes the output with ``empty_strided``.  The original returns views too: at an
offset (``h[1:]``, the second piece of ``h.split(2)``), with gaps (ChatGLM's value
cache, a slice of its fused query-key-value projection), expanded.

A result ``torch.cond`` gives back with its own layout (dense, at offset 0) is
copied.  Any other view is carried out of the branch as its base, the tensor whose
storage it views (dense, at offset 0, filling its storage), and laid out again after
the ``cond`` by ``as_strided`` with the view's sizes, strides and offset: the same
elements with the same values, in a storage of the original's size holding the
base's values.  Both branches must give such a result the same layout, in numbers
(not symbolic); otherwise the branch is not captured and the original ``if`` runs.

Copying such a view itself is wrong under TorchInductor (2.13): ``remove_noop_ops``
drops a ``clone`` whose result has its input's sizes and strides, whatever its
storage offset, so the branch returned the view, and the code after the ``cond``,
which takes an output to be at offset 0, added the offset a second time (the second
piece of ``h.split(2)`` read other elements) or failed the ``cond``'s alignment
assertion (``h[1:]`` of 6 columns: ``storage_offset=6``).  A base is at offset 0.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch.fx import Node

from graphmend.runtime.asking import ask_tracer
from graphmend.runtime.cond_layout import strided_view, unpinned

#: A view's sizes, strides and storage offset: what ``as_strided`` takes.
Layout = tuple[tuple[int, ...], tuple[int, ...], int]

#: How :func:`carried` takes a tensor out of a branch.
_COPY, _BASE, _NEITHER = "copy", "base", "neither"

UNCARRIABLE = (
    "a result is a tensor subclass, a conjugate or negative view, a tensor that requires "
    "grad, or a view torch.cond cannot give back as it is (at a symbolic offset, of "
    "another dtype or of a base that does not fill its storage): torch.cond would give "
    "a dense torch.Tensor at offset 0 that needs no grad"
)


class NotLaidOut(Exception):
    """A result whose layout cannot be given back after the ``cond``."""


def carried(tensor: torch.Tensor) -> torch.Tensor:
    """What a branch returns for ``tensor``, traced: a copy of it, or where ``torch.cond``
    would not give back its layout, a copy of its base.  Raises ``TypeError`` (the
    branch is not captured) for a tensor subclass and a view that cannot be carried."""
    how = _how_traced(tensor)
    if how == _COPY:
        return torch.clone(tensor)
    if how == _BASE:
        return torch.clone(tensor._base)
    raise TypeError(UNCARRIABLE)


def given_back_as_it_is(tensor: Any) -> bool:
    """Whether ``torch.cond`` gives ``tensor`` (traced) back with its own layout: a plain
    tensor, dense, at offset 0 (a copy of it).  A branch that gives any other result
    must carry it (:func:`carried`) or keep its ``if``."""
    return _how_traced(tensor) == _COPY


def rebuilt_from_base(tensor: Any) -> tuple[Layout, Layout] | None:
    """How ``tensor`` (traced), a view, can be handed to ``torch.cond``'s branches as its
    base (dense, at offset 0, filling its storage) and laid out again inside them with
    ``as_strided``: its base's layout and its own (numbers); ``None`` where it cannot,
    and for a view the graph computes.
    What :func:`carried` does with a result, the other way.  The base is made again by
    ``as_strided`` from the view, not read as ``tensor._base``: AOTAutograd gives a
    graph input that is a view no ``_base``.  (TorchDynamo breaks the graph on
    ``storage_offset()``: the fake tensor is asked.)"""
    if type(tensor) is not torch.Tensor:
        return None
    return ask_tracer(_base_layout, None, tensor)


def _base_layout(_tracer: Any, variable: Any) -> tuple[Layout, Layout] | None:
    """Asked while TorchDynamo traces :func:`rebuilt_from_base`: only for a tensor the
    graph is given (an input, a buffer), whose storage is the caller's.  TorchInductor
    may lay out a tensor the graph computes otherwise than eager (a broadcast view
    made dense), so that ``as_strided`` of it read other elements."""
    try:
        given = variable.as_proxy().node.op in ("placeholder", "get_attr")
    except (AttributeError, NotImplementedError):
        return None
    fake = _fake(variable)
    if not given or fake is None or _how(fake) != _BASE:
        return None
    return _layout(fake._base), _layout(fake)


def _how_traced(tensor: Any) -> str | None:
    if type(tensor) is not torch.Tensor:
        return _NEITHER
    return ask_tracer(_how_carried, _NEITHER, tensor)


def _how_carried(_tracer: Any, variable: Any) -> str | None:
    """Asked while TorchDynamo traces :func:`carried`: asks the fake tensor (``None``, on
    a release without these internals: the branch is not captured)."""
    fake = _fake(variable)
    return None if fake is None else _how(fake)


def _fake(variable: Any) -> torch.Tensor | None:
    """The fake tensor TorchDynamo traces for ``variable``; ``None`` where it is not found."""
    try:
        return variable.as_proxy().node.meta["example_value"]
    except (AttributeError, KeyError, TypeError):
        return None


def _how(tensor: torch.Tensor) -> str:
    """Whether ``torch.cond`` gives ``tensor`` back as it is (copy), as a view of its
    base laid out again (base), or not at all: not a conjugate or negative view (its
    copy is no lazy view), nor a tensor that requires grad (the ``cond`` runs where
    autograd does not record, but the branch may record again, ``enable_grad``: its
    output would not require grad)."""
    if _marked(tensor) or tensor.requires_grad:
        return _NEITHER
    if _is_zero(tensor.storage_offset()) and not strided_view(tensor):
        return _COPY
    base = tensor._base
    if base is None or _layout(tensor) is None or not _fills_its_storage(base):
        return _NEITHER
    return _NEITHER if _marked(base) or base.dtype != tensor.dtype else _BASE


def _marked(tensor: torch.Tensor) -> bool:
    """A conjugate or negative view: a copy of it is a plain tensor."""
    return tensor.is_conj() or tensor.is_neg()


def _is_zero(number: int | torch.SymInt) -> bool:
    return type(number) is int and number == 0


def _fills_its_storage(base: torch.Tensor) -> bool:
    """Dense, at offset 0, its elements all of its storage (numbers, not symbolic): a
    copy of it holds each element where the base holds it."""
    layout = _layout(base)
    if layout is None or layout[2] != 0 or strided_view(base):
        return False
    storage = base.untyped_storage().nbytes()
    return type(storage) is int and storage == base.numel() * base.element_size()


def _layout(tensor: torch.Tensor) -> Layout | None:
    """``tensor``'s sizes, strides and offset; ``None`` where one is symbolic."""
    sizes, strides, offset = tuple(tensor.shape), tuple(tensor.stride()), tensor.storage_offset()
    if all(type(n) is int for n in (*sizes, *strides, offset)):
        return sizes, strides, offset
    return None


def gives_tensors(cond: Node) -> bool:
    """Whether each output of ``cond``, just traced, is a tensor (a branch may give a
    number: a size, an int)."""
    return all(isinstance(value, torch.Tensor) for value in cond.meta["example_value"])


def sized_by_branch(cond: Node) -> bool:
    """Whether an output of ``cond``, just traced, has a size or stride that its branches
    give otherwise (``h[:, 1:]`` against ``h``): ``torch.cond`` makes it a new unbacked
    symbol, which TorchInductor (2.13) leaves undefined in the branch's code (a
    ``NameError`` when the compiled function runs)."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    operands = [node.meta.get("example_value") for node in cond.args[-1] if isinstance(node, Node)]
    known = set().union(*(free_unbacked_symbols(value) for value in operands))
    return any(free_unbacked_symbols(value) - known for value in cond.meta["example_value"])


def layouts(output: Any, conds: list[Node]) -> tuple[str, tuple[Layout | None, ...]] | None:
    """The ``cond`` among ``conds`` that gives views' bases (its node's name), with the
    layout :func:`laid_out` gives each of its outputs back (``None``: left as it is);
    ``None`` where no output is laid out again.  Called from a ``comptime`` hook once
    the ``cond`` is traced; raises :class:`NotLaidOut` where the layouts cannot be
    given back."""
    given = [_branch_layouts(output, cond) for cond in conds]
    if all(layout is None for layouts_ in given for layout in layouts_):
        return None
    if len(conds) != 1:
        raise NotLaidOut("more than one torch.cond was traced")
    (cond,) = conds
    (views,) = given
    for view, output_value in zip(views, cond.meta["example_value"], strict=True):
        if view is not None and not _holds_storage(output_value, view[1]):
            raise NotLaidOut("torch.cond does not give a view's base as a copy of its storage")
    return cond.name, tuple(None if view is None else view[0] for view in views)


def _branch_layouts(output: Any, cond: Node) -> list[tuple[Layout, int] | None]:
    """Per output of ``cond``: the layout of the view its branches carry as a base, with
    the number of elements of its storage; ``None`` for a copy.  Raises
    :class:`NotLaidOut` where the branches disagree."""
    per_branch = []
    for branch in cond.args[1:3]:
        graph = output.nn_modules[branch.target].graph
        (results,) = next(node for node in graph.nodes if node.op == "output").args
        operands = dict(zip(graph.find_nodes(op="placeholder"), cond.args[-1], strict=False))
        if any(_copies_a_base_read_outside(node, operands) for node in results):
            raise NotLaidOut(
                "TorchDynamo read a view's base outside the branch (view._base): which "
                "view it carries cannot be told"
            )
        per_branch.append([_carried_view(node) for node in results])
    if per_branch[0] != per_branch[1]:
        raise NotLaidOut("the branches give results laid out otherwise")
    return per_branch[0]


def _copies_a_base_read_outside(node: Any, operands: dict[Node, Any]) -> bool:
    """Whether a branch's output copies an operand of the ``cond`` that is a ``view._base``
    read in the graph around it: TorchDynamo computes there what the branch reads of a
    tensor made before it (``x._base`` of an argument ``x``), so that the branch's
    ``clone(view._base)`` (:func:`carried`) is a copy of an input, told apart from
    nothing, and the view would be given back as its whole base."""
    if not isinstance(node, Node) or node.target not in (torch.clone, torch.Tensor.clone):
        return False
    source = unpinned(operands.get(node.args[0]))
    return isinstance(source, Node) and _reads_base(source)


def _reads_base(node: Node) -> bool:
    return node.target is getattr and node.args[1:] == ("_base",)


def _carried_view(node: Any) -> tuple[Layout, int] | None:
    """For a branch's output ``clone(view._base)``, the view's layout and the number of
    elements of its storage (the base's: it fills it)."""
    base = base_of_view(node)
    if base is None:
        return None
    layout = _layout(base.args[0].meta["example_value"])
    elements = base.meta["example_value"].numel()
    if layout is None or type(elements) is not int:
        raise NotLaidOut("a view's layout is symbolic")
    return layout, elements


def _holds_storage(output: torch.Tensor, elements: int) -> bool:
    """Whether ``torch.cond``'s ``output`` (at offset 0) holds each element of a storage of
    ``elements`` where the storage does: dense, of that many elements.  Its shape may be
    another than the traced base's: the base ``torch.cond`` traces again may be another
    view of the storage (ChatGLM's fused projection, a view of a 2-d ``addmm`` when
    TorchDynamo traced, of 3 dimensions for ``torch.cond``); a dense copy of any tensor
    filling the storage from offset 0 holds its elements in place."""
    return output.numel() == elements and not strided_view(output)


def base_of_view(node: Any) -> Node | None:
    """The ``view._base`` node a branch's output ``clone(view._base)`` copies."""
    if not isinstance(node, Node) or node.target not in (torch.clone, torch.Tensor.clone):
        return None
    source = node.args[0]
    if isinstance(source, Node) and _reads_base(source):
        return source
    return None


def read_bases_directly(output: Any, conds: list[Node]) -> None:
    """In each branch of ``conds``, each ``view._base`` (:func:`carried`) replaced by the
    node that computes the base, where the branch has it: TorchDynamo's fake
    ``_base`` is that node's fake, the same tensor.  Under ``torch.inference_mode`` the
    view the graph makes is an inference tensor, which has no base (TorchDynamo traces
    with inference mode off), and a graph run as traced (``backend="eager"``) failed
    there: ``clone(None)``.  Called once :func:`layouts` has read the branches."""
    for cond in conds:
        for branch in cond.args[1:3]:
            module = output.nn_modules[branch.target]
            if _bases_read_directly(module.graph):
                module.recompile()


def _bases_read_directly(graph: Any) -> bool:
    """Whether any ``view._base`` of ``graph`` was replaced by the node of its base."""
    nodes: dict[int, Node] = {}
    replaced = False
    for node in list(graph.nodes):
        value = node.meta.get("example_value")
        base = nodes.get(id(value)) if _reads_base(node) else None
        if base is not None:
            node.replace_all_uses_with(base)
            graph.erase_node(node)
            replaced = True
        elif isinstance(value, torch.Tensor):
            nodes.setdefault(id(value), node)
    return replaced


def laid_out(merged: Any, layouts_: tuple[str, tuple[Layout | None, ...]]) -> Any:
    """``merged`` (traced) with each tensor the ``cond`` named in ``layouts_`` gives laid
    out again, as :func:`layouts` found."""
    leaves, spec = torch.utils._pytree.tree_flatten(merged)
    for index, leaf in enumerate(leaves):  # no closure: TorchDynamo 2.5 broke on its cell
        if isinstance(leaf, torch.Tensor):
            leaves[index] = _as_laid_out(leaf, layouts_)
    return torch.utils._pytree.tree_unflatten(leaves, spec)


def _as_laid_out(
    tensor: torch.Tensor, layouts_: tuple[str, tuple[Layout | None, ...]]
) -> torch.Tensor:
    index = ask_tracer(_output_index, None, tensor, layouts_)
    layout = None if index is None else layouts_[1][index]
    return tensor if layout is None else tensor.as_strided(*layout)


def _output_index(_tracer: Any, variable: Any, layouts_variable: Any) -> int | None:
    """Asked while TorchDynamo traces :func:`_as_laid_out`: which output of the ``cond``
    named in ``layouts_`` ``tensor`` is, if it is one."""
    try:
        node = variable.as_proxy().node
        name = layouts_variable.as_python_constant()[0]
    except (AttributeError, KeyError, NotImplementedError, TypeError):
        return None
    source = node.args[0] if node.target is operator.getitem else None
    if isinstance(source, Node) and source.name == name:
        return node.args[1]
    return None
