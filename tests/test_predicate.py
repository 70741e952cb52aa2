"""T1: data-dependent if/else and conditional expressions become one graph."""

from __future__ import annotations

import ast
import contextlib
import copy
import functools
import textwrap

import pytest
import torch
from torch._dynamo.testing import CompileCounter
from torch.autograd import forward_ad

from graphmend.findings import Decision
from graphmend.pipeline import rewrite
from graphmend.rewrites.predicate import PredicateRewrite
from helpers.graphs import compile_and_run
from helpers.modules import import_rewritten
from helpers.observe import same

PATTERNS = """
import torch
from torch import nn


def both_branches(x):
    if x.sum() > 0:
        y = x * 2
        z = x + 1
    else:
        y = x - 1
        z = x * x
    return y + z


def else_less(x):
    h = x + 1
    if h.abs().max() > 2:
        h = h / 2
    return h


def elif_chain(x):
    if x.mean() > 1:
        y = x * 3
    elif x.mean() < -1:
        y = -x
    else:
        y = x + 0.5
    return y


def nested(x):
    y = x
    if x.sum() > 0:
        if x.max() > 3:
            y = x * 10
        else:
            y = x * 5
    return y


def in_loop(x):
    for step in range(3):
        if x.sum() > step:
            x = x - 1
    return x


def both_return(x):
    if x.sum() > 0:
        return x * 2
    else:
        return x * 3


def early_return(x):
    if (x < 0).any():
        return x.abs()
    y = x + 1
    return y * 2


def conditional_expression(x):
    scaled = x * 2.0 if x.sum() > 0 else x * 0.5
    return scaled + (x.exp() if x.mean() > 0 else x)


def mixed_condition(x, mask=None):
    if mask is not None and (mask == 0).any():
        x = x.masked_fill(mask == 0, 0.0)
    return x


def membership(x, mask=None):
    # LLaDA's remote code (modeling_llada.py): a padding test by Tensor.__contains__
    if mask is not None and 0.0 in mask:
        x = x.masked_fill(mask == 0, 0.0)
    if 2.0 not in x:
        x = x + 1
    return x


def number_in_list(x, layers):
    # the same test on a Python container is left to Python
    if 0 in layers:
        x = x * 2
    return x


def fp16_clamp(h):
    if h.dtype == torch.float16 and (torch.isinf(h).any() or torch.isnan(h).any()):
        clamp_value = torch.finfo(h.dtype).max - 1000
        h = torch.clamp(h, min=-clamp_value, max=clamp_value)
    return h


def two_clamps(h, g):
    if torch.isinf(h).any():
        clamp_value = torch.finfo(h.dtype).max - 1000
        h = torch.clamp(h, min=-clamp_value, max=clamp_value)
    h = h + g
    if torch.isinf(h).any():
        clamp_value = torch.finfo(h.dtype).max - 1000
        h = torch.clamp(h, min=-clamp_value, max=clamp_value)
    return h


def clamps_after_optional_block(h, g, cross):
    # LongT5Block.forward: a clamp inside an optional block, then the same temporary
    # in a later clamp (a generated function of the first site reads clamp_value, as
    # its own local: not a read of the later site's clamp_value)
    if cross:
        h = h + g
        if torch.isinf(h).any():
            clamp_value = torch.finfo(h.dtype).max - 1000
            h = torch.clamp(h, min=-clamp_value, max=clamp_value)
    h = h * 2
    if torch.isinf(h).any():
        clamp_value = torch.finfo(h.dtype).max - 1000
        h = torch.clamp(h, min=-clamp_value, max=clamp_value)
    return h


def host_reads(x, limit):
    if x.sum().item() > limit:
        x = x - limit
    if float(x.max()) <= 0.5 and int(x.numel()) > 1:
        x = x * 2
    if bool(x.any()):
        x = x + 1
    return x


def rotate(x):
    return torch.cat((-x[..., 1:], x[..., :1]), dim=-1)


def module_function(x):
    if x.sum() > 0:
        x = rotate(x)
    return x


def store_by_index(labels):
    if labels.sum() == 0:
        labels[labels.sum(dim=1).eq(0)] = 1
    return labels * 2


class Scaler(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.drop = nn.Dropout(0.1)
        self.register_buffer("scale", torch.ones(4))
        self.register_buffer("cache", torch.zeros(4), persistent=False)

    def forward(self, h):
        if h.sum() > 0:
            h = self.drop(self.proj(h))
        return h * self.scale + self.cache


# ChatGLM's layout: [seq, batch, hidden] made by a transposed copy, and a branch that
# calls a submodule (merged with torch.cond).
class SequenceFirst(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, h):
        x = h.transpose(0, 1).contiguous()
        if x.sum() > 0:
            y = self.proj(x)
        else:
            y = self.proj(x) * 2
        return y.transpose(0, 1)


# The same with a broadcast view (stride 0) computed in the graph: torch.cond needs
# dense operands, so the break stays.
class ExpandedOperand(SequenceFirst):
    def forward(self, h):
        x = (h[:, :1] + 1).expand(-1, 3, -1)
        if x.sum() > 0:
            y = self.proj(x)
        else:
            y = self.proj(x) * 2
        return y


# Results at an offset: TorchInductor takes a copy of such a view for a no-op, so a
# torch.cond that gives it back (dense, at offset 0) would hand on the view, read at its
# offset a second time.  T1 keeps its if; continuation carries the view's base out.
class OffsetResult(SequenceFirst):
    def forward(self, h):
        if h.sum() > 0:
            y = self.proj(h)[1:]
        else:
            y = (h * 2)[1:]
        return y + 1


def gradient_unsafe(x):
    if x.sum() > 0:
        x = torch.log(x)
    return x * 2
"""

INPUTS = {
    "both_branches": [(torch.arange(4.0),), (-torch.arange(4.0),)],
    "else_less": [(torch.arange(4.0),), (torch.zeros(4),)],
    "elif_chain": [(torch.full((3,), 2.0),), (torch.full((3,), -2.0),), (torch.zeros(3),)],
    "nested": [(torch.arange(5.0),), (torch.ones(3),), (-torch.ones(3),)],
    "in_loop": [(torch.full((2,), 3.0),), (torch.zeros(2),)],
    "both_return": [(torch.ones(2),), (-torch.ones(2),)],
    "early_return": [(torch.tensor([-1.0, 2.0]),), (torch.ones(2),)],
    "conditional_expression": [(torch.ones(2),), (-torch.ones(2),)],
    "mixed_condition": [
        (torch.ones(3), torch.tensor([1, 0, 1])),
        (torch.ones(3), torch.ones(3, dtype=torch.long)),
        (torch.ones(3), None),
    ],
    "membership": [
        (torch.ones(3), torch.tensor([1, 0, 1])),
        (torch.tensor([1.0, 2.0, 3.0]), torch.ones(3, dtype=torch.long)),
        (torch.ones(3), None),
    ],
    "number_in_list": [(torch.ones(2), [0, 1]), (torch.ones(2), (1, 2))],
    "fp16_clamp": [
        (torch.tensor([float("inf"), 1.0]).half(),),
        (torch.tensor([0.5, 1.0]).half(),),
        (torch.tensor([float("inf"), 1.0]),),
    ],
    "host_reads": [(torch.tensor([0.2, 0.3]), 0.1), (torch.tensor([2.0, 3.0]), 10)],
    # a temporary assigned in one branch only, dead after each site
    "two_clamps": [
        (torch.tensor([float("inf"), 1.0]), torch.ones(2)),
        (torch.ones(2), torch.tensor([float("inf"), 0.0])),
    ],
    "clamps_after_optional_block": [
        (torch.tensor([float("inf"), 1.0]), torch.ones(2), True),
        (torch.ones(2), torch.tensor([float("inf"), 0.0]), True),
        (torch.tensor([float("inf"), 1.0]), torch.ones(2), False),
        (torch.ones(2), torch.ones(2), False),
    ],
    "module_function": [(torch.arange(3.0),), (-torch.arange(3.0),)],
    "store_by_index": [
        (torch.zeros(2, 3, dtype=torch.long),),
        (torch.tensor([[0, 0, 0], [1, 0, 2]]),),
    ],
}


