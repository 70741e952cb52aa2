"""Runtime side of T1: merge both branches of a data-dependent ``if`` while tracing.

Rewritten code hands :func:`branch` its condition and one generated function
per branch (with the values each reads).  When the condition is a
one-element tensor and the branches' results can be merged exactly, it
returns the merged results; otherwise ``None``, and the original ``if`` runs.

The rule between ``torch.where`` and ``torch.cond``:

* ``torch.where`` (both branches run, results selected element-exactly) when
  the branches are cheap (element-wise work, reductions, shape changes);
* ``torch.cond`` (only the taken branch runs) when a branch calls a submodule
  or a matrix product, where running both would cost real time.  Its outputs
  are copies, since ``torch.cond`` refuses outputs that alias its inputs.

While gradients are recorded and a result requires grad, nothing is merged and
the original ``if`` runs: a merged result would carry gradient edges into the
untaken branch (``requires_grad`` set where the original had none, zero
gradients where it had ``None``, and ``0 * inf = NaN`` through an operation
with an infinite derivative there).

Either way the results must be tensors of equal shape, dtype, device, layout, type
and ``requires_grad`` (``torch.where`` would otherwise broadcast or promote, takes
one operand's strides and subclass, and under ``no_grad`` makes a parameter a plain
tensor) or identical Python values, position by position.  Submodules must be
of a type whose call is pure (``nn.Linear``, norms, activations,
``nn.Sequential`` of those, dropout only in eval mode) and carry no hooks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.autograd import forward_ad

from graphmend.runtime import cond_layout, subgraphs
from graphmend.runtime.aliasing import lazy_views, stored_alias, watch
from graphmend.runtime.asking import ask_tracer
from graphmend.runtime.attempts import call_or_none, open_site
from graphmend.runtime.cond_results import given_back_as_it_is
from graphmend.runtime.conditions import is_scalar_tensor, truth, without_data
from graphmend.runtime.fallbacks import declined
from graphmend.runtime.formatting import IMMUTABLE_TYPES
from graphmend.runtime.tracing import tracing

_PURE_MODULES: tuple[type[nn.Module], ...] = tuple(
    module
    for module in (
        nn.Identity,
        nn.Linear,
        nn.Bilinear,
        nn.LayerNorm,
        nn.GroupNorm,
        getattr(nn, "RMSNorm", None),
        nn.Conv1d,
        nn.Conv2d,
        nn.Conv3d,
        nn.Flatten,
        nn.Unflatten,
        nn.Dropout,
        nn.Dropout1d,
        nn.Dropout2d,
        nn.Dropout3d,
        nn.AlphaDropout,
        nn.BatchNorm1d,
        nn.BatchNorm2d,
        nn.BatchNorm3d,
    )
    if module is not None
)
#: Modules that, in training mode, draw random numbers or update their statistics.
_TRAINING_CHANGES_STATE = (
    nn.modules.dropout._DropoutNd,
    nn.modules.batchnorm._BatchNorm,
    nn.RReLU,
)
_PURE_MODULE_PACKAGES = ("torch.nn.modules.activation", "transformers.activations")


def why_impure(module: Any) -> str | None:
    """Why calling ``module`` may do more than compute; ``None`` when it only computes
    (checked while tracing, so it is static).

    The exact class is checked, not a subclass (whose ``forward`` may do
    anything), and no hook, the module's own or a global one, may be set.
    """
    if not isinstance(module, nn.Module):
        # no type name: TorchDynamo 2.5 cannot read a method's type's name while tracing
        return "it is not a torch.nn.Module"
    if _global_hooks():
        return "a global module hook is set"
    if module._forward_hooks or module._forward_pre_hooks:
        return "it has forward hooks"
    if type(module) is nn.Sequential:
        for child in module:
            reason = why_impure(child)
            if reason is not None:
                return reason
        return None
    if type(module) is nn.MultiheadAttention or not (
        type(module) in _PURE_MODULES or type(module).__module__ in _PURE_MODULE_PACKAGES
    ):
        return f"its type {type(module).__qualname__} is not known to be pure"
    return None


def why_training(module: Any) -> str | None:
    """Why calling ``module``, pure by :func:`why_impure`, changes state in its mode (a
    dropout, RReLU or batch norm in training mode, or one in an ``nn.Sequential``);
    ``None`` when it does not."""
    if isinstance(module, _TRAINING_CHANGES_STATE) and module.training:
        return (
            "it is in training mode (dropout and RReLU draw random numbers, batch norm "
            "updates its statistics)"
        )
    if type(module) is nn.Sequential:
        return next(filter(None, map(why_training, module)), None)
    return None


def _global_hooks() -> bool:
    hooks = nn.modules.module  # 2.5 and 2.6 have no _has_any_global_hook()
    return bool(
        hooks._global_backward_pre_hooks
        or hooks._global_backward_hooks
        or hooks._global_forward_pre_hooks
        or hooks._global_forward_hooks
    )


def branch(
    condition: Any,
    then_function: Callable[..., tuple[Any, ...]],
    then_arguments: Sequence[Any],
    else_function: Callable[..., tuple[Any, ...]],
    else_arguments: Sequence[Any],
    modules: Sequence[Any],
    expensive: bool,
    in_place: Sequence[Any] = (),
    kept: Sequence[Any] | None = None,
) -> tuple[Any, ...] | None:
    """The branches' results merged under ``condition``, or ``None`` to run the original.

    The last ``len(in_place)`` results are new values for the tensors the
    branches store into by index: they are written into those tensors in
    place, and not returned.  ``kept``: the function's locals that may be read
    after the site, but those it binds to the results (``None``: unknown, all), for
    the aliasing check (:func:`graphmend.runtime.aliasing.watch`).  A branch gives
    ``None`` when an ``if`` nested in it cannot be merged, or when it cannot be traced.
    """
    if not tracing() or not is_scalar_tensor(condition):
        return None
    if without_data(condition):
        return None
    for target in in_place:
        reason = _why_not_writable(target)
        if reason is not None:
            declined("predicate", f"a tensor stored into by index {reason}")
            return None
    if in_place and stored_alias(in_place, then_arguments, else_arguments):
        declined(
            "predicate",
            "a tensor stored into by index shares memory with another the branches read",
        )
        return None
    for module in modules:
        reason = why_impure(module)
        if reason is not None:
            declined("predicate", f"a branch calls a submodule: {reason}")
            return None
    if open_site("predicate") is not None:
        return None
    for module in modules:
        # Asked after the site is opened, so that a decline takes back the guard that
        # reading the mode makes: kept in the frame before the break, where the
        # original's frame does not read the mode, it compiled that frame again at each
        # model.train() or eval().  A module's class and hooks, which do not change that
        # way, are checked before the opening, where a decline costs no new trace.
        reason = why_training(module)
        if reason is not None:
            declined("predicate", f"a branch calls a submodule: {reason}")
            return None
    if expensive and any(type(v) is float for v in (*then_arguments, *else_arguments)):
        # torch.cond cannot take a branch that reads a float TorchDynamo made symbolic
        # (a float argument that changed between calls); under tracing a float's type
        # does not say whether it is, so a branch reading one keeps the original if.
        # Asked after the site is opened: the guard asking installs is taken back.
        declined("predicate", "a branch that calls a submodule reads a Python float")
        return None
    if expensive and _reads_a_strided_view((*then_arguments, *else_arguments)):
        declined(
            "predicate",
            "a branch that calls a submodule reads a strided view (torch.cond needs "
            "dense operands, and TorchInductor would lay out a copy otherwise)",
        )
        return None
    predicate = truth(condition)
    # Both branches are traced, and the untaken one may fail where it is traced (a
    # reshape to a size its tensor does not have): that runs the original if.
    then_values = call_or_none("predicate", then_function, then_arguments)
    else_values = (
        None if then_values is None else call_or_none("predicate", else_function, else_arguments)
    )
    if then_values is None or else_values is None:
        declined(
            "predicate", "a branch runs its original code (an if inside it, or a failed trace)"
        )
        return None
    plan = _merge_plan(then_values, else_values)
    if plan is None:
        _decline_merge(then_values, else_values)
        return None
    if lazy_views(_selected_pairs(plan, then_values, else_values)):
        declined("predicate", "a branch gives a conjugate or negative view, a merge would not")
        return None
    if _records_gradients(then_values + else_values):
        declined("predicate", "autograd records and a result requires grad")
        return None
    if expensive and not all(
        map(given_back_as_it_is, _selected_pairs(plan, then_values, else_values))
    ):
        # TorchInductor drops a clone of a view at an offset (cond_results): the code
        # after the cond would read the view's elements at the offset twice
        declined(
            "predicate",
            "a branch that calls a submodule gives a view at an offset, or with gaps, "
            "which torch.cond would give back dense at offset 0",
        )
        return None
    if expensive:
        merged = _with_cond(
            predicate,
            plan,
            then_values,
            (then_function, then_arguments),
            (else_function, else_arguments),
        )
    else:
        merged = tuple(
            torch.where(predicate, left, right) if is_tensor else left  # else: one value
            for left, right, is_tensor in zip(then_values, else_values, plan, strict=True)
        )
    if merged is None:
        return None
    for value, taken in zip(merged, then_values, strict=True):
        if isinstance(value, torch.Tensor) and not _same_layout(value, taken):
            # a merged slice is dense: its strides differ from the branch's own
            declined("predicate", "{0} would be laid out unlike the branch's {1}", value, taken)
            return None
        if isinstance(value, torch.Tensor) and not _same_kind(value, taken):
            # under no_grad, torch.where of a parameter is a tensor that needs no grad
            declined(
                "predicate",
                "{0} would be another kind of tensor than the branch's {1}",
                value,
                taken,
            )
            return None
    count = len(merged) - len(in_place)
    for target, update in zip(in_place, merged[count:], strict=True):
        if not (isinstance(target, torch.Tensor) and _same_metadata(target, update)):
            declined("predicate", "{0} cannot be written into {1}", update, target)
            return None
    selected = [position for position, is_tensor in enumerate(plan[:count]) if is_tensor]
    if not watch(
        tuple(merged[i] for i in selected),
        tuple(v for i in selected for v in (then_values[i], else_values[i])),
        kept,
    ):
        declined("predicate", "this torch release cannot check the merge's aliasing")
        return None
    for target, update in zip(in_place, merged[count:], strict=True):
        target.copy_(update)
    return merged[:count]


def assign_item(tensor: Any, index: Any, value: Any) -> Any:
    """``tensor[index] = value`` on a copy; ``None`` when the index could gather out of range."""
    if not isinstance(tensor, torch.Tensor) or not _selects_only(index):
        return None
    updated = tensor.clone()
    updated[index] = value
    return updated


def _selects_only(index: Any) -> bool:
    """Booleans masks, integers, slices, ``None`` and ``...``: nothing can be out of range
    except what the shapes already decide while tracing."""
    if isinstance(index, tuple):
        return all(_selects_only(part) for part in index)
    if isinstance(index, torch.Tensor):
        return index.dtype == torch.bool
    return index is None or index is Ellipsis or isinstance(index, (int, slice))


def _why_not_writable(target: Any) -> str | None:
    """Why writing ``target`` whichever branch is taken could fail, or be seen, where the
    original writes only in one branch; ``None`` when it cannot."""
    if not isinstance(target, torch.Tensor):
        return None  # not merged: checked with the results
    if torch.is_grad_enabled():
        return "would be written under autograd: a new version of a tensor a backward may need"
    if any(
        stride == 0 and size > 1 for stride, size in zip(target.stride(), target.shape, strict=True)
    ):
        return "has elements that share memory"
    return None


def _selected_pairs(
    plan: list[bool], then_values: tuple[Any, ...], else_values: tuple[Any, ...]
) -> tuple[Any, ...]:
    """The branches' tensors that the plan selects between, both of each pair."""
    return tuple(
        value
        for left, right, is_tensor in zip(then_values, else_values, plan, strict=True)
        if is_tensor
        for value in (left, right)
    )


