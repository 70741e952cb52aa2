"""Continuation predication (issue 9): where a predicated ``if``'s branches cannot be
merged, the rest of the function runs in both branches under ``torch.cond``; whatever
``torch.cond`` cannot capture keeps the original graph break."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch._dynamo.testing import CompileCounter

from graphmend.pipeline import rewrite
from graphmend.runtime import fallbacks
from helpers.graphs import compile_and_run
from helpers.modules import import_plain, import_rewritten

#: The mask-or-None fast path of real remote code (ChatGLM, Baichuan...): one branch
#: gives a tensor, the other None, and the rest of forward hands it to attention.
MASK_OR_NONE = """
import torch
from torch._dynamo.testing import CompileCounter
from torch import nn


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q = nn.Linear(16, 16)
        self.o = nn.Linear(16, 16)
        self.calls = 0

    def inner(self, x, mask):
        scores = self.q(x) @ x.transpose(-1, -2)
        if mask is not None:
            scores = scores.masked_fill(~mask[:, None, :], float("-inf"))
        return scores.softmax(-1) @ x

    def forward(self, x, attention_mask=None):
        if attention_mask is not None and torch.any(~attention_mask.bool()):
            attention_mask = attention_mask.bool()
        else:
            attention_mask = None
        out = self.inner(x, attention_mask)
        return self.o(out)


class Counting(Attention):
    def forward(self, x, attention_mask=None):
        if torch.any(~attention_mask.bool()):
            attention_mask = attention_mask.bool()
        else:
            attention_mask = None
        self.calls += 1
        return self.o(self.inner(x, attention_mask))


# ChatGLM's layout: hidden states [seq, batch, hidden], made by a transposed copy.
class SequenceFirst(Attention):

    def forward(self, x, attention_mask=None):
        x = x.transpose(0, 1).contiguous()
        if torch.any(~attention_mask.bool()):
            attention_mask = attention_mask.bool()
        else:
            attention_mask = None
        return self.o(self.inner(x.transpose(0, 1), attention_mask))


# The result is returned transposed, laid out as the original lays it out.
class TransposedResult(Attention):

    def forward(self, x, attention_mask=None):
        if torch.any(~attention_mask.bool()):
            attention_mask = attention_mask.bool()
        else:
            attention_mask = None
        return self.o(self.inner(x, attention_mask)).transpose(0, 1)


# The result is laid out as the argument is (an elementwise product).
class Scaling(Attention):

    def forward(self, x, attention_mask=None):
        if torch.any(~attention_mask.bool()):
            attention_mask = attention_mask.bool()
        else:
            attention_mask = None
        return x * (2.0 if attention_mask is None else 3.0)


# The branches' results are laid out differently.
class LayoutByMask(Attention):

    def forward(self, x, attention_mask=None):
        if torch.any(~attention_mask.bool()):
            attention_mask = attention_mask.bool()
            out = self.inner(x, attention_mask).transpose(0, 1).contiguous()
        else:
            attention_mask = None
            out = self.inner(x, attention_mask).transpose(0, 1)
        return out * 2


# LLaDA's (OLMo's) forward: after the site, a loop over the blocks binds the block and
# each block's cache before reading them (never unbound, though bound only in the loop).
class Stacked(Attention):

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(16, 16), nn.Linear(16, 16)])

    def forward(self, x, attention_mask=None):
        if torch.any(~attention_mask.bool()):
            attention_mask = attention_mask.bool()
        else:
            attention_mask = None
        for block in self.blocks:
            if attention_mask is None:
                x, cache = block(x), None
            else:
                x, cache = block(x), attention_mask
            x = x + (0.0 if cache is None else 1.0)
        return self.o(self.inner(x, attention_mask))


# The branch updates in place a tensor the module keeps, made in the graph.
class UpdatingAState(Attention):

    def forward(self, x, attention_mask=None):
        self.state = x.sum(-1)
        if torch.any(~attention_mask.bool()):
            attention_mask = attention_mask.bool()
        else:
            attention_mask = None
        self.state.add_(1)
        return self.o(self.inner(x, attention_mask))