WRITES_IN_PLACE = {"store_by_index"}
#: Patterns whose result is their first argument itself when no branch changes it.
#: Compiled on their own they keep their break (the caller would get a new tensor
#: where the original returns its own: test_a_merged_value_returned_with_the_callers_
#: tensor_keeps_the_if); in a model that argument is computed in the graph, as here.
#: Through a chain of sites too (in_loop, host_reads: each site's else branch gives the
#: last site's merged tensor, the first's the argument).
RETURN_THEIR_ARGUMENT = {
    "nested",
    "mixed_condition",
    "fp16_clamp",
    "module_function",
    "membership",
    "in_loop",
    "host_reads",
}


def _fed_by_the_graph(function):
    def layer(first, *rest):
        return function(first.clone(), *rest)

    return layer


def bitwise_equal(left, right) -> bool:
    if isinstance(left, torch.Tensor):
        if left.dtype != right.dtype or left.shape != right.shape:
            return False
        if left.is_floating_point():
            bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[left.element_size()]
            return torch.equal(left.view(bits), right.view(bits))
        return torch.equal(left, right)
    return left == right


@pytest.fixture(scope="module")
def patterns(tmp_path_factory):
    return import_rewritten(tmp_path_factory.mktemp("patterns"), "gm_patterns", PATTERNS)


CASES = [(name, index) for name, inputs in INPUTS.items() for index in range(len(inputs))]


@pytest.mark.parametrize(("name", "index"), CASES)
def test_pattern_compiles_to_one_graph_bit_identical(patterns, name, index):
    function = getattr(patterns, name)
    if name in RETURN_THEIR_ARGUMENT:
        function = _fed_by_the_graph(function)
    eager_args = copy.deepcopy(INPUTS[name][index])
    compiled_args = copy.deepcopy(INPUTS[name][index])
    # a store by index is written back in place whichever branch runs: not under autograd
    grad = contextlib.nullcontext() if name not in WRITES_IN_PLACE else torch.no_grad()
    with grad:
        expected = function(*eager_args)
        compiled = compile_and_run(function, *compiled_args, fullgraph=True)
    # A path without operations (number_in_list over a tuple without 0) makes no graph
    # on torch 2.5, which skips an empty frame under fullgraph=True too, as plain does.
    expected_graphs = (0, 1) if compiled.operations == 0 else (1,)
    assert compiled.graphs in expected_graphs and compiled.breaks == 0
    assert bitwise_equal(compiled.result, expected)
    # Inputs updated in place are updated alike.
    for eager_arg, compiled_arg in zip(eager_args, compiled_args, strict=True):
        assert bitwise_equal(eager_arg, compiled_arg)


@pytest.mark.parametrize("h", [torch.full((4,), 2.0), torch.full((4,), -2.0), torch.ones(4) * 0.5])
def test_module_calling_submodules_in_a_branch(patterns, h):
    torch.manual_seed(0)
    eager_model = patterns.Scaler().eval()
    compiled_model = copy.deepcopy(eager_model)
    with torch.no_grad():  # inference: results that require grad are never merged
        expected = eager_model(h)
        compiled = compile_and_run(compiled_model, h, fullgraph=True)
    assert compiled.graphs == 1
    assert bitwise_equal(compiled.result, expected)
    for name, buffer in eager_model.named_buffers():
        assert bitwise_equal(dict(compiled_model.named_buffers())[name], buffer), name


def test_a_private_submodule_is_checked_by_its_mangled_name(load_both):
    """The purity check of ``self.__proj`` read ``self.__proj``, not ``self._M__proj``
    that the branch calls: an attribute of that very name (a pure ``Identity``) let a
    hooked ``Linear`` into ``torch.cond``, and the compiled call failed
    (``UncapturedHigherOrderOpError``) where plain compile runs."""
    source = """
    import torch
    CALLS = []
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.__proj = torch.nn.Linear(3, 3)
            self.__proj.register_forward_hook(lambda *args: CALLS.append(1))
        def forward(self, x):
            if x.sum() > 0:
                y = self.__proj(x)
            else:
                y = x - 1
            return y
    """
    results = []
    for module in load_both(source):
        torch.manual_seed(0)
        model = module.M().eval()
        object.__setattr__(model, "__proj", torch.nn.Identity())
        with torch.no_grad():
            compiled = compile_and_run(model, torch.ones(2, 3))
        results.append((compiled.result, compiled.graphs, len(module.CALLS)))
    (plain, plain_graphs, plain_calls), (mended, graphs, calls) = results
    assert bitwise_equal(mended, plain) and calls == plain_calls
    assert graphs <= plain_graphs


def test_training_mode_dropout_keeps_the_original_branch(patterns):
    model = patterns.Scaler().train()
    compiled = compile_and_run(model, torch.full((4,), 2.0))
    assert compiled.breaks >= 1  # dropout in training mode draws random numbers


def test_gradients_recorded_keep_the_original_branch(patterns):
    for sign in (1.0, -1.0):
        x_eager = (sign * torch.arange(1.0, 4.0)).requires_grad_()
        x_compiled = x_eager.detach().clone().requires_grad_()
        patterns.gradient_unsafe(x_eager).sum().backward()
        compiled = compile_and_run(patterns.gradient_unsafe, x_compiled)
        assert compiled.breaks >= 1  # the original if, with its break
        compiled.result.sum().backward()
        assert bitwise_equal(x_compiled.grad, x_eager.grad)


CAPTURED_LENGTH = """
import torch

def f(x):
    n = int((x > 0.5).sum().item())
    if x.sum() > 0:
        y = x[:n] * 2
    else:
        y = x[:n] - 1
    return y
"""


