"""Runtime side of continuation predication: the rest of a function, under ``torch.cond``.

Where an ``if``'s branches cannot be merged value by value (``None`` against a
tensor, different shapes), the rewrite folds the rest of the enclosing function
into both branches (:mod:`graphmend.rewrites.continuation`), and
:func:`continuation` merges the function's *results* with ``torch.cond``: only the
taken branch runs, made of the original statements.

``torch.cond`` cannot be tried and abandoned from traced code: when TorchDynamo
cannot capture a branch (an attribute stored, output, a data-dependent ``if``
inside) it stops the whole compilation.  So the call is made from a ``comptime``
hook, in Python while tracing, through the same TorchDynamo handler
``torch.cond`` gets; if it raises, nothing was added to the graph, the reason is
recorded, and the original ``if`` runs with its graph break.  When it succeeds,
its result is handed back to the traced code.  The hook reaches TorchDynamo's
handler for ``cond`` and the traced values' variables, which are not public API:
they are used on the torch releases this is tested with (2.5 and 2.13) and
looked up defensively, so that on another release the site keeps its break.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from graphmend.runtime import aliasing, cond_layout, cond_results
from graphmend.runtime.asking import ask_tracer
from graphmend.runtime.attempts import (
    Attempt,
    Site,
    first_line,
    open_site,
    opened_site,
    tracer_control,
)
from graphmend.runtime.conditions import is_scalar_tensor, truth, without_data
from graphmend.runtime.fallbacks import declined, record_at
from graphmend.runtime.outer_state import OuterState
from graphmend.runtime.tracing import tracing


def continuation(
    condition: Any,
    then_function: Callable[..., tuple[Any]],
    then_arguments: Sequence[Any],
    else_function: Callable[..., tuple[Any]],
    else_arguments: Sequence[Any],
    layout_matters: bool,
) -> tuple[Any] | None:
    """``(result,)`` of the function, from the branch ``condition`` takes, under
    ``torch.cond``; ``None`` to run the original code.  Each function runs one
    branch and the rest of the enclosing function, and returns ``(its result,)``;
    ``layout_matters``: their code may update a tensor in place or read its layout
    (strides, contiguity), which a dense copy of an argument would change."""
    if not tracing() or not is_scalar_tensor(condition):
        return None
    if without_data(condition):
        return None
    if torch.is_grad_enabled():
        declined("continuation", "autograd records: torch.cond is used only in inference")
        return None
    if open_site("continuation") is not None:
        return None
    sparse = any(cond_layout.strided_view(v) for v in (*then_arguments, *else_arguments))
    if sparse and layout_matters:
        declined(
            "continuation",
            "a branch may update a tensor in place or read its strides, and an argument "
            "is a strided view (torch.cond needs dense inputs, a copy would differ)",
        )
        return None
    then_arguments = tuple(_dense(v) for v in then_arguments)
    else_arguments = tuple(_dense(v) for v in else_arguments)
    predicate = truth(condition)

    def then_branch() -> tuple[Any]:
        return _fresh(then_function(*then_arguments))

    def else_branch() -> tuple[Any]:
        return _fresh(else_function(*else_arguments))

    captured = ask_tracer(_capture, None, predicate, then_branch, else_branch, sparse)
    if captured is None:
        return None
    merged, layouts = captured  # layouts: how each tensor is given back (cond_results)
    return merged if layouts is None else cond_results.laid_out(merged, layouts)


def _dense(value: Any) -> Any:
    """A dense copy of a tensor that is a strided view (TorchInductor's ``cond`` assumes
    dense inputs); anything else as it is, a transposed tensor included (its results
    keep the layout they have in the original; a copy of a dense tensor would alias)."""
    if cond_layout.strided_view(value):
        return value.clone(memory_format=torch.contiguous_format)
    return value


def _fresh(result: tuple[Any]) -> tuple[Any]:
    """``result`` with each tensor a new copy: ``torch.cond``'s outputs may not alias its
    inputs, and are dense, at offset 0.  A dense tensor keeps its strides (a transposed
    result stays transposed, as the original returns it); the branches' must then
    agree, or ``torch.cond`` refuses them and the original ``if`` runs.  A view
    ``torch.cond`` would give back otherwise is carried as its base, and laid out again
    after it (:mod:`graphmend.runtime.cond_results`)."""
    return torch.utils._pytree.tree_map_only(torch.Tensor, cond_results.carried, result)


def _capture(
    tracer: Any, predicate: Any, then_branch: Any, else_branch: Any, sparse_variable: Any
) -> Any:
    """Asked while TorchDynamo traces :func:`continuation`: ``torch.cond`` through
    TorchDynamo's own handler, its operands' layout pinned for TorchInductor
    (:mod:`graphmend.runtime.cond_layout`); the variable of its result."""
    try:
        handler = _cond_handler()
        arguments = [predicate, then_branch, else_branch, _empty_tuple()]
        attempt = Attempt(tracer)
        site = opened_site(tracer) or Site(tracer)
        versions = cond_layout.tensor_versions(attempt.graph)  # before the branches run
        sparse = sparse_variable.as_python_constant()
    except (AttributeError, ImportError, KeyError, NotImplementedError, TypeError) as error:
        record_at(tracer, "continuation", f"this torch release is not supported ({error})")
        return None
    kept = site.kept_break()
    if kept is not None:
        record_at(tracer, "continuation", kept)
        return None
    if sparse and not site.one_graph:
        site.abandon(tracer, "continuation", attempt, _COPIED_VIEW)
        return None
    try:
        with OuterState() as outer:
            result = handler.call_function(tracer, arguments, {})
    except tracer_control():
        raise
    except Exception as error:  # anything else: cond cannot capture the branches
        reason = f"torch.cond cannot capture it: {first_line(error)}"
        site.abandon(tracer, "continuation", attempt, reason)
        return None
    if outer.changed is not None:
        site.abandon(tracer, "continuation", attempt, _changed_outside(outer.changed))
        return None
    site.keep_sizes_dynamic(attempt)
    site.keep_numbers_unpinned(attempt)
    conds = attempt.added(torch.ops.higher_order.cond)
    reason, layouts = _given_back(tracer, site, result, conds, versions)
    if reason is not None:
        site.abandon(tracer, "continuation", attempt, reason)
        return None
    return _pair(result, layouts)


def _given_back(
    tracer: Any, site: Site, result: Any, conds: list[Any], versions: Any
) -> tuple[str | None, Any]:
    """Why the captured ``cond`` cannot stand for the original (``None``: it can), and how
    its tensors are given back (:func:`cond_results.layouts`); pins its operands."""
    try:
        if not all(cond_results.gives_tensors(cond) for cond in conds):
            return _NUMBER, None
        returned = [t for cond in conds for t in aliasing.returned_operands(tracer.output, cond)]
        if any(aliasing.results_share_memory(tracer.output, cond) for cond in conds):
            return _SHARED, None
        for cond in conds:
            cond_layout.pin_operands(tracer.output.graph, cond, versions)
        if returned and not aliasing.record(tracer, site, aliasing.fakes(result), returned):
            return "this torch release cannot check how its results alias", None
        layouts = cond_results.layouts(tracer.output, conds)
        cond_results.read_bases_directly(tracer.output, conds)
        return None, layouts
    except (AttributeError, KeyError, NotImplementedError) as error:
        return f"this torch release is not supported ({error})", None
    except cond_layout.Unpinnable as error:
        return f"its operands' layout cannot be pinned for TorchInductor: {error}", None
    except cond_results.NotLaidOut as error:
        return f"a result cannot be given back laid out as the original's: {error}", None


_NUMBER = (
    "a result is a number (a size of a tensor, an int): TorchInductor (2.13) fails to "
    "lower a torch.cond that gives one back"
)

_SHARED = (
    "two of its results share memory (one tensor twice, or a view of another): "
    "torch.cond returns a copy of each"
)


def _changed_outside(change: str) -> str:
    """Why a branch changing what was made before the site keeps the break."""
    return (
        f"a branch {change}, which TorchDynamo does not put back for the other branch "
        "or keeps only in part (runtime/outer_state.py)"
    )


#: Why a strided view among the arguments keeps the break (but under ``fullgraph=True``,
#: where a break fails the call): the branches see its dense copy, and a result computed
#: from it may be laid out otherwise than the original's (``x.t() * 2`` of an expanded
#: ``x`` is contiguous, of its copy transposed), so that a caller's ``.view`` fails.
_COPIED_VIEW = (
    "an argument is a strided view: the branches would see a dense copy, and their "
    "results could be laid out otherwise than the original's"
)


def _cond_handler() -> Any:
    from torch._dynamo.variables.higher_order_ops import TorchHigherOrderOperatorVariable

    return TorchHigherOrderOperatorVariable.make(torch.ops.higher_order.cond)


def _pair(result: Any, layouts: Any) -> Any:
    """The variable of ``(result, layouts)``: the ``cond``'s result and how its tensors
    are given back (a constant)."""
    from torch._dynamo.variables import ConstantVariable, TupleVariable

    return TupleVariable([result, ConstantVariable.create(layouts)])


def _empty_tuple() -> Any:
    from torch._dynamo.variables import TupleVariable

    return TupleVariable([])