def _records_gradients(values: tuple[Any, ...]) -> bool:
    """Whether autograd records the branches: backward, where a result requires grad, or
    forward AD, whose dual tensors do not say so (``torch.where`` gives a result a zero
    tangent where the original's has none)."""
    if forward_ad._current_level >= 0:
        return True
    return torch.is_grad_enabled() and any(
        isinstance(value, torch.Tensor) and value.requires_grad for value in values
    )


def _same_metadata(left: torch.Tensor, right: Any) -> bool:
    return (
        isinstance(right, torch.Tensor)
        and known_equal(left.shape, right.shape)
        and left.dtype == right.dtype
        and left.device == right.device
    )


def known_equal(left: Any, right: Any) -> bool:
    """``left == right`` for numbers or sequences of them (sizes, strides; a float equals
    another of its sign only), true only where it holds without a guard.

    Comparing symbolic sizes or floats in traced code guards on the outcome: equal sizes
    (``x[:2]`` and ``x[1:]`` of 3 rows) pin the frame to the sizes where they are equal,
    different ones to those where they differ, and a size captured from data
    (``nonzero``) is a graph break inside GraphMend's runtime.  The original compares
    nothing of the kind, so the frame would compile again where the original's does not.
    TorchDynamo's knowledge decides instead (:func:`_decide_equal`); outside TorchDynamo
    (non-strict export runs the code in Python) Python's ``==`` does."""
    equal = ask_tracer(_decide_equal, None, left, right)
    if equal is None:
        return _equal_numbers(left, right)
    return equal