def test_arms_sized_by_a_captured_number_keep_the_break_without_more_graphs(load_both):
    # Under capture_scalar_outputs each arm's x[:n] has a size TorchDynamo captured from
    # data; comparing the two sizes for the merge guarded on data, a graph break inside
    # GraphMend's runtime before the one at the if: 6 graphs against plain's 5.
    plain, rewritten = load_both(CAPTURED_LENGTH)
    generator = torch.Generator().manual_seed(0)
    x = torch.rand(4, 5, generator=generator) + 0.1
    calls = [x, -x, torch.rand(6, 5, generator=generator) + 0.1]
    graphs = {}
    for module in (plain, rewritten):
        torch._dynamo.reset()
        counter = CompileCounter()
        with torch._dynamo.config.patch(capture_scalar_outputs=True):
            compiled = torch.compile(module.f, backend=counter)
            for x in calls:
                assert same(compiled(x), plain.f(x))
        graphs[module] = counter.frame_count
    assert graphs[rewritten] <= graphs[plain]


@pytest.mark.inductor
def test_inductor_end_to_end(patterns):
    torch._dynamo.reset()
    compiled = torch.compile(patterns.elif_chain, fullgraph=True)
    for x in (torch.full((3,), 2.0), torch.full((3,), -2.0), torch.zeros(3)):
        assert torch.allclose(compiled(x), patterns.elif_chain(x))


@pytest.mark.inductor
def test_a_costly_branch_reading_a_transposed_copy_under_inductor(patterns):
    """The branches call a submodule, so they run under ``torch.cond``; TorchInductor
    lays out ``h.transpose(0, 1).contiguous()`` transposed, and the branch asserts the
    traced (contiguous) strides: the operand's layout is pinned before the cond."""
    _agrees_under_inductor(patterns.SequenceFirst().eval(), fullgraph=True)


@pytest.mark.inductor
def test_a_costly_branch_reading_a_broadcast_view_keeps_its_break_under_inductor(patterns):
    """A stride-0 operand cannot be pinned (TorchInductor copies it densely): the
    original ``if`` runs, with its break, where GraphMend's cond failed at run time."""
    _agrees_under_inductor(patterns.ExpandedOperand().eval(), fullgraph=False)


@pytest.mark.inductor
def test_a_costly_branch_giving_a_view_at_an_offset_under_inductor(patterns):
    """Failed at run time (the cond's 16-byte alignment check) where T1 merged it."""
    _agrees_under_inductor(patterns.OffsetResult().eval(), fullgraph=True)


def _agrees_under_inductor(model: torch.nn.Module, fullgraph: bool) -> None:
    """``model`` compiled with TorchInductor gives eager's results, for either branch."""
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=fullgraph)
    with torch.no_grad():
        for sign in (1.0, -1.0):
            h = sign * torch.rand(2, 5, 4, generator=torch.Generator().manual_seed(0))
            torch.testing.assert_close(compiled(h), model(h))


def test_dynamic_shapes(patterns):
    torch._dynamo.reset()
    compiled = torch.compile(patterns.both_branches, backend="eager", fullgraph=True, dynamic=True)
    for size in (3, 5, 8):
        for sign in (1, -1):
            x = sign * torch.arange(float(size))
            assert bitwise_equal(compiled(x), patterns.both_branches(x))


TRACE_TIME_FALLBACKS = """
import torch

def shapes_differ(x):
    if x.sum() > 0:
        y = x[:2]
    else:
        y = x
    return y * 2

def dtypes_differ(x):
    if x.sum() > 0:
        y = x.double()
    else:
        y = x
    return y

def python_values_differ(x):
    if x.sum() > 0:
        n = 1
    else:
        n = 2
    return x * n
"""


@pytest.mark.parametrize("name", ["shapes_differ", "dtypes_differ", "python_values_differ"])
def test_unmergeable_branches_keep_the_original_break(load_rewritten, name):
    module = load_rewritten(TRACE_TIME_FALLBACKS)
    function = getattr(module, name)
    for x in (torch.arange(4.0), -torch.arange(4.0)):
        assert bitwise_equal(compile_and_run(function, x).result, function(x))
        # torch 2.5 reports the same break as a UserError, in other words.
        with pytest.raises(
            (torch._dynamo.exc.Unsupported, torch._dynamo.exc.UserError),
            match=r"Data-dependent branching|Dynamic control flow is not supported",
        ):
            compile_and_run(function, x, fullgraph=True)


UNKNOWN_TENSOR_METHODS = """
import torch

def lower_triangle(x):
    h = x * 2
    if x.sum() > 0:
        y = h.tril()
    else:
        y = h * 3
    return y

def conjugate(x):
    c = torch.complex(x, -x)
    if x.sum() > 0:
        y = c.conj()
    else:
        y = c * 2
    return y
"""


@pytest.mark.parametrize("name", ["lower_triangle", "conjugate"])
def test_a_tensor_method_not_known_to_be_pure_keeps_only_the_original_break(load_both, name):
    # A method the tables do not list may be a submodule's call; the branch asked
    # isinstance(h.tril, nn.Module) while tracing, and TorchDynamo cannot tell the type
    # of a computed tensor's bound method: a break of its own (3 graphs against 2).
    plain, rewritten = load_both(UNKNOWN_TENSOR_METHODS)
    for x in (torch.ones(4, 4), -torch.ones(4, 4)):
        expected = compile_and_run(getattr(plain, name), x)
        observed = compile_and_run(getattr(rewritten, name), x)
        assert bitwise_equal(observed.result, expected.result)
        assert (observed.graphs, observed.breaks) <= (expected.graphs, expected.breaks)


UNMERGEABLE_SEARCHES = """
import torch

def mask_or_none(x, mask):
    # Hunyuan-Large, Jamba, Florence-2 (remote code), their flash-attention path
    h = (x * 2).sin()
    mask = mask if (mask is not None and 0 in mask) else None
    return h.cos(), mask

def reshaped_or_not(x, mask):
    h = (x * 2).sin()
    if 0 in mask:
        m = mask[:, None]
    else:
        m = mask
    return h.cos(), m

def searched_first(x, mask):
    mask = mask if (mask is not None and 0 in mask) else None
    return x.cos(), mask

def update_causal_mask(mask):
    # transformers 4.40's Mistral, Qwen2, Phi, Starcoder2 under flash attention
    if mask is not None and 0.0 in mask:
        return mask
    return None

def forward(x, mask):
    h = (x * 2).sin()
    mask = update_causal_mask(mask)
    h = h.cos()
    return h if mask is None else h * mask
"""


@pytest.mark.parametrize("name", ["mask_or_none", "reshaped_or_not", "searched_first", "forward"])
def test_an_unmerged_search_of_a_tensor_breaks_where_the_original_does(load_both, name):
    # TorchDynamo cannot resume after `0 in mask` (it compiles up to there and runs the
    # rest eagerly, or the whole frame where nothing came before): the fallback jumped on
    # the searched device value instead, a break it resumes from, one graph more than
    # plain; then it searched again, after the device version of the condition had
    # put its operations into the graph (a graph where plain's was empty).
    plain, mended = (getattr(module, name) for module in load_both(UNMERGEABLE_SEARCHES))
    for mask in (torch.tensor([1.0, 0.0, 1.0]), torch.ones(3)):
        x = torch.arange(3.0)
        expected = compile_and_run(plain, x, mask)
        compiled = compile_and_run(mended, x, mask)
        assert (compiled.graphs, compiled.breaks, compiled.operations) == (
            expected.graphs,
            expected.breaks,
            expected.operations,
        )
        assert same(compiled.result, expected.result)