"""

X = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(0))
FULL = torch.ones(2, 5, dtype=torch.long)
PADDED = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])


@pytest.fixture
def modules(tmp_path: Path):
    plain = import_plain(tmp_path, "continued_plain", MASK_OR_NONE)
    mended = import_rewritten(tmp_path, "continued_mended", MASK_OR_NONE)
    return plain, mended


def _pair(modules, name: str = "Attention"):
    plain_module, mended_module = modules
    torch.manual_seed(0)
    plain = getattr(plain_module, name)().eval()
    mended = getattr(mended_module, name)().eval()
    mended.load_state_dict(plain.state_dict())
    return plain, mended


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_mask_or_none_compiles_as_one_graph_bit_identical(modules, backend) -> None:
    plain, mended = _pair(modules)
    torch._dynamo.reset()
    with torch.no_grad(), pytest.raises(torch._dynamo.exc.Unsupported):
        torch.compile(plain, fullgraph=True, backend=backend)(X, PADDED)
    torch._dynamo.reset()
    compiled = torch.compile(mended, fullgraph=True, backend=backend)
    with torch.no_grad():
        for mask in (FULL, PADDED, FULL, None):
            assert torch.equal(compiled(X, mask), plain(X, mask))


def test_a_rest_binding_its_names_in_a_loop_compiles_as_one_graph(modules) -> None:
    plain, mended = _pair(modules, "Stacked")
    torch._dynamo.reset()
    compiled = torch.compile(mended, fullgraph=True, backend="eager")
    with torch.no_grad():
        for mask in (FULL, PADDED):
            assert torch.equal(compiled(X, mask), plain(X, mask))


@pytest.mark.inductor
def test_mask_or_none_under_inductor(modules) -> None:
    plain, mended = _pair(modules)
    torch._dynamo.reset()
    compiled = torch.compile(mended, fullgraph=True)
    with torch.no_grad():
        for mask in (PADDED, FULL):
            torch.testing.assert_close(compiled(X, mask), plain(X, mask))


@pytest.mark.inductor
def test_an_operand_computed_with_another_layout_runs_under_inductor(modules) -> None:
    """TorchInductor lays out ``x.transpose(0, 1).contiguous()`` transposed, and the
    branch it hands the cond asserts the traced (contiguous) strides: the operand's
    layout is pinned before the cond."""
    plain, mended = _pair(modules, "SequenceFirst")
    torch._dynamo.reset()
    compiled = torch.compile(mended, fullgraph=True)
    with torch.no_grad():
        for mask in (PADDED, FULL):
            torch.testing.assert_close(compiled(X, mask), plain(X, mask))


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_a_pinned_operand_keeps_its_values_and_strides(modules, backend) -> None:
    plain, mended = _pair(modules, "SequenceFirst")
    graphs = []

    def keeping(graph_module, example_inputs):
        graphs.append(graph_module)
        return torch._dynamo.backends.registry.lookup_backend(backend)(graph_module, example_inputs)

    torch._dynamo.reset()
    compiled = torch.compile(mended, fullgraph=True, backend=keeping)
    with torch.no_grad():
        for mask in (PADDED, FULL):
            assert torch.equal(compiled(X, mask), plain(X, mask))
    pins = [
        node
        for node in graphs[0].graph.nodes
        if node.target is torch.ops.prims.inductor_force_stride_order.default
    ]
    assert [pin.args[1] for pin in pins] == [[32, 16, 1]]


def test_a_pinned_operand_of_dynamic_shape_keeps_its_values(modules) -> None:
    """With symbolic sizes the strides the pin asks for are read in the graph."""
    plain, mended = _pair(modules, "SequenceFirst")
    torch._dynamo.reset()
    compiled = torch.compile(mended, fullgraph=True, dynamic=True, backend="aot_eager")
    with torch.no_grad():
        for length in (5, 7):
            x, full = torch.randn(2, length, 16), torch.ones(2, length, dtype=torch.long)
            padded = full.clone()
            padded[0, -2:] = 0
            for mask in (padded, full):
                assert torch.equal(compiled(x, mask), plain(x, mask))


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_a_result_keeps_the_layout_the_original_gives_it(modules, backend) -> None:
    plain, mended = _pair(modules, "TransposedResult")
    torch._dynamo.reset()
    compiled = torch.compile(mended, fullgraph=True, backend=backend)
    with torch.no_grad():
        for mask in (PADDED, FULL):
            result, expected = compiled(X, mask), plain(X, mask)
            assert torch.equal(result, expected)
            assert result.stride() == expected.stride()


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_a_transposed_argument_is_not_copied_into_another_layout(modules, backend) -> None:
    plain, mended = _pair(modules, "Scaling")
    transposed = X.transpose(0, 1).contiguous().transpose(0, 1)  # dense, not contiguous
    torch._dynamo.reset()
    compiled = torch.compile(mended, fullgraph=True, backend=backend)
    with torch.no_grad():
        for mask in (PADDED, FULL):
            result, expected = compiled(transposed, mask), plain(transposed, mask)
            assert torch.equal(result, expected)
            assert result.stride() == expected.stride()


@pytest.mark.inductor
def test_a_transposed_argument_under_inductor(modules) -> None:
    plain, mended = _pair(modules, "Scaling")
    transposed = X.transpose(0, 1).contiguous().transpose(0, 1)
    torch._dynamo.reset()
    compiled = torch.compile(mended, fullgraph=True)
    with torch.no_grad():
        for mask in (PADDED, FULL):
            result, expected = compiled(transposed, mask), plain(transposed, mask)
            torch.testing.assert_close(result, expected)
            assert result.stride() == expected.stride()


def test_branches_laying_out_their_results_differently_keep_the_break(modules) -> None:
    plain, mended, reasons = _kept_break(modules, "LayoutByMask")
    with torch.no_grad():
        expected = plain(X, FULL)
        result = compile_and_run(mended, X, FULL).result
    assert result.stride() == expected.stride()
    assert reasons, reasons


def _kept_break(modules, name: str):
    """The class ``name`` plain and rewritten, compiled and run in inference on the
    padded mask: the same graphs, breaks and result; the reasons continuation gave."""
    plain, mended = _pair(modules, name)
    fallbacks.clear()
    with torch.no_grad():
        before = compile_and_run(plain, X, PADDED)
        after = compile_and_run(mended, X, PADDED)
    assert (after.graphs, after.breaks) == (before.graphs, before.breaks)
    assert torch.equal(after.result, before.result)
    return plain, mended, [f.reason for f in fallbacks.records() if f.rewrite == "continuation"]


def test_an_operand_updated_in_place_keeps_the_original_break(modules) -> None:
    """Pinning would update a copy: the cond is taken out of the graph again."""
    plain, mended, reasons = _kept_break(modules, "UpdatingAState")
    assert torch.equal(mended.state, plain.state)
    assert reasons and "updates" in reasons[0], reasons


def test_a_rest_cond_cannot_capture_keeps_the_original_break(modules) -> None:
    """An attribute store in the rest of the function: torch.cond would stop the whole
    compilation; the check made while tracing finds it first."""
    plain, mended, reasons = _kept_break(modules, "Counting")
    assert mended.calls == plain.calls == 1
    assert reasons and reasons[0].startswith("torch.cond cannot capture it"), reasons


def test_while_autograd_records_the_break_stays(modules) -> None:
    plain, mended = _pair(modules)
    fallbacks.clear()
    before, after = compile_and_run(plain, X, PADDED), compile_and_run(mended, X, PADDED)
    assert (after.graphs, after.breaks) == (before.graphs, before.breaks)
    assert any("autograd records" in f.reason for f in fallbacks.records())


def _stack_depth() -> int:
    frame, depth = sys._getframe(), 0
    while frame is not None:
        frame, depth = frame.f_back, depth + 1
    return depth


def test_a_rest_nesting_too_deeply_declines_its_site_alone():
    # a 200-term sum, its rest copied 650 frames above the stack's depth here (an import
    # deep in a program): copying it recursed too deep, and the whole module fell back,
    # the sites of every other function with it
    terms = " + ".join(["x"] * 200)
    source = (
        "import torch\n\ndef deep(x):\n    if x.sum() > 0:\n        y = None\n"
        f"    else:\n        y = x\n    return ({terms}) if y is None else y\n\n"
        "def shallow(x):\n    if x.sum() > 0:\n        y = None\n    else:\n        y = x\n"
        "    return x if y is None else y\n"
    )
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(_stack_depth() + 650)
    try:
        result = rewrite(source, "<test>", {"predicate", "continuation"})
    finally:
        sys.setrecursionlimit(limit)
    decided = {
        (f.function, f.decision.value, f.reason.split(" (")[0])
        for f in result.findings
        if f.rewrite == "continuation"
    }
    assert ("shallow", "rewritten", "the rest of the function") in decided
    assert ("deep", "declined", "its code nests too deeply to be analysed") in decided
    compile(result.tree, "<test>", "exec")


def _findings(source: str) -> dict[str, str]:
    result = rewrite(textwrap.dedent(source), "<test>", {"predicate", "continuation"})
    return {f.decision.value: f.reason for f in result.findings if f.rewrite == "continuation"}


@pytest.mark.parametrize(
    ("rest", "reason"),
    [
        ("    return super().forward(x)\n", "super() without arguments"),
        ("    yield x\n", "the function is a generator"),
        ("    return y\n", "reads 'y', maybe unbound here"),
        # a loop reading what an earlier run (or nothing) bound, or running zero times
        ("    for _ in x:\n        y = y + 1\n    return x\n", "reads 'y', maybe unbound"),
        ("    for y in x:\n        pass\n    return y\n", "reads 'y', maybe unbound"),
        ("    for y in x:\n        del y\n        y\n    return x\n", "reads 'y', maybe"),
        ("    for i in y:\n        x = x + i\n    return x\n", "reads 'y', maybe unbound"),
        ("    x = x + 1\n" * 201 + "    return x\n", "more than 200 statements"),
        ("    def inner(t):\n        return t\n    return inner(x)\n", "defines inner"),
        ("    return (lambda t: t)(x)\n", "defines a lambda"),
    ],
)
def test_sites_whose_rest_cannot_run_elsewhere_are_declined(rest: str, reason: str) -> None:
    source = (
        "import torch\n\ndef forward(self, x, flag):\n"
        "    if flag:\n        y = x\n"
        "    if x.sum() > 0:\n        x = x[:1]\n    else:\n        x = x * 2\n" + rest
    )
    assert reason in _findings(source).get("declined", ""), _findings(source)


NAMED_IN_THE_REST = """
import torch
from torch._dynamo.testing import CompileCounter

