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

import importlib
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

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
from graphmend.runtime.in_place import updates_an_input
from graphmend.runtime.outer_state import OuterState
from graphmend.runtime.subgraphs import making_a_cond
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
            "is a strided view (torch.cond needs dense inputs)",
        )
        return None
    then_passed = tuple(_passed(v) for v in then_arguments)
    else_passed = tuple(_passed(v) for v in else_arguments)
    if any(isinstance(v, _NotPassed) for v in (*then_passed, *else_passed)):
        declined("continuation", _NOT_PASSED_REASON)
        return None
    predicate = truth(condition)

    def then_branch() -> tuple[Any]:
        return _fresh(then_function(*tuple(_received(v) for v in then_passed)))

    def else_branch() -> tuple[Any]:
        return _fresh(else_function(*tuple(_received(v) for v in else_passed)))

    captured = ask_tracer(_capture, None, predicate, then_branch, else_branch)
    if captured is None:
        return None
    merged, layouts = captured  # layouts: how each tensor is given back (cond_results)
    return merged if layouts is None else cond_results.laid_out(merged, layouts)


class _View(NamedTuple):
    """A strided view handed to the branches as its base, laid out again inside them."""

    base: torch.Tensor
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int


class _NotPassed:
    """The type of :data:`_NOT_PASSED`: asked by ``isinstance``, which TorchDynamo 2.5
    traces for a symbolic number, where ``is`` breaks the graph."""


#: What :func:`_passed` gives for a strided view the branches cannot be handed.
_NOT_PASSED = _NotPassed()

_NOT_PASSED_REASON = (
    "an argument is a strided view whose base torch.cond cannot be given (one the graph "
    "computes, a tensor subclass, a conjugate or negative view, one that requires grad, "
    "a symbolic layout, or a base that does not fill its storage)"
)


def _passed(value: Any) -> Any:
    """What ``torch.cond``'s branches are given for ``value``: a strided view (a slice
    with gaps, an expanded tensor) as its base and layout (:class:`_View`), since
    TorchInductor's ``cond`` takes dense operands and a dense copy would read
    otherwise (``x._base``, ``x.is_contiguous()``, results laid out otherwise, in the
    rest or in any function it calls); anything else as it is, a transposed tensor
    included.  :data:`_NOT_PASSED` where the view cannot be rebuilt from its base."""
    if not cond_layout.strided_view(value):
        return value
    layouts = cond_results.rebuilt_from_base(value)
    if layouts is None:
        return _NOT_PASSED
    (base_size, base_stride, _), layout = layouts
    return _View(value.as_strided(base_size, base_stride, 0), *layout)


def _received(value: Any) -> Any:
    """What a branch sees for what :func:`_passed` gave: the view laid out again."""
    if isinstance(value, _View):
        return value.base.as_strided(value.size, value.stride, value.offset)
    return value


def _fresh(result: tuple[Any]) -> tuple[Any]:
    """``result`` with each tensor a new copy: ``torch.cond``'s outputs may not alias its
    inputs, and are dense, at offset 0.  A dense tensor keeps its strides (a transposed
    result stays transposed, as the original returns it); the branches' must then
    agree, or ``torch.cond`` refuses them and the original ``if`` runs.  A view
    ``torch.cond`` would give back otherwise is carried as its base, and laid out again
    after it (:mod:`graphmend.runtime.cond_results`)."""
    return torch.utils._pytree.tree_map_only(torch.Tensor, cond_results.carried, result)


def _capture(tracer: Any, predicate: Any, then_branch: Any, else_branch: Any) -> Any:
    """Asked while TorchDynamo traces :func:`continuation`: ``torch.cond`` through
    TorchDynamo's own handler, its operands' layout pinned for TorchInductor
    (:mod:`graphmend.runtime.cond_layout`); the variable of its result."""
    try:
        handler = _cond_handler()
        arguments = [predicate, then_branch, else_branch, _empty_tuple()]
        attempt = Attempt(tracer)
        site = opened_site(tracer) or Site(tracer)
        versions = cond_layout.tensor_versions(attempt.graph)  # before the branches run
    except (AttributeError, ImportError, KeyError, NotImplementedError, TypeError) as error:
        record_at(tracer, "continuation", f"this torch release is not supported ({error})")
        return None
    kept = site.kept_break()
    if kept is not None:
        record_at(tracer, "continuation", kept)
        return None
    try:
        with OuterState() as outer, making_a_cond(tracer.output):
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
    if attempt.changed_grad_mode():
        site.abandon(tracer, "continuation", attempt, _GRAD_MODE)
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
        if any(cond_results.sized_by_branch(cond) for cond in conds):
            return _SIZED_BY_BRANCH, None
        if any(_updates_an_operand(tracer.output, cond) for cond in conds):
            return _UPDATES_AN_OPERAND, None
        returned = [t for cond in conds for t in aliasing.returned_operands(tracer.output, cond)]
        if any(aliasing.results_share_memory(tracer.output, cond) for cond in conds):
            return _SHARED, None
        for cond in conds:
            cond_layout.pin_operands(tracer.output.graph, cond, versions)
            if _TRACES_BRANCHES_AT_EACH_CALL:
                _detach_operands(tracer.output.graph, cond)
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

_SIZED_BY_BRANCH = (
    "the branches give results of different sizes: TorchInductor (2.13) fails to run a "
    "torch.cond whose outputs' sizes depend on the branch taken"
)

_UPDATES_AN_OPERAND = (
    "a branch updates in place what it is given (by index, through .data, an in-place "
    "method), which torch 2.5's torch.cond lets through and AOTAutograd then loses"
)

_GRAD_MODE = (
    "a branch leaves autograd's grad mode changed (set_grad_enabled): TorchDynamo traces "
    "the other branch, and compiles what follows, in the mode it left"
)
_SHARED = (
    "two of its results share memory (one tensor twice, or a view of another): "
    "torch.cond returns a copy of each"
)


def _updates_an_operand(output: Any, cond: Any) -> bool:
    """Whether a branch of ``cond``, just traced, may update an operand in place."""
    return any(updates_an_input(output.nn_modules[branch.target]) for branch in cond.args[1:3])


#: Whether this torch's ``torch.cond`` traces both branches again at each call when an
#: operand requires grad, even with grad disabled (torch 2.5's ``cond_autograd`` builds
#: their forward and backward graphs first, on the real tensors): the branch not taken
#: runs too, drawing random numbers (dropout) the original never draws.
_TRACES_BRANCHES_AT_EACH_CALL = hasattr(
    importlib.import_module("torch._higher_order_ops.cond"), "create_fw_bw_graph_branches"
)


def _detach_operands(graph: Any, cond: Any) -> None:
    """Hand ``cond`` its operands that require grad (a module's parameters the branches
    read) detached: it is captured only where grad is disabled, where nothing else
    changes."""
    operands = cond.args[-1]
    detached = {}
    with graph.inserting_before(cond):
        for operand in operands:
            value = getattr(operand, "meta", {}).get("example_value")
            if isinstance(value, torch.Tensor) and value.requires_grad:
                detached[operand] = graph.call_method("detach", (operand,))
                with value.fake_mode:
                    detached[operand].meta["example_value"] = value.detach()
    cond.update_arg(len(cond.args) - 1, type(operands)(detached.get(v, v) for v in operands))


def _changed_outside(change: str) -> str:
    """Why a branch changing what was made before the site keeps the break."""
    return (
        f"a branch {change}, which TorchDynamo does not put back for the other branch "
        "or keeps only in part (runtime/outer_state.py)"
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