MERGED_SEARCH_THEN_A_BREAK = """
import torch

def f(x, mask):
    h = (x * 2).sin()
    h = h * 2 if 0 in mask else h * 3
    h = h / 2 if h.sum() > 1 else h.double()
    return h.cos()
"""


def test_a_merged_search_of_a_tensor_with_a_break_after_it_breaks_where_the_original_does(
    load_both,
):
    # Merged, the search no longer stopped the trace: TorchDynamo went on to the later
    # break (the branches give other dtypes) and compiled the rest, which plain compile
    # runs eagerly after the search, in a graph of its own (3 graphs against 2).
    plain, mended = (module.f for module in load_both(MERGED_SEARCH_THEN_A_BREAK))
    for mask in (torch.tensor([1.0, 0.0, 1.0]), torch.ones(3)):
        x = torch.arange(3.0)
        expected = compile_and_run(plain, x, mask)
        compiled = compile_and_run(mended, x, mask)
        assert (compiled.graphs, compiled.breaks) == (expected.graphs, expected.breaks)
        assert same(compiled.result, expected.result)


def _findings(source: str):
    return rewrite(textwrap.dedent(source), "<fixture>", {"predicate"}).findings


@pytest.mark.parametrize(
    ("helper", "decision"),
    [
        ("return a * 2 if a is b else a", Decision.DECLINED),
        ("return a * b", Decision.REWRITTEN),
        ("return other(a, b)", Decision.REWRITTEN),
        ("return other(*(a, b))", Decision.REWRITTEN),
    ],
)
def test_a_callee_of_the_module_is_read_for_identity_uses(helper, decision):
    # Followed: the module's own functions a merged name is passed to; an imported one
    # (`other`) is not, nor an argument passed inside a tuple.
    source = f"""
import torch
from elsewhere import other
def helper(a, b):
    {helper}
def f(x):
    t = x * 2
    if x.sum() > 0:
        y = t
    else:
        y = x * 3
    return helper(y, t)
"""
    (finding,) = _findings(source)
    assert finding.decision is decision
    if decision is Decision.DECLINED:
        assert "identity is used" in finding.reason


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("print(x)\n    y = x", "expression statement"),
        ("x.add_(1)\n    y = x", "expression statement"),
        ("y = x\n    y += 1", "augmented assignment"),
        ("y = x + torch.rand(3)", "torch.rand(), which is not known to be pure"),
        ("y = helper(x)", "helper(), which is not known to be pure"),
        ("y = x[index]", "indexes with a value that may be an out-of-range tensor"),
        ("y = x\n    raise ValueError('no')", "raise"),
        ("y = x\n    for i in range(2): pass", "loop"),
    ],
)
def test_declined_branches_say_why(body, reason):
    source = f"""
import torch
def f(x, index):
  y = x
  if x.sum() > 0:
    {body}
  return y
"""
    (finding,) = _findings(source)
    assert finding.decision is Decision.DECLINED
    assert reason in finding.reason


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        (
            """
            import torch
            def f(x):
                if x.sum() > 0:
                    fresh = x * 2
                return fresh
            """,
            "fresh is assigned in one branch only",
        ),
        (
            """
            import torch
            def f(x):
                if x.sum() > 0:
                    return x
                x = x + 1
            """,
            "one branch returns",
        ),
    ],
)
def test_declined_sites_say_why(source, reason):
    (finding,) = _findings(source)
    assert finding.decision is Decision.DECLINED
    assert reason in finding.reason


def test_python_conditions_are_not_candidates():
    assert (
        _findings(
            """
            import torch
            def f(x, training, mask=None):
                if training and mask is not None:
                    x = x * 2
                if x.dim() == 3 and x.shape[0] > 1:
                    x = x[0]
                if isinstance(mask, torch.Tensor):
                    x = x + mask
                return x
            """
        )
        == ()
    )


def test_type_checks_of_tensor_values_are_not_candidates():
    # blenderbot: `layer_outputs[0] if isinstance(layer_outputs, tuple) else layer_outputs`
    assert (
        _findings(
            """
            import torch
            def f(layer, x):
                outputs = layer(torch.relu(x))
                h = outputs[0] if isinstance(outputs, tuple) else outputs
                n = h.sum() if hasattr(h, "sum") and len(h) > 1 else h
                return h if callable(h) or type(h) is tuple else n
            """
        )
        == ()
    )


@pytest.mark.parametrize(
    "site",
    [
        # transformers: `from ...utils import is_torchdynamo_compiling`, a flag read relatively
        "if attention_mask is None and not is_torchdynamo_compiling():\n        h = h * 2",
        "if key.startswith('text_'):\n        h = h * 2",
        "if 'batch' in mode.lower():\n        h = h * 2",
        "if kwargs.get('use_cache', True):\n        h = h * 2",
        "if not h.is_contiguous():\n        h = h.contiguous()",
        "if heads.count(None) == len(heads):\n        h = h * 2",
        "if math.prod(h.shape) > 8:\n        h = h * 2",
        "if any(m is None for m in heads) or all([m is h for m in heads]):\n        h = h * 2",
        # locals computed from Python values of tensors: len, an identity test
        "n = len(h)\n    if n > 2:\n        h = h * 2",
        "crossed = attention_mask is not None\n    h = attention_mask if crossed else h",
    ],
)
def test_python_values_of_any_origin_are_not_candidates(site):
    source = f"""
import math
import torch
from ...utils import is_torchdynamo_compiling

def f(x, attention_mask, key, mode, heads, **kwargs):
    h = torch.relu(x)
    attention_mask = torch.ones_like(h)
    {site}
    return h
"""
    assert _findings(source) == ()


@pytest.mark.parametrize(
    "site",
    [
        "if kwargs.get('scale', h).sum() > 0:\n        h = h * 2",
        "if stats.get('mean') > 0:\n        h = h * 2",
        "if math.sqrt(h.sum()) > 1:\n        h = h * 2",
        "if any(m > 0 for m in h):\n        h = h * 2",
        "if any(h > 0):\n        h = h * 2",
        "if key.startswith('text_') and h.sum() > 0:\n        h = h * 2",
        "n = len(h) + h.sum()\n    if n > 2:\n        h = h * 2",
    ],
)
def test_tensor_data_next_to_python_values_is_still_a_candidate(site):
    source = f"""
import math
import torch

def f(x, key, **kwargs):
    h = torch.relu(x)
    stats = {{"mean": h.mean()}}
    {site}
    return h
"""
    (finding,) = _findings(source)
    assert finding.rewrite == "predicate"


def test_methods_that_build_objects_are_left_alone_but_not_what_they_define():
    source = """
        import torch
        class M(torch.nn.Module):
            def __init__(self, x):
                super().__init__()
                if x.sum() > 0:
                    x = x * 2
                def hook(module, args):
                    h = args[0]
                    if h.sum() > 0:
                        h = h * 2
                    return (h,)
                self.register_forward_pre_hook(hook)

            def __init_subclass__(cls, x=None):
                if x is not None and x.any():
                    x = x + 1
        """
    (finding,) = _findings(source)
    assert finding.function == "M.__init__.<locals>.hook"