def _decide_equal(_tracer: Any, left: Any, right: Any) -> bool | None:
    """Asked while TorchDynamo traces :func:`known_equal`: equal where TorchDynamo knows it
    for every value of the symbols, not equal where it does not (or where the values are
    not numbers)."""
    try:
        from torch.fx.experimental.symbolic_shapes import statically_known_true
    except ImportError:
        return None
    try:
        numbers = [_numbers(variable) for variable in (left, right)]
        return _equal_numbers(*numbers, lambda a, b: bool(statically_known_true(a == b)))
    except Exception:  # anything else is no proof of equality
        return False


def _numbers(variable: Any) -> Any:
    """The number (a ``SymInt`` or ``SymFloat`` where symbolic), or list of numbers, that
    a TorchDynamo variable stands for; raises for anything else."""
    from torch._dynamo.variables import SymNodeVariable
    from torch._dynamo.variables.lists import BaseListVariable

    if isinstance(variable, SymNodeVariable):
        return variable.sym_num
    if isinstance(variable, BaseListVariable):
        return [_numbers(item) for item in variable.items]
    return _constant_numbers(variable.as_python_constant())


def _constant_numbers(value: Any) -> Any:
    if isinstance(value, (tuple, list)):
        return [_constant_numbers(item) for item in value]
    if type(value) not in (int, float, bool):
        raise NotImplementedError(f"not a number: {type(value).__name__}")
    return value


