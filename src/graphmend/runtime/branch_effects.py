"""Operations a traced branch puts in the graph that act whichever branch is taken.

T1 merges an ``if`` with ``torch.where`` by running both branches, and plans a
``torch.cond`` by tracing both: what a branch puts in the graph then runs where the
original does not run that branch.  Computing is harmless (its result is not
selected), but two kinds of operation act whatever their result: one drawing random
numbers moves the generator (every later draw differs), and an assert on tensor data
(TorchDynamo's translation of ``assert``, a guard GraphMend lowers) raises.  The
branch's code may hide them from the static checks: a property read, a method of the
program's own named like a tensor's (``self.noise.add(x)``), a submodule whose
``forward`` was replaced on the instance.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from typing import Any

import torch

#: Random functions whose first ``training`` argument (position, keyword names,
#: default) says whether they draw: ``F.dropout(x, p, training=False)`` does not.
_TRAINING_FLAG = {
    "dropout": (2, True),
    "dropout1d": (2, True),
    "dropout2d": (2, True),
    "dropout3d": (2, True),
    "feature_dropout": (2, True),
    "alpha_dropout": (2, False),
    "feature_alpha_dropout": (2, False),
    "rrelu": (3, False),
}
_TRAINING_KEYWORDS = ("training", "train")
#: Python-level random functions with no operator of their name.
_RANDOM_FUNCTIONS = frozenset({"gumbel_softmax", "rrelu_", *_TRAINING_FLAG})


def acting_operation(nodes: Iterable[Any]) -> str | None:
    """What an operation among ``nodes`` (graph nodes a branch added) does whatever its
    result, for a decline's reason; ``None`` if none does."""
    for node in nodes:
        if is_assert(node):
            return f"asserts on tensor data ({_name(node)}), which would raise untaken"
        if _draws_random_numbers(node):
            return f"draws random numbers ({_name(node)}), moving the generator untaken"
    return None


def leaves_grad_mode(nodes: Iterable[Any], before: bool) -> bool:
    """Whether ``nodes`` (a branch's trace, begun with autograd recording ``before``)
    leave autograd's grad mode otherwise (``torch.set_grad_enabled(True)`` not set back).
    TorchDynamo applies such a change while it traces, so the other branch would be
    traced, and the rest of the frame compiled, in the mode the branch left, whichever
    branch runs; a ``with torch.no_grad():`` block sets it back, and is harmless."""
    state = before
    for node in nodes:
        if node.op == "call_function" and node.target is torch._C._set_grad_enabled:
            state = bool(node.args[0])
    return state != before


def asserts(nodes: Iterable[Any]) -> Iterator[Any]:
    """The nodes among ``nodes`` that assert on tensor data."""
    return (node for node in nodes if is_assert(node))


def is_assert(node: Any) -> bool:
    """Whether the graph node ``node`` asserts on tensor data: TorchDynamo's translation of
    an ``assert`` (``torch._assert_async``) or a guard GraphMend lowers
    (``graphmend::raise_if``)."""
    if node.op != "call_function":
        return False
    target = node.target
    if target is torch._assert_async:
        return True
    schema = getattr(target, "_schema", None)  # an operator's overload, or its packet:
    name = getattr(schema, "name", None) or getattr(target, "_qualified_op_name", None)
    return name == "graphmend::raise_if"


def _draws_random_numbers(node: Any) -> bool:
    if node.op not in ("call_function", "call_method"):
        return False
    name = _name(node)
    if name is None or not (name in _random_operators() or name in _RANDOM_FUNCTIONS):
        return False
    if name == "scaled_dot_product_attention":
        dropout = node.kwargs.get("dropout_p", node.args[4] if len(node.args) > 4 else 0.0)
        return dropout != 0.0
    flag = _TRAINING_FLAG.get(name)
    if flag is None:
        return True
    position, default = flag
    keywords = [node.kwargs[k] for k in _TRAINING_KEYWORDS if k in node.kwargs]
    given = keywords[0] if keywords else node.args[position] if len(node.args) > position else None
    return default if given is None else given is not False


def _name(node: Any) -> str | None:
    target = node.target
    return target if isinstance(target, str) else getattr(target, "__name__", None)


@functools.cache
def _random_operators() -> frozenset[str]:
    """The names of ATen's operators tagged as drawing random numbers (``rand``,
    ``bernoulli_``, ``native_dropout``...), the names their Python functions and tensor
    methods have too, and scaled dot-product attention (with dropout)."""
    names = {"scaled_dot_product_attention"}
    seeded = torch.Tag.nondeterministic_seeded
    for name in dir(torch.ops.aten):
        packet = getattr(torch.ops.aten, name, None)
        try:
            overloads = [getattr(packet, overload) for overload in packet.overloads()]
        except (AttributeError, RuntimeError):
            continue
        if any(seeded in overload.tags for overload in overloads):
            names.add(name)
    return frozenset(names)