def test_functions_without_an_if_are_passed_over_unread(monkeypatch):
    offered = []
    original = PredicateRewrite.rewrite_statement

    def spy(self, statement):
        offered.append(ast.unparse(statement).splitlines()[0])
        return original(self, statement)

    monkeypatch.setattr(PredicateRewrite, "rewrite_statement", spy)
    source = """
        import torch
        def plain(x):
            y = x.sum()
            return y
        class Block(torch.nn.Module):
            def forward(self, x):
                return x.relu()
        def branching(x):
            y = x + 1
            return y if y.sum() > 0 else -y
        """
    (finding,) = _findings(source)
    assert finding.function == "branching"
    assert offered == ["y = x + 1", "return y if y.sum() > 0 else -y"]


@pytest.mark.parametrize("separator", ["\f", "\v", "\x1c", "\x85", "\u2028", "\r"])
@pytest.mark.parametrize("encoded", [False, True])
def test_the_if_prescan_numbers_lines_as_the_parser(separator, encoded):
    # str.splitlines() also breaks at these characters, which the parser reads in a
    # comment as any other character; lines numbered so would hide the site below.
    source = (
        f"import torch\n# a{separator}comment\n# another{separator}one\n"
        "def f(x):\n    return x + 1 if x.sum() > 0 else x - 1\n"
    )
    if separator == "\r":  # a newline for the parser too
        source = source.replace("\n", "\r")
    result = rewrite(source.encode() if encoded else source, "m.py", ["predicate"])
    assert [finding.decision for finding in result.findings] == [Decision.REWRITTEN]


def test_a_conditional_expression_that_cannot_be_merged_falls_back_to_its_own_branches(
    load_rewritten,
):
    # Calling the branch functions there kept them live across the break: TorchDynamo
    # then guarded the resumed frame on the id of their code object, a guard that
    # failed on later calls in long runs (one graph more than plain).
    source = "import torch\n\ndef f(x, w):\n    return x @ w if x.sum() > 0 else x[:1]\n"
    tree = rewrite(source, "m.py", {"predicate"}).tree
    [branch] = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "branch"
    ]
    handed_over = {id(node) for node in ast.walk(branch)}
    generated = ("_@gm_then", "_@gm_else")
    read_elsewhere = [
        node.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Name)
        and isinstance(node.ctx, ast.Load)
        and node.id.startswith(generated)
        and id(node) not in handed_over
    ]
    assert read_elsewhere == []
    assert "x @ w if _@gm_cond1 else x[:1]" in ast.unparse(tree)
    module = load_rewritten(source)
    compiled = torch.compile(module.f, backend="eager")
    w = torch.eye(3)
    for x in (torch.ones(2, 3), -torch.ones(2, 3)):
        assert torch.equal(compiled(x, w), x @ w if x.sum() > 0 else x[:1])


ALIASED_AND_UPDATED = """
import torch

def first_row(x):
    y = x[:1] if x.abs().max() < 0.0 else x[:1]
    y.add_(1)
    return y

def itself_or_double(x):
    y = x if x.sum() > 0 else x * 2
    y.add_(1)
    return y

def viewed_after(x):
    if x.sum() > 0:
        y = x
    else:
        y = x * 2
    z = y.view(-1)
    z.add_(1)
    return z

def updated_through_data(x):
    y = x
    if x.sum() > 0:
        y = x.clamp(min=0)
    y.data.add_(1)
    return x.clone()

def bump_through_data(t):
    t.data.add_(1)

def updated_through_data_by_a_callee(x):
    y = x
    if x.sum() > 0:
        y = x.clamp(min=0)
    bump_through_data(y)
    return x.clone()

def row_of_a_view_updated(x):
    y = x
    if x.sum() > 0:
        y = x * 2
    y.view(-1)[0] = 5.0
    return x.clone()

def itself_or_doubled(x):
    if x.sum() > 0:
        y = x
    else:
        y = x * 2
    return y

def add_one(t):
    t.add_(1)

def updated_by_a_callee(x):
    if x.sum() > 0:
        y = x
    else:
        y = x * 2
    add_one(y)
    return y.sum()

def updated_by_the_caller(x):
    y = itself_or_doubled(x)
    y.add_(1)
    return y

def branch_value_updated_after(x):
    t = x * 3
    if t.sum() > 0:
        y = t
    else:
        y = t * 2
    t.add_(1)
    return y

def compared_by_identity(x):
    t = x * 2
    if x.sum() > 0:
        y = t
    else:
        y = x * 3
    if y is t:
        return y + 1
    return y - 1

def looked_up_by_identity(x):
    t = x * 2
    seen = {t: 1}
    if x.sum() > 0:
        y = t
    else:
        y = x * 3
    return y + 1 if y in seen else y - 1

def looked_up_by_a_method(x):
    t = x * 2
    scales = {t: 5}
    if x.sum() > 0:
        y = t
    else:
        y = x * 3
    return y * scales.get(y, 2)

def hashed_into_a_set(x):
    t = x * 2
    if x.sum() > 0:
        y = t
    else:
        y = x * 3
    return y + len({y, t})

def identity_through_a_container(x):
    t = x * 2
    if x.sum() > 0:
        y = t
    else:
        y = x * 3
    outputs = (y, x)
    if outputs[0] is t:
        return y + 1
    return y - 1

def _same_or_not(a, b):
    return a + 1 if a is b else a - 1

def _passes_on(first, *, second):
    return _same_or_not(first, second) * 2

def identity_in_a_callee(x):
    t = x * 2
    if x.sum() > 0:
        y = t
    else:
        y = x * 3
    return _same_or_not(y, t)

def identity_two_callees_down(x):
    t = x * 2
    if x.sum() > 0:
        y = t
    else:
        y = x * 3
    return _passes_on(y, second=t)

class Holder:
    def __init__(self):
        self.t = None

    def compare(self, value):
        return value + 1 if value is self.t else value - 1

    def run(self, x):
        self.t = x * 2
        if x.sum() > 0:
            y = self.t
        else:
            y = x * 3
        return self.compare(y)

def identity_in_a_method(x):
    return Holder().run(x)

def identity_of_a_conditional(x):
    t = x * 2
    y = t if x.sum() > 0 else x * 3
    return y + (id(y) == id(t))

def memory_of_a_merged_value(x):
    t = (x * 2)[1:]
    if x.sum() > 0:
        y = t
    else:
        y = x[1:] * 3
    return y + y.storage_offset()

def read_by_absolute_offset(x):
    t = x * 2
    if x.sum() > 0:
        y = t[1:]
    else:
        y = x[1:] * 3
    return y.as_strided((2,), (1,), 0) + torch.as_strided(y, (2,), (1,), 0)

def tag(t):
    t.tag = 1

def tagged_by_a_callee(x):
    y = x
    if x.sum() > 0:
        y = x.clamp(min=0)
    tag(y)
    return x * 1, getattr(x, "tag", None)

def tag_by_setattr(t):
    setattr(t, "tag", 2)

def give_a_grad(t):
    t.grad = torch.ones_like(t)

TAGGERS = [tag, tag_by_setattr, give_a_grad]

def store_first(t):
    t[0] = 9.0

def make_require_grad(t):
    t.requires_grad_()

UNSEEN = [store_first, make_require_grad]

def stored_by_an_unseen_callee(x):
    y = x
    if x.sum() > 0:
        y = x.clamp(min=0)
    UNSEEN[0](y)
    return x * 1

def made_to_require_grad_by_an_unseen_callee(x):
    y = x
    if x.sum() > 0:
        y = x.clamp(min=0)
    UNSEEN[1](y)
    return x * 1, x.requires_grad

def tagged_by_an_unseen_callee(x, k=0):
    y = x
    if x.sum() > 0:
        y = x.clamp(min=0)
    TAGGERS[k](y)
    return x * 1, getattr(x, "tag", None), x.grad

def base_of_a_slice(x):
    y = x
    if x.sum() > 0:
        y = x.clamp(min=0)
    return x * 1 + (y[:]._base is x)

def viewed_or_not(x):
    t = x * 2
    if x.sum() > 0:
        y = t[1:]
    else:
        y = t[:3] * 2
    return y + y._is_view()

def version_of_a_merged_value(x):
    t = x * 2
    t.add_(1)
    if x.sum() > 0:
        y = t
    else:
        y = t * 2
    return y + y._version

def one_tensor_twice(x):
    t = x * 2
    if x.sum() > 0:
        a = t
        b = t
    else:
        a = x * 3
        b = x * 4
    return a, b

def disjoint_rows(x):
    t = x.reshape(2, 2) * 2
    if x.sum() > 0:
        a = t[0]
        b = t[1]
    else:
        a = x[:2] * 3
        b = x[2:] * 4
    return a, b

def one_tensor_from_two_sites(x):
    t = x * 2
    if x.sum() > 0:
        a = t
    else:
        a = x * 3
    if x.mean() > 0:
        b = t
    else:
        b = x * 4
    return a, b
"""