def _equal_numbers(
    left: Any, right: Any, equal: Callable[[Any, Any], bool] = lambda a, b: bool(a == b)
) -> bool:
    """Numbers or sequences of them, element by element, numbers compared by ``equal``; a
    float equals another only of its sign (``x * 0.0`` and ``x * -0.0`` differ)."""
    if isinstance(left, (list, tuple)) or isinstance(right, (list, tuple)):
        return (
            isinstance(left, (list, tuple))
            and isinstance(right, (list, tuple))
            and len(left) == len(right)
            and all(_equal_numbers(a, b, equal) for a, b in zip(left, right, strict=True))
        )
    if type(left) is float and type(right) is float:
        return left == right and math.copysign(1.0, left) == math.copysign(1.0, right)
    return equal(left, right)


def _same_layout(left: torch.Tensor, right: torch.Tensor) -> bool:
    """Equal strides, a dimension of size 1 included: the program reads them
    (``.stride()``), and they decide the memory format of results that an operation
    lays out like its input (``interpolate`` of ``[4, 3, 1, 1]`` strided ``(3, 1, 3, 3)``
    is channels-last, of one strided ``(3, 1, 1, 1)`` contiguous)."""
    return known_equal(left.stride(), right.stride())


def _same_kind(left: torch.Tensor, right: torch.Tensor) -> bool:
    """The same type (``torch.where`` gives a subclass where one operand is one, and a
    plain tensor for parameters) and the same ``requires_grad`` (``is_leaf`` and
    ``grad_fn`` follow from it for a result made under ``no_grad``)."""
    return type(left) is type(right) and left.requires_grad == right.requires_grad


