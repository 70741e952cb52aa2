"""Property: for generated functions with tensor-valued branches, the rewritten code
computes what the original computes, eagerly and compiled as one graph."""

from __future__ import annotations

import types

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graphmend.pipeline import compile_module, rewrite
from helpers.modules import run_as_module
from test_predicate import bitwise_equal

CONDITIONS = [
    "h.sum() > {t}",
    "(h > {t}).any()",
    "h.abs().max() < {t}",
    "h.mean().item() >= {t}",
    "torch.isnan(h).any() or h.min() < {t}",
    "x is not None and h.sum() != {t}",
    "not (h < {t}).all()",
    "float(h.max()) > {t} and h.numel() > 1",
]
EXPRESSIONS = [
    "h * {k}",
    "h + {k}",
    "torch.clamp(h, -{k}, {k})",
    "h.abs()",
    "torch.tanh(h)",
    "-h",
    "h * x",
    "torch.where(h > 0, h, x)",
    "h - h.mean()",
]

numbers = st.sampled_from(["0.0", "0.5", "1.0", "2.0", "-1.0"])
expressions = st.builds(lambda e, k: e.format(k=k), st.sampled_from(EXPRESSIONS), numbers)
conditions = st.builds(lambda c, t: c.format(t=t), st.sampled_from(CONDITIONS), numbers)


@st.composite
def programs(draw) -> str:
    condition = draw(conditions)
    shape = draw(st.sampled_from(["statement", "else-less", "expression", "elif"]))
    first, second, third = draw(expressions), draw(expressions), draw(expressions)
    if shape == "statement":
        body = f"    if {condition}:\n        h = {first}\n    else:\n        h = {second}\n"
    elif shape == "else-less":
        body = f"    if {condition}:\n        h = {first}\n"
    elif shape == "expression":
        body = f"    h = {first} if {condition} else {second}\n"
    else:
        other = draw(conditions)
        body = (
            f"    if {condition}:\n        h = {first}\n"
            f"    elif {other}:\n        h = {second}\n    else:\n        h = {third}\n"
        )
    return f"import torch\n\ndef f(x):\n    h = x * 1.5\n{body}    return h\n"


def _load(source: str, rewritten: bool) -> tuple[types.FunctionType, bool]:
    """The generated function, and whether every candidate site was rewritten."""
    everything_rewritten = True
    if rewritten:
        result = rewrite(source, "<generated>", {"predicate"})
        everything_rewritten = all(finding.rewritten for finding in result.findings)
        code = compile_module(result.tree, "<generated>")
    else:
        code = compile(source, "<generated>", "exec")
    return run_as_module(code, "gm_generated")["f"], everything_rewritten  # type: ignore[return-value]


inputs = st.lists(
    st.sampled_from([-3.0, -1.0, -0.5, 0.0, 0.25, 1.0, 2.0, float("nan")]), min_size=2, max_size=4
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(source=programs(), values=st.lists(inputs, min_size=2, max_size=2))
def test_rewritten_program_matches_the_original(source, values):
    original, _ = _load(source, rewritten=False)
    mended, everything_rewritten = _load(source, rewritten=True)
    assert everything_rewritten, source  # the generator only writes predicable branches
    torch._dynamo.reset()
    compiled = torch.compile(mended, backend="eager", fullgraph=True)
    for row in values:
        x = torch.tensor(row)
        expected = original(x)
        assert bitwise_equal(mended(x), expected), source
        assert bitwise_equal(compiled(x), expected), source