def _updated_alike(load_both, name: str) -> None:
    plain, rewritten = load_both(ALIASED_AND_UPDATED)
    for sign in (1.0, -1.0):
        eager_input = sign * torch.arange(1.0, 5.0).reshape(2, 2)
        compiled_input = eager_input.clone()
        expected = getattr(plain, name)(eager_input)
        torch._dynamo.reset()
        result = torch.compile(getattr(rewritten, name), backend="eager")(compiled_input)
        assert torch.equal(result, expected)
        assert torch.equal(compiled_input, eager_input)  # the caller's tensor, updated alike


@pytest.mark.parametrize("name", ["first_row", "itself_or_double"])
def test_a_conditional_value_updated_in_place_after_still_updates_what_it_holds(load_both, name):
    # Found by test_properties ("mixed"): `y = x[:1] if c else x[:1]; y.add_(1)` merged
    # the two views into a new tensor, and the update no longer reached x.
    _updated_alike(load_both, name)


def test_a_view_of_a_merged_value_updated_in_place_updates_what_it_holds(load_both):
    # z = y.view(-1); z.add_(1) updates the tensor y holds: a merged y is a new tensor.
    _updated_alike(load_both, "viewed_after")


@pytest.mark.parametrize(
    "name",
    [
        "updated_through_data",
        "row_of_a_view_updated",
        "updated_through_data_by_a_callee",
        # torch 2.5 does not run y[0] = v on the fake tensor: its version stayed
        "stored_by_an_unseen_callee",
    ],
)
def test_a_merged_value_updated_through_an_expression_updates_what_it_holds(load_both, name):
    # Found by the from_python red team: `y.data.add_(1)` updated the caller's x where
    # the branch left y holding it; merged, y was a new tensor and x kept its values
    # (`.data` counts the update in a version of its own, which the check of version
    # counters when the graph ends did not see; a callee's is seen only there).
    _updated_alike(load_both, name)


@pytest.mark.parametrize(
    "name", ["updated_by_a_callee", "updated_by_the_caller", "branch_value_updated_after"]
)
def test_an_update_the_site_cannot_see_keeps_the_if(load_both, name):
    # A callee's `t.add_(1)`, the caller's `f(x).add_(1)`, and `t.add_(1)` of the tensor
    # a branch gave: the original updates the one tensor y and x (or t) hold, a merged y
    # is a second one.  Checked when the graph ends (runtime/aliasing.py).
    _updated_alike(load_both, name)


def _compiled_agrees(plain_function, rewritten_function, graphs=None) -> None:
    """Compiled (in inference), ``rewritten_function`` gives what ``plain_function`` gives
    eagerly, for an input of either sign, in ``graphs`` graphs where given."""
    for sign in (1.0, -1.0):
        x = sign * torch.arange(1.0, 5.0)
        torch._dynamo.reset()
        counter = CompileCounter()
        with torch.no_grad():
            result = torch.compile(rewritten_function, backend=counter)(x)
            assert same(result, plain_function(x.clone()))
        assert graphs is None or counter.frame_count == graphs


@pytest.mark.parametrize(
    "name",
    [
        "compared_by_identity",
        "looked_up_by_identity",
        "hashed_into_a_set",
        "looked_up_by_a_method",
        "identity_through_a_container",
        "identity_in_a_callee",
        "identity_two_callees_down",
        "identity_in_a_method",
        "identity_of_a_conditional",
        "memory_of_a_merged_value",
        "base_of_a_slice",
        "tagged_by_a_callee",
        "made_to_require_grad_by_an_unseen_callee",
        "read_by_absolute_offset",
    ],
)
def test_a_merged_value_whose_identity_is_used_keeps_the_if(load_both, name):
    # `y is t`, `y in seen`, `{y, t}` and `scales.get(y)` (a tensor hashes by identity),
    # `(y, x)[0] is t`, `id(y)`, `y.storage_offset()`, `y.as_strided(..., 0)` (which
    # reads the storage from its start: t[0] for y = t[1:]), and `a is b` in a
    # function of the module y is passed to (as far as three calls down): a merged y is
    # a new tensor, never the one the branch gave.
    plain, rewritten = load_both(ALIASED_AND_UPDATED)
    _compiled_agrees(getattr(plain, name), getattr(rewritten, name))


@pytest.mark.parametrize("k", [0, 1, 2])
def test_an_attribute_stored_by_an_unseen_callee_reaches_what_it_holds(load_both, k):
    # TAGGERS[k](y), a callee no analysis resolves, stores an attribute on y: the caller's
    # x where the original's branch is not taken.  TorchDynamo 2.13 forgot the store on
    # the merged tensor, which nothing else holds, before GraphMend's check when the
    # graph ends: x had no tag (runtime/attribute_stores.py notes stores as traced).
    plain, rewritten = load_both(ALIASED_AND_UPDATED)
    _compiled_agrees(
        functools.partial(plain.tagged_by_an_unseen_callee, k=k),
        functools.partial(rewritten.tagged_by_an_unseen_callee, k=k),
    )