def _merge_plan(then_values: tuple[Any, ...], else_values: tuple[Any, ...]) -> list[bool] | None:
    """Per result position: True for a tensor pair to select between, False for one shared
    Python value; ``None`` when some pair cannot be merged exactly."""
    if len(then_values) != len(else_values):
        return None
    plan = []
    for left, right in zip(then_values, else_values, strict=True):
        if _same_object(left, right):  # either way: keep it, identity included
            plan.append(False)
        elif isinstance(left, torch.Tensor):
            if (
                not _same_metadata(left, right)
                or left.layout != torch.strided
                or not _same_layout(left, right)
                or not _same_kind(left, right)
            ):
                return None
            plan.append(True)
        elif _identical(left, right):
            plan.append(False)
        else:
            return None
    return plan


def _same_object(left: Any, right: Any) -> bool:
    """``left is right``, asked only of values TorchDynamo can compare by identity: it
    cannot for two built containers, ``torch.Size`` or another tuple type among them (it
    would break the graph), which are compared by their items instead, nor for symbolic
    numbers without a guard, which are compared by value."""
    if isinstance(left, _BY_VALUE) or isinstance(right, _BY_VALUE):
        return False
    return left is right


_BY_VALUE = (tuple, list, dict, set, int, float)


def _decline_merge(then_values: tuple[Any, ...], else_values: tuple[Any, ...]) -> None:
    """Record which results of the branches cannot be merged exactly."""
    if len(then_values) != len(else_values):
        declined("predicate", "the branches give different numbers of results")
        return
    for position, (left, right) in enumerate(zip(then_values, else_values, strict=True)):
        if _merge_plan((left,), (right,)) is None:
            declined(
                "predicate",
                f"result {position + 1}: the then-branch gives {{0}}, the else-branch {{1}}"
                + _how_alike_tensors_differ(left, right),
                left,
                right,
            )
            return


def _how_alike_tensors_differ(left: Any, right: Any) -> str:
    """What tells two tensors of one shape, dtype and device apart, for a message."""
    if not (isinstance(left, torch.Tensor) and _same_metadata(left, right)):
        return ""
    if not _same_kind(left, right):
        return " of another type, or requires_grad"
    return " laid out differently"


def _identical(left: Any, right: Any) -> bool:
    """Whether either value may stand for both: the same object, or equal immutable values
    (numbers and sizes equal without a guard, :func:`known_equal`)."""
    if _same_object(left, right):
        return True
    if type(left) is not type(right):
        return False
    if type(left) is tuple:
        return len(left) == len(right) and all(
            _identical(a, b) for a, b in zip(left, right, strict=True)
        )
    if type(left) in (int, float, torch.Size):
        return known_equal(left, right)
    return type(left) in IMMUTABLE_TYPES and left == right


Branch = tuple[Callable[..., tuple[Any, ...]], Sequence[Any]]


def _reads_a_strided_view(arguments: Sequence[Any]) -> bool:
    """Whether a tensor among ``arguments`` (or in a list, tuple or dict of them) is a
    strided view: a ``torch.cond`` operand whose layout cannot be pinned."""
    leaves = torch.utils._pytree.tree_leaves(list(arguments))
    return any(cond_layout.strided_view(leaf) for leaf in leaves)


def _with_cond(
    predicate: torch.Tensor,
    plan: list[bool],
    then_values: tuple[Any, ...],
    then_branch: Branch,
    else_branch: Branch,
) -> tuple[Any, ...]:
    """Run only the taken branch; the shared Python values are the ones already computed.

    (The values computed to make the plan are not used for tensors, so the
    compiler drops that work.)
    """

    def tensors_of(branch: Branch) -> Callable[[], tuple[torch.Tensor, ...]]:
        function, arguments = branch

        def run() -> tuple[torch.Tensor, ...]:
            values = function(*arguments)
            return tuple(v.clone() for v, is_tensor in zip(values, plan, strict=True) if is_tensor)

        return run

    # TorchInductor lays out an operand computed in the graph as it likes, and the
    # branches assert the traced strides: the operands' layout is pinned (cond_layout)
    torch._dynamo.comptime.comptime(cond_layout.remember_graph)
    torch._dynamo.comptime.comptime(subgraphs.cond_begins)
    results = torch.cond(predicate, tensors_of(then_branch), tensors_of(else_branch), ())
    torch._dynamo.comptime.comptime(subgraphs.cond_made)
    torch._dynamo.comptime.comptime(cond_layout.pin_traced_conds)
    selected = iter(results)
    return tuple(
        next(selected) if is_tensor else value
        for value, is_tensor in zip(then_values, plan, strict=True)
    )
