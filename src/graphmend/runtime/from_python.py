"""The runtime part of :mod:`graphmend.rewrites.from_python`: an item's truth, from the
Python values its tensor was made of; ``mark_static_address`` made after the graph."""

from __future__ import annotations

from typing import Any

import torch

from graphmend.runtime import deferral
from graphmend.runtime.asking import ask_tracer
from graphmend.runtime.attempts import (
    first_line,
    last_opened_site,
    on_trace_error,
    open_site,
    pinned_around_a_loop,
)
from graphmend.runtime.formatting import known_while_tracing
from graphmend.runtime.tracing import tracing


def item_from_python(tensor: Any, index: Any, made: Any, values: Any) -> Any:
    """``tensor[index]``; while tracing, ``values[index]`` where its truth is the item's
    for certain: ``tensor`` is ``made`` (``torch.tensor(values)``, which the rewrite
    checked nothing can update), one-dimensional, made of ``bool`` constants only (a
    new list or tuple, which nothing else holds), and ``index`` an ``int`` in range that
    TorchDynamo holds as a constant (a symbolic one, ``x.shape[0] - 2``, would be
    pinned by the lookup: a graph for every size, where the original broke).  The
    tensor must also be made in the graph being traced and not used since (updated in
    place, or through ``self.flags.data``): a property or an operator method
    (``self.touch``, ``self + 1``) the rewrite cannot see may update it, as may code
    that ran after a graph break.  Not on the ``meta`` device, whose items have no
    truth.  Only where TorchDynamo runs :func:`mark_static_address` after the graph:
    the original broke the graph before the code that calls it, which TorchDynamo
    refuses to trace."""
    if (
        tracing()
        and deferral.reordering()
        and _known(tensor, index, made, values)
        and open_site("from_python") is None
    ):
        ask_tracer(_keep_break_if_tracing_fails, None)
        return values[index]
    return tensor[index]


def _keep_break_if_tracing_fails(tracer: Any) -> None:
    """Asked while TorchDynamo traces :func:`item_from_python`, the item decided: where
    tracing what follows fails (in the function, or in a caller's loop, which plain
    compile ran as Python after the break: ``torch._dynamo.mark_dynamic``, refused while
    tracing), restart the analysis with the site's break kept.  Not where the frame must
    be one graph: there the break would fail the compile all the same."""
    site = last_opened_site(tracer.output)
    if site is not None and not site.one_graph:
        on_trace_error(
            tracer.output,
            lambda error: site.keep_break(
                f"the code after it cannot be traced ({first_line(error)}), where the "
                "original broke the graph before it"
            ),
        )


def _known(tensor: Any, index: Any, made: Any, values: Any) -> bool:
    return (
        tensor is made
        and type(made) is torch.Tensor
        and made.dim() == 1
        and made.device.type != "meta"
        and ask_tracer(_made_here_untouched, False, made)
        and type(values) in (list, tuple)
        and len(values) == made.shape[0]
        and ask_tracer(_constant_bools, False, values)
        and type(index) is int
        and known_while_tracing(index)
        and -len(values) <= index < len(values)
        and ask_tracer(_no_size_pinned_around_a_loop, False)
    )


def _constant_bools(_tracer: Any, values: Any) -> bool:
    """Asked while TorchDynamo traces :func:`_known`: whether ``values`` holds ``bool``
    constants only.  Not symbolic booleans (``j < k`` of an int made dynamic): asking a
    ``SymBool``'s type in traced code guards on its value, a graph for every value where
    the original keeps one."""
    try:
        return all(
            item.is_python_constant() and type(item.as_python_constant()) is bool
            for item in values.items
        )
    except (AttributeError, NotImplementedError):
        return False


def _no_size_pinned_around_a_loop(tracer: Any) -> bool:
    """Asked while TorchDynamo traces :func:`_known`: whether, in a loop of the frame
    being compiled, no guard of the trace so far holds for one value of a symbolic size
    (:func:`attempts.pinned_around_a_loop`).  ``for i in range(x.shape[0])`` pins the
    size (TorchDynamo runs a loop over a range of known length) and gives the index:
    plain compile, whose break in the loop gives the frame up, keeps no such guard, and
    with the test decided the frame would compile again for every size."""
    return pinned_around_a_loop(tracer) is None


def _made_here_untouched(_tracer: Any, made: Any) -> bool:
    """Asked while TorchDynamo traces :func:`_known`: whether ``made`` is the result of an
    operation of the graph being traced (not one of its inputs, made before a break)
    that no operation has used since.  Its fake tensor's version would not do alone:
    ``made.data`` counts its in-place updates (``made.data[0] = False``) in a version
    of its own, and TorchDynamo 2.5 does not run ``made[0] = False`` on the fake tensor."""
    try:
        node = made.as_proxy().node
    except (AttributeError, NotImplementedError):
        return False
    fake = node.meta.get("example_value")
    return (
        node.op == "call_function"
        and isinstance(fake, torch.Tensor)
        and fake._version == 0
        and not node.users
    )


def mark_static_address(tensor: Any) -> None:
    """``torch._dynamo.mark_static_address(tensor)``; while TorchDynamo traces, made after
    the graph, on the tensor the graph gives (tracing it fails).  Of anything but a
    tensor it raises, which after the graph would be after what the graph did (an update
    of the caller's tensor): there the graph breaks, as the original's did before it (in
    a loop TorchDynamo runs the frame as written)."""
    if not isinstance(tensor, torch.Tensor):
        torch._dynamo.graph_break()
    _mark_after_the_graph(tensor)


@deferral.deferred("torch._dynamo.mark_static_address")
def _mark_after_the_graph(tensor: Any) -> None:
    """``torch._dynamo.mark_static_address(tensor)``, run after the graph."""
    torch._dynamo.mark_static_address(tensor)