IDENTITY_IN_THE_CALLER = """
import torch

def clamp(x):
    if x.sum() > 0:
        x = x.abs()
    return x

def pick(x):
    if x.sum() > 0:
        scale = None
    else:
        scale = 2.0
    if scale is None:
        return x
    return x * scale

def caller(x):
    y = clamp(x)
    return y * 2 if y is x else y * 3

def compared_by_id(x):
    y = clamp(x)
    return y * 2 if id(y) == id(x) else y * 3

def looked_up_by_key(x):
    table = {x: 2.0}
    y = clamp(x)
    return y * table.get(y, 3.0)

def two_calls_compared(x):
    a = clamp(x)
    b = clamp(x)
    return a * 2 if a is b else a * 3

def of_a_computed_tensor(x):
    t = x * 1
    y = clamp(t)
    return y * 2 if y is t else y * 3

def clamp_inside(x):
    return clamp(x)

def two_calls_down(x):
    y = clamp_inside(x)
    return y * 2 if y is x else y * 3

def through_the_continuation(x):
    y = pick(x)
    return y * 2 if y is x else y * 3

class Remembering(torch.nn.Module):
    def forward(self, x):
        self.last = x
        y = clamp(x)
        return y * 2 if y is self.last else y * 3

class Buffered(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("held", torch.arange(1.0, 5.0))

    def forward(self, x):
        self.held.copy_(x)
        y = clamp(self.held)
        return y * 2 if y is self.held else y * 3

def stored_on_self(x):
    return Remembering()(x)

def a_buffer_read_again(x):
    return Buffered()(x)

def computed_then_clamped(x):
    y = clamp(x * 2)
    return y + 1

def doubled_then_clamped(x):
    h = x * 2
    h = h.abs() if h.sum() > 0 else h
    return h

def clamped_by_an_expression(x):
    return doubled_then_clamped(x) + 1

def doubled_and_kept(x):
    h = x * 2
    kept = h
    if h.sum() > 0:
        h = h.abs()
    return h, kept

def another_name_returned(x):
    y, kept = doubled_and_kept(x)
    return y * 2 if y is kept else y * 3

def doubled_in_a_list(x):
    h = x * 2
    held = [h]
    if h.sum() > 0:
        h = h.abs()
    return h, held

def a_list_returned(x):
    y, held = doubled_in_a_list(x)
    return y * 2 if y is held[0] else y * 3

def doubled_in_a_closure(x):
    h = x * 2
    first = h
    if h.sum() > 0:
        h = h.abs()
    return h, lambda: first

def a_closure_returned(x):
    y, first = doubled_in_a_closure(x)
    return y * 2 if y is first() else y * 3

def doubled_by_an_expression(x):
    h = x * 2
    kept = h
    h = h.abs() if h.sum() > 0 else h
    return h, kept

def another_name_of_an_expression(x):
    y, kept = doubled_by_an_expression(x)
    return y * 2 if y is kept else y * 3

def doubled_twice_yielded(x):
    h = x * 2
    yield h
    if h.sum() > 0:
        h = h.abs()
    yield h

def yielded_before(x):
    first, second = list(doubled_twice_yielded(x))
    return first * 2 if first is second else first * 3

def doubled_among_outputs(x):
    h = x * 2
    outputs = [h, x * 3, x * 4]
    if h.sum() > 0:
        h = h.abs()
    return h, outputs[2:], outputs[-3]

def an_item_returned(x):
    y, rest, first = doubled_among_outputs(x)
    return y * 2 if y is first else y * 3

def doubled_then_sliced(x):
    h = x * 2
    outputs = (h, x * 3, x * 4)
    for _ in range(1):  # not the rest of the function: no continuation
        if h.sum() > 0:
            h = h.abs()
    return h, outputs[2:]

def doubled_then_repeated(x):
    h = x * 2
    outputs = [h, x * 3]
    for _ in range(1):  # not the rest of the function: no continuation
        if h.sum() > 0:
            h = h.abs()
    outputs *= 2
    return h, outputs[2:]

def a_repeated_item_returned(x):
    y, rest = doubled_then_repeated(x)
    return y * 2 if y is rest[0] else y * 3

def other_items_returned(x):
    y, rest = doubled_then_sliced(x)
    return y + rest[0]
"""


@pytest.mark.parametrize(
    "name",
    [
        "caller",
        "compared_by_id",
        "looked_up_by_key",
        "two_calls_compared",
        "of_a_computed_tensor",
        "two_calls_down",
        "through_the_continuation",
        "stored_on_self",
        "a_buffer_read_again",
        "another_name_returned",
        "a_list_returned",
        "a_closure_returned",
        "another_name_of_an_expression",
        "yielded_before",
        "an_item_returned",
        "a_repeated_item_returned",
    ],
)
def test_a_merged_value_compared_by_identity_in_the_caller_keeps_the_if(load_both, name):
    # `def clamp(x): if x.sum() > 0: x = x.abs(); return x` returns the caller's x itself
    # when the branch does not run; a merged x is a new tensor.  A caller inlined in the
    # same graph that holds or can reach x (its locals, `self.last = x`, a buffer it can
    # read again, an earlier call's result) may compare by identity (`y is x`, `id()`, a
    # dict key), which TorchDynamo decides while tracing: the site keeps its break
    # (runtime/callers.py), under T1 and under the continuation (`pick`) alike.  So may
    # one the site's function gives back later under another name (`kept = h` before
    # `if c: h = h.abs()`, `[h]`, a closure's cell, a value a generator yielded before
    # the site): its other locals count too.
    plain, rewritten = load_both(IDENTITY_IN_THE_CALLER)
    _compiled_agrees(getattr(plain, name), getattr(rewritten, name))


READ_BY_NO_NAME = """
import torch

def doubled_and_kept(x):
    h = x * 2
    kept = h
    if h.sum() > 0:
        h = h.abs()
    return h, locals()["kept"]

def read_by_no_name(x):
    y, kept = doubled_and_kept(x)
    return y * 2 if y is kept else y * 3
"""


def _outcome(function, x):
    """What ``function`` compiled (backend eager) gives for ``x``, or the type it raises."""
    torch._dynamo.reset()
    try:
        return torch.compile(function, backend="eager")(x.clone())
    except Exception as error:  # the outcome compared
        return type(error)


def test_a_function_reading_its_locals_by_no_name_keeps_the_if(load_both):
    # `locals()["kept"]` reads a local no name after the site shows: every local counts
    # as kept.  Merged, the caller got y * 3 where the original gives y * 2 (plain
    # torch.compile, which prunes `kept` at the break, raises on 2.13: the same).
    plain, rewritten = load_both(READ_BY_NO_NAME)
    x = -torch.arange(1.0, 5.0)
    expected, got = _outcome(plain.read_by_no_name, x), _outcome(rewritten.read_by_no_name, x)
    assert same(got, expected) if isinstance(expected, torch.Tensor) else got is expected