def scaled(x):
    if x.sum() > 0:
        x = x[:1]
    else:
        x = x * 2
    def inner(t):
        return t + 1
    return inner(x), inner.__qualname__, (lambda: 0).__qualname__
"""


def test_what_the_rest_defines_keeps_its_qualified_name(tmp_path: Path) -> None:
    """The copies of the rest are functions of their own: a ``def`` or ``lambda`` in them
    was named ``scaled.<locals>._@gm_then1.<locals>.inner`` by the compiled call.  (On
    Python 3.10 TorchDynamo's resumed code names them ``inner`` and ``<lambda>``.)"""
    plain = import_plain(tmp_path, "named_plain", NAMED_IN_THE_REST)
    mended = import_rewritten(tmp_path, "named_mended", NAMED_IN_THE_REST)
    x = torch.ones(2)
    _, *eager = plain.scaled(x)
    _, *expected = compile_and_run(plain.scaled, x).result
    _, *compiled = compile_and_run(mended.scaled, x).result
    assert compiled == expected
    assert eager == ["scaled.<locals>.inner", "scaled.<locals>.<lambda>"]


def test_a_rest_binding_a_name_in_each_run_of_a_loop_continues() -> None:
    source = """
    import torch

    def forward(x, blocks):
        if x.sum() > 0:
            x = x[:1]
        for block in blocks:
            x, cache = block(x)
            x = x + cache
        return x
    """
    assert "rewritten" in _findings(source), _findings(source)


def test_a_site_inside_a_python_if_continues_with_the_rest_around_it() -> None:
    source = """
    import torch

    def forward(x, mask):
        if mask is None:
            if x.sum() > 0:
                mask = x > 0
            x = x + 1
        return x * mask
    """
    assert "(2 statements)" in _findings(source)["rewritten"]


def test_a_rest_holding_another_predicated_site_continues() -> None:
    """The later site's generated functions are defined before they are read."""
    source = """
    import torch

    def forward(x):
        if x.sum() > 0:
            x = x[:1]
        if x.mean() > 0:
            x = x * 2
        else:
            x = x + 1
        return x
    """
    assert "rewritten" in _findings(source), _findings(source)


SLICED_BY_AN_ARGUMENT = """
import torch
from torch._dynamo.testing import CompileCounter


def sliced(x, n):
    if x.sum() > 0:
        y = x[:n] * 2
    else:
        y = x[:n] - 1
    return y
"""


def test_a_branch_reading_a_symbolic_number_adds_no_graph(load_both) -> None:
    """Under ``dynamic=True`` the number a branch reads is symbolic; continuation's own
    check of what it hands ``torch.cond`` compared it with ``is``, a graph break on
    torch 2.5 (3 graphs against plain's 2 on the first call; found by helper hmode)."""
    generator = torch.Generator().manual_seed(8)
    calls = [
        (torch.randn(rows, 4, generator=generator) * (1 if i % 2 else -1), rows - 1)
        for i, rows in enumerate([2, 3, 5, 2, 7])
    ]
    plain, rewritten = load_both(SLICED_BY_AN_ARGUMENT)
    graphs = []
    for module in (plain, rewritten):
        torch._dynamo.reset()
        counter = CompileCounter()
        compiled = torch.compile(module.sliced, backend=counter, dynamic=True)
        with torch.no_grad():
            for x, n in calls:
                assert torch.equal(compiled(x, n), plain.sliced(x, n))
        graphs.append(counter.frame_count)
    assert graphs[1] <= graphs[0]
