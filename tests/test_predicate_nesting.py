"""T1 never leaves more graphs than plain ``torch.compile``, never raises where it does not,
and never writes where the original did not.

A branch runs as a generated function inside the graph (or as a ``torch.cond``
subgraph): anything in it that breaks the graph, an ``if`` nested in it that
cannot be merged, or a host read, must make the whole site fall back to the
original ``if`` (the same break as plain), not break inside the branch.
"""

from __future__ import annotations

import pytest
import torch

from graphmend.findings import Decision
from graphmend.pipeline import rewrite
from helpers.graphs import compile_and_run
from test_predicate import bitwise_equal

NESTED = """
import torch
from torch import nn


def unmergeable_inside(x):
    # issue 10 item 16: the inner if cannot be merged (float64 against float32)
    if x.sum() > 0:
        if x.mean() < 0.5:
            x = x.double()
        else:
            x = x * x
        return x.to(torch.int64)
    return x + 1


def unmergeable_two_deep(x):
    y = x
    if x.sum() > 0:
        if x.max() > 1:
            if x.min() > 0.5:
                y = x[:1]
            else:
                y = x * 2
        else:
            y = x * 3
    return y


class Projected(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        # issue 9: torch.cond (a submodule call) around a data-dependent conditional
        # expression raised UncapturedHigherOrderOpError where plain compile breaks
        if x.mean() < 0:
            x = self.lin(x)
        else:
            x = x * 2 if x.norm() > 1 else x
        return x


def caller_tensor(x):
    # issue 10 item 15: the first branch rebinds x, the second stores into it
    if (x > 0.85).any():
        x = x / 2
    else:
        x[0] = 0
    return x
"""

INPUTS = [torch.tensor([0.1, 0.2]), torch.tensor([1.0, 2.0]), torch.tensor([-1.0, -2.0])]


def _graphs_and_results(function, inputs):
    compiled = [compile_and_run(function, x.clone()) for x in inputs]
    return [c.graphs for c in compiled], [c.result for c in compiled]


@pytest.mark.parametrize("name", ["unmergeable_inside", "unmergeable_two_deep"])
def test_unmergeable_nested_if_keeps_the_breaks_plain_has(load_both, name):
    plain, mended = (getattr(module, name) for module in load_both(NESTED))
    plain_graphs, plain_results = _graphs_and_results(plain, INPUTS)
    mended_graphs, mended_results = _graphs_and_results(mended, INPUTS)
    assert mended_graphs == plain_graphs
    for got, want, x in zip(mended_results, plain_results, INPUTS, strict=True):
        assert bitwise_equal(got, want)
        assert bitwise_equal(got, plain(x.clone()))


def test_cond_around_a_data_dependent_expression_does_not_raise(load_both):
    plain_module, mended_module = load_both(NESTED)
    torch.manual_seed(0)
    plain = plain_module.Projected().eval()
    mended = mended_module.Projected().eval()
    mended.load_state_dict(plain.state_dict())
    inputs = [torch.ones(2, 4), -torch.ones(2, 4), torch.full((2, 4), 0.1)]
    with torch.no_grad():
        plain_graphs, plain_results = _graphs_and_results(plain, inputs)
        mended_graphs, mended_results = _graphs_and_results(mended, inputs)
    assert all(m <= p for m, p in zip(mended_graphs, plain_graphs, strict=True))
    for got, want in zip(mended_results, plain_results, strict=True):
        assert bitwise_equal(got, want)


def test_a_store_by_index_reaches_the_caller_only_where_the_original_writes(load_both):
    plain, mended = (module.caller_tensor for module in load_both(NESTED))
    for values in ([1.0, 2.0], [0.1, 0.2]):
        mine, theirs = torch.tensor(values), torch.tensor(values)
        got = compile_and_run(mended, mine).result
        want = plain(theirs)
        assert bitwise_equal(got, want)
        assert bitwise_equal(mine, theirs), "the caller's tensor differs"


@pytest.mark.parametrize(
    ("statement", "reason"),
    [
        ("y = x * x.sum().item()", "it calls x.sum().item()"),
        ("y = x * float(x.max())", "float() on a possible tensor"),
        ("y = min(x, x * 2)", "min() on a possible tensor"),
        ("y = x * 2 if x.norm() > 1 else x", "a conditional expression on `x.norm() > 1`"),
        ("y = x.any() and x", "`x.any() and x`"),
        ("y = x * (not x.any())", "`not x.any()`"),
        ("y = x * (0 < x.sum() < 1)", "the chained comparison"),
        ("y = x * torch.equal(x, x)", "it calls torch.equal()"),
        ("y = x * (x.max() if x.any() else x.min())", "a conditional expression"),
    ],
)
def test_host_reads_in_a_branch_are_declined(statement, reason):
    source = f"""
import torch
def f(x):
    y = x
    if x.sum() > 0:
        {statement}
    return y
"""
    (finding,) = (f for f in rewrite(source, "<case>", {"predicate"}).findings if f.lineno == 5)
    assert finding.decision is Decision.DECLINED
    assert reason in finding.reason
    assert "reads tensor data on the host inside a branch" in finding.reason


def test_host_reads_in_a_nested_condition_are_declined():
    # compared with something other than a number, the host read could stay on the host
    source = """
import torch
def f(x, limit):
    y = x
    if x.sum() > 0:
        if x.max().item() > limit:
            y = x * 2
    return y
"""
    outer, inner = rewrite(source, "<case>", {"predicate"}).findings
    assert outer.decision is Decision.DECLINED
    assert "it calls x.max().item()" in outer.reason
    # on its own, the inner host read is compared on the device
    assert inner.decision is Decision.REWRITTEN


def test_python_choices_in_a_branch_are_still_merged():
    source = """
import torch
def f(x, mask=None, scale: float = 2.0):
    y = x
    if x.sum() > 0:
        y = x * scale if mask is None else x.masked_fill(mask, 0.0)
        y = y[: x.shape[0] // 2 if x.dim() > 1 else 1]
    elif float(x.max()) < 0.5 or x.min().item() > -2:
        y = x * 3
    return y
"""
    (finding,) = rewrite(source, "<case>", {"predicate"}).findings
    assert finding.decision is Decision.REWRITTEN, finding.reason


FLOAT_IN_COND = """
import torch
from torch import nn


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x, t):
        if x.sum() > 0:
            if x.mean() > t:
                x = self.lin(x)
            else:
                x = x * 2
        return x
"""


def test_a_float_that_turns_symbolic_never_reaches_torch_cond(load_both):
    # torch.cond failed making its fake-tensor call on a branch closing over a float
    # TorchDynamo had made symbolic (t changed between calls)
    plain_module, mended_module = load_both(FLOAT_IN_COND)
    torch.manual_seed(0)
    plain, mended = plain_module.Scaled().eval(), mended_module.Scaled().eval()
    mended.load_state_dict(plain.state_dict())
    torch._dynamo.reset()
    compiled = torch.compile(mended, backend="eager")
    with torch.no_grad():
        for t in (0.5, 1.5, 2.5):
            x = torch.full((2, 4), 1.0)
            assert bitwise_equal(compiled(x, t), plain(x, t))