@pytest.mark.parametrize(
    "name", ["computed_then_clamped", "clamped_by_an_expression", "other_items_returned"]
)
def test_a_merge_no_caller_can_tell_apart_is_kept(load_both, name):
    # The caller holds no tensor a branch gives (`clamp(x * 2)`: the product is only
    # clamp's; `h = h.abs() if ... else h` rebinds the only name of it; `outputs`, which
    # holds it, is read after the site only by `outputs[1:]`, as in LongT5's block):
    # the merge stays, in one graph.
    plain, rewritten = load_both(IDENTITY_IN_THE_CALLER)
    _compiled_agrees(getattr(plain, name), getattr(rewritten, name), graphs=1)


@pytest.mark.parametrize("name", ["viewed_or_not", "version_of_a_merged_value"])
def test_a_merged_value_whose_view_or_version_is_read_keeps_the_if(load_both, name):
    # `y._is_view()` (a break, read eagerly after it) and `y._version` tell a merged y,
    # a new tensor, from the view or the updated tensor the branch gives.
    plain, rewritten = load_both(ALIASED_AND_UPDATED)
    _compiled_agrees(getattr(plain, name), getattr(rewritten, name))


@pytest.mark.parametrize("name", ["one_tensor_twice", "one_tensor_from_two_sites"])
def test_merged_values_that_may_be_one_tensor_keep_the_if(load_both, name):
    # `a = t; b = t` (in one site or two): the original returns one tensor twice, and
    # the caller's update of one shows in the other; two merged results are two tensors.
    plain, rewritten = load_both(ALIASED_AND_UPDATED)
    for sign in (1.0, -1.0):
        x = sign * torch.arange(1.0, 5.0)
        expected = getattr(plain, name)(x)
        torch._dynamo.reset()
        result = torch.compile(getattr(rewritten, name), backend="eager")(x)
        assert (result[0] is result[1]) == (expected[0] is expected[1])
        for outputs in (expected, result):
            outputs[0].add_(100)
        assert all(map(torch.equal, result, expected))


def test_merged_values_from_disjoint_rows_of_one_tensor_are_merged(load_both):
    # t[0] and t[1] share no element: the caller's update of one never shows in the
    # other, so the merge holds (one graph where plain compile makes two).
    plain, rewritten = load_both(ALIASED_AND_UPDATED)
    _compiled_agrees(plain.disjoint_rows, rewritten.disjoint_rows, graphs=1)


def test_a_merged_value_returned_with_the_callers_tensor_keeps_the_if(load_both):
    # The original returns the caller's own tensor when the else-branch is not taken:
    # a merged result would be a new tensor, which the caller could update in place.
    plain, rewritten = load_both(ALIASED_AND_UPDATED)
    x = torch.ones(2, 2)
    torch._dynamo.reset()
    assert plain.itself_or_doubled(x) is x
    assert torch.compile(rewritten.itself_or_doubled, backend="eager")(x) is x


STORED_THROUGH_ANOTHER_NAME = """
import torch

def two_names(x):
    h = x.clone()
    g = h
    if x.sum() > 0:
        h[0] = 3.0
    else:
        g[1] = 4.0
    return h, g

def read_through_another_name(x):
    h = x.clone()
    g = h
    if x.sum() > 0:
        h[0] = 3.0
        y = g.sum()
    else:
        y = g.mean()
    return h, y

def read_through_a_view(x):
    h = x.clone()
    v = h[0]
    if x.sum() > 0:
        h[0] = 3.0
        y = v.sum()
    else:
        y = v.mean()
    return h, y

def read_through_a_list(x):
    h = x.clone()
    hs = [h]
    if x.sum() > 0:
        h[0] = 3.0
        y = hs[0].sum()
    else:
        y = hs[0].mean()
    return h, y

def _store(h, k, x):
    if x.sum() > 0:
        h[0] = 3.0
    else:
        k[1] = 4.0
    return h, k

def one_tensor_given_twice(x):
    t = x.clone()
    return _store(t, t, x)

class Buffered(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("buf", torch.ones(2, 2))

    def forward(self, x):
        h = self.buf
        if x.sum() > 0:
            h[0] = 3.0
            y = self.buf.sum()
        else:
            y = self.buf.mean()
        return y * x

def read_through_an_attribute(x):
    return Buffered()(x)

BUFFER = torch.ones(2, 2)

def read_through_a_global(x):
    BUFFER.fill_(1.0)
    h = BUFFER
    if x.sum() > 0:
        h[0] = 3.0
        y = BUFFER.sum()
    else:
        y = BUFFER.mean()
    return y * x

def stored_alone(x):
    h = x.clone()
    if x.sum() > 0:
        h[0] = 3.0
        y = h.sum()
    else:
        y = h.mean()
    return h, y
"""


@pytest.mark.parametrize(
    "name",
    [
        "two_names",
        "read_through_another_name",
        "read_through_a_view",
        "read_through_a_list",
        "one_tensor_given_twice",
        "read_through_an_attribute",
        "read_through_a_global",
        "stored_alone",
    ],
)
def test_a_tensor_stored_into_by_index_and_reached_another_way_keeps_the_if(load_both, name):
    """A branch stores into a copy, written back after the merge: another name, a view
    or a list holding the same tensor still gave the values from before the store (the
    positive input: `g.sum()` 12 where the original gives 16), and the write-back of two
    names undid one another's store (`h` all ones where the original has a row of 3s).
    So did an attribute or a module-level tensor read after the store."""
    plain, rewritten = load_both(STORED_THROUGH_ANOTHER_NAME)
    for sign in (1.0, -1.0):
        x = sign * torch.ones(2, 2)
        expected = getattr(plain, name)(x.clone())
        torch._dynamo.reset()
        counter = CompileCounter()
        with torch.no_grad():  # stores by index are merged only in inference
            result = torch.compile(getattr(rewritten, name), backend=counter)(x.clone())
        assert same(result, expected)
    if name == "stored_alone":  # nothing else reaches h: still merged
        assert counter.frame_count == 1


def test_an_attribute_store_of_a_constant_is_declined_without_naming_a_tensor() -> None:
    # The reason said "the original binds another tensor there" of self.mode = "a".
    source = (
        "import torch\n\ndef f(self, x):\n    if x.sum() > 0:\n        self.mode = 'a'\n"
        "    else:\n        self.mode = 'b'\n    return x\n"
    )
    result = rewrite(source, "<test>", {"predicate"})
    (reason,) = [f.reason for f in result.findings if f.rewrite == "predicate"]
    assert "stores into self.mode" in reason and "tensor" not in reason


FORWARD_AD = """
import torch

def dual(x, c):
    if c.sum() > 0:
        y = x * 2
    else:
        y = torch.zeros_like(c)
    return y
"""


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_forward_ad_gives_no_tangent_where_the_original_gives_none(load_both, backend):
    # dual tensors do not require grad: merged, torch.where gave y a zero tangent
    tangents = []
    for module in load_both(FORWARD_AD):
        torch._dynamo.reset()
        with forward_ad.dual_level():
            x = forward_ad.make_dual(torch.tensor([0.0, -1.0, 2.0]), torch.ones(3))
            y = torch.compile(module.dual, backend=backend)(x, -torch.ones(3))
            tangents.append(forward_ad.unpack_dual(y).tangent)
    assert tangents == [None, None]
