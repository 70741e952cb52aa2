"""Python language corners in and around rewritten sites, against plain ``torch.compile``:
the same results, exceptions (type, message, chained exception) and graph counts."""

from __future__ import annotations

import textwrap
import traceback
from typing import Any

import pytest
import torch
from torch._dynamo.testing import CompileCounter
from torch._dynamo.utils import counters

from helpers.graphs import compile_and_call, compile_and_run

POSITIVE = torch.tensor([1.0, -2.0, 4.0])
NEGATIVE = torch.tensor([-5.0, 1.0, 0.5])


def _outcome(function: Any, *args: Any) -> tuple[Any, ...]:
    """What a call shows its caller: its result, or its exception's type, message and the
    exception it chains."""
    try:
        return "ok", function(*args)
    except Exception as error:
        return type(error), str(error), repr(error.__cause__), repr(error.__context__)


def _compiled_outcomes(function: Any, *inputs: torch.Tensor) -> list[tuple[Any, ...]]:
    torch._dynamo.reset()
    compiled = torch.compile(function, backend="eager")
    return [_outcome(compiled, x) for x in inputs]


def _same(left: list[tuple[Any, ...]], right: list[tuple[Any, ...]]) -> bool:
    return len(left) == len(right) and all(
        a[0] == b[0] and (torch.equal(a[1], b[1]) if a[0] == "ok" else a == b)
        for a, b in zip(left, right, strict=True)
    )


CHECK = """
import torch

def check(x):
    if x.sum() > 0:
        raise ValueError("positive")
    return x + 1
"""


@pytest.mark.parametrize(
    "step",
    [
        # The callee's own source has no try: only its caller can catch what it raises,
        # and an exception raised from inside the graph escapes the caller's handler.
        """
def step(x):
    y = x * 2
    try:
        y = check(y)
    except ValueError:
        y = x - 100
    return y
""",
        # Raised while the caller handles an exception, it chains that one.
        """
def step(x):
    try:
        {}["key"]
    except KeyError:
        return check(x * 2)
""",
    ],
    ids=["try", "except"],
)
def test_a_guard_in_a_function_called_inside_a_callers_try_keeps_its_break(load_both, step):
    plain, rewritten = load_both(CHECK + step)
    expected = _compiled_outcomes(plain.step, POSITIVE, NEGATIVE)
    assert _same(_compiled_outcomes(rewritten.step, POSITIVE, NEGATIVE), expected)
    graphs = compile_and_run(plain.step, NEGATIVE).graphs
    assert compile_and_run(rewritten.step, NEGATIVE).graphs <= graphs


@pytest.mark.parametrize(
    "step",
    [
        """
def step(x):
    with torch.no_grad():
        y = check(x * 2)
    return y
""",
        """
def step(x):
    with torch.no_grad():
        if x.sum() > 0:
            raise ValueError("positive")
        y = x * 2
    return y
""",
    ],
    ids=["caller", "own"],
)
def test_a_guard_inside_a_with_block_leaves_the_block_as_the_original(load_both, step):
    # Raised from inside the graph, the exception skipped the block's exit in the graph:
    # gradients stayed off for the rest of the program.
    plain, rewritten = load_both(CHECK + step)
    for module in (plain, rewritten):
        try:
            raised = _compiled_outcomes(module.step, POSITIVE)[0][0]
            enabled = torch.is_grad_enabled()
        finally:
            torch.set_grad_enabled(True)  # for the tests that follow
        assert (raised, enabled) == (ValueError, True), module.__name__
    assert _same(
        _compiled_outcomes(rewritten.step, POSITIVE, NEGATIVE),
        _compiled_outcomes(plain.step, POSITIVE, NEGATIVE),
    )


def test_an_assert_in_a_module_that_rebinds_assertion_error_keeps_its_break(load_both):
    # The assert statement raises the builtin AssertionError whatever the name is bound
    # to; a lowered assert raised the module's class.
    plain, rewritten = load_both("""
        import torch

        class AssertionError(Exception):
            pass

        def check(x):
            assert x.sum() < 0, "must be negative"
            return x + 1
        """)
    expected = _compiled_outcomes(plain.check, POSITIVE, NEGATIVE)
    assert expected[0][0] is not plain.AssertionError
    assert _same(_compiled_outcomes(rewritten.check, POSITIVE, NEGATIVE), expected)


@pytest.mark.parametrize(
    ("guard", "raised"),
    [
        ('if y.sum() > 0:\n    raise ValueError(f"positive {y.shape}")', ValueError),
        ('assert y.sum() < 0, "positive"', AssertionError),
    ],
    ids=["raise", "assert"],
)
def test_a_lowered_guard_raises_at_the_users_line(load_rewritten, guard, raised):
    # Raised from inside the graph, the exception's innermost frame is still the
    # guard's line in the user's file (as where the original raise runs), not the
    # runtime's kernel.
    body = textwrap.indent(guard, "    ")
    module = load_rewritten(f"import torch\n\ndef check(x):\n    y = x * 2\n{body}\n    return y\n")
    torch._dynamo.reset()
    with pytest.raises(raised) as error:
        torch.compile(module.check, backend="eager", fullgraph=True)(POSITIVE)
    frame = traceback.extract_tb(error.value.__traceback__)[-1]
    source = guard.splitlines()[-1].strip()
    assert (frame.filename, frame.name, frame.line) == (module.__file__, "check", source)


def _untaken_branch_keeps_the_if(load_both, then: str, otherwise: str) -> None:
    """``otherwise`` traces but raises when it runs: compiled with GraphMend, ``step``
    (``then`` where ``x.sum() > 0``) behaves as under plain compile."""
    plain, rewritten = load_both(f"""
        import torch

        def step(x):
            if x.sum() > 0:
                y = {then}
            else:
                y = {otherwise}
            return y
        """)
    expected = _compiled_outcomes(plain.step, POSITIVE, NEGATIVE)
    assert expected[0][0] == "ok"
    assert _same(_compiled_outcomes(rewritten.step, POSITIVE, NEGATIVE), expected)


@pytest.mark.parametrize("reduced", ["x[3:].max() + x", "x[3:].min(0).values.sum() + x"])
def test_an_untaken_branch_that_reduces_an_empty_tensor_keeps_the_if(load_both, reduced):
    # max() and min() of an empty tensor trace (their fake kernels accept it) and raise
    # when they run: merged with torch.where, the untaken branch failed the call.
    _untaken_branch_keeps_the_if(load_both, "x * 2", reduced)


@pytest.mark.parametrize(
    ("then", "otherwise"),
    [("(x > 0).long() * 2", "(x > 0) - 1"), ("x.long() * 2", "x.long() ** -1")],
    ids=["bool_subtraction", "negative_integer_power"],
)
def test_an_untaken_branch_whose_kernel_refuses_its_operands_keeps_the_if(
    load_both, then, otherwise
):
    # A subtraction with a bool operand and an integer tensor to a negative power trace
    # (their fake kernels accept them) and raise when they run: merged with torch.where,
    # the untaken branch failed a call plain compile runs.
    _untaken_branch_keeps_the_if(load_both, then, otherwise)


@pytest.mark.parametrize(
    "site",
    [
        "if x.sum() > 0:\n        y = x * 2\n    else:\n        y = x - 1",
        "if x.sum().item() > 0:\n        y = x * 2\n    else:\n        y = x - 1",
        'y = x\n    if (x < -10).any():\n        raise ValueError("too small")',
    ],
    ids=["merge", "host_read", "guard"],
)
def test_a_condition_on_a_meta_tensor_raises_as_the_original(load_both, site):
    # A meta tensor holds no data: the original raises taking its truth. Merged (or the
    # guard lowered), the compiled call returned a meta tensor instead.
    plain, rewritten = load_both(f"import torch\n\ndef step(x):\n    {site}\n    return y + 1\n")
    meta = torch.empty(3, device="meta")
    expected = _compiled_outcomes(plain.step, meta)
    assert expected[0][0] != "ok"
    assert _compiled_outcomes(rewritten.step, meta) == expected


def test_a_site_that_keeps_its_break_adds_nothing_to_the_graphs(load_both):
    # The checks a site makes while tracing read what TorchDynamo knows of the condition:
    # reading ``is_meta`` put an attribute read of the condition into every graph.
    plain, rewritten = load_both("""
        import torch

        def step(x, n):
            if x.sum() > 0:
                y = x[:n]
            else:
                y = x * 2
            return y + 1
        """)
    expected = compile_and_run(plain.step, NEGATIVE, 2)
    compiled = compile_and_run(rewritten.step, NEGATIVE, 2)
    assert torch.equal(compiled.result, expected.result)
    assert (compiled.graphs, compiled.operations) == (expected.graphs, expected.operations)


@pytest.mark.parametrize("mask", [None, torch.ones(4)])
def test_a_path_without_operations_makes_no_graph(load_both, mask):
    # TorchDynamo compiles a frame that asks whether it is compiling even when it traced
    # no operation (an empty graph); plain compile runs such a frame eagerly.  A site's
    # check asked it: one graph more than plain on a path that returns its argument.
    plain, rewritten = load_both("""
        import torch

        def step(x, mask):
            if mask is not None and torch.any(~mask.bool()):
                mask = mask.bool()
            else:
                mask = None
            if mask is None:
                return x
            return x.masked_fill(~mask, 0.0)
        """)
    expected = compile_and_run(plain.step, NEGATIVE, mask)
    compiled = compile_and_run(rewritten.step, NEGATIVE, mask)
    assert compiled.result is NEGATIVE and expected.result is NEGATIVE
    assert (compiled.graphs, compiled.operations) == (expected.graphs, expected.operations)


def test_a_branch_that_reduces_a_tensor_that_is_not_empty_is_still_merged(load_both):
    plain, rewritten = load_both("""
        import torch

        def step(x):
            if x.sum() > 0:
                y = x * 2
            else:
                y = x - x.max()
            return y
        """)
    assert _same(
        _compiled_outcomes(rewritten.step, POSITIVE, NEGATIVE),
        _compiled_outcomes(plain.step, POSITIVE, NEGATIVE),
    )
    assert compile_and_run(rewritten.step, NEGATIVE, fullgraph=True).graphs == 1


CACHED = """
import functools
import logging
import torch

logger = logging.getLogger(__name__)


@functools.lru_cache(maxsize=None)
def running_sum(n):
    logger.info("allocating a running sum of %d", n)
    return torch.zeros(n)


@functools.cache
def checked_buffer(n):
    t = torch.zeros(n)
    if (t > 100).any():
        raise ValueError("corrupt buffer")
    return t


def logged(x):
    total = running_sum(x.shape[0])
    total.add_(x)
    return total * 1


def guarded(x):
    total = checked_buffer(x.shape[0])
    total.add_(x)
    return total * 1


def _checked_table(n):
    t = torch.zeros(n)
    if (t > 100).any():
        raise ValueError("corrupt table")
    return t


checked_table = functools.lru_cache(maxsize=None)(_checked_table)


def wrapped_by_a_call(x):
    total = checked_table(x.shape[0])
    total.add_(x)
    return total * 1
"""


@pytest.mark.parametrize("name", ["logged", "guarded", "wrapped_by_a_call"])
def test_a_site_in_a_cached_function_keeps_the_cache(load_both, name):
    """A site in an ``lru_cache`` function is left alone: without its break TorchDynamo
    traces through the cache, and each compiled call got a new buffer (found by helper
    hpy: [1, 1, 1] three times where the original accumulates to [3, 3, 3])."""
    plain, rewritten = load_both(CACHED)
    outcomes = []
    for module in (plain, rewritten):
        torch._dynamo.reset()
        compiled = torch.compile(getattr(module, name), backend="eager")
        outcomes.append([compiled(torch.ones(3)) for _ in range(3)])
    assert all(map(torch.equal, *outcomes))
    assert torch.equal(outcomes[1][-1], torch.full((3,), 3.0))


SHORT_CIRCUITS = """
import torch


def indexes(x):
    if x.sum() > 0 and x[10].sum() > 0:
        y = x * 2
    else:
        y = x + 1
    return y


def views(x):
    if x.sum() > 0 and x.view(5, -1).sum() > 0:
        return x * 2
    return x + 1


def reduces(x):
    if x.sum() != 0 and x.max() > 0:
        y = x * 2
    else:
        y = x - 1
    return y


def many(x):
    if x.sum() > 0 and x > 0:
        y = x * 2
    else:
        y = x - 1
    return y


def guarded(x):
    if x.sum() > 0 and x[10].sum() > 0:
        raise ValueError("both")
    return x * 2
"""


@pytest.mark.parametrize(
    ("name", "x"),
    [
        ("indexes", -torch.ones(3, 4)),
        ("views", -torch.ones(3, 4)),
        ("reduces", torch.zeros(0)),
        ("many", torch.tensor([-1.0, -2.0, 3.0])),
        ("many", torch.zeros(0)),
        ("many", torch.tensor([1.0, 2.0])),
        ("guarded", -torch.ones(3, 4)),
    ],
)
def test_the_right_side_of_an_and_runs_only_where_python_runs_it(load_both, name, x):
    """The right side of ``and`` after a tensor left side is evaluated ahead of time only as
    an attempt: where it cannot be traced (an index or a view these shapes lack), raises
    when it runs (``max()`` of an empty tensor) or has no single truth, the original's
    jump decides (found by helper hpy: the compiled call raised where plain returns)."""
    plain, rewritten = load_both(SHORT_CIRCUITS)
    expected = _compiled_outcomes(getattr(plain, name), x)
    assert _same(_compiled_outcomes(getattr(rewritten, name), x), expected)
    graphs = [_graphs(getattr(module, name), x) for module in (plain, rewritten)]
    assert graphs[1] <= graphs[0]


def _graphs(function: Any, x: torch.Tensor) -> int:
    torch._dynamo.reset()
    try:
        return torch._dynamo.explain(function)(x).graph_count
    except Exception:  # the call raises as plain's: counted by its outcome
        return 0


INSIDE_A_TRY = """
import torch
from torch import nn


class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("buf", torch.zeros(4))

    def forward(self, x, t, scale=None):
        h = x * 1.0
        g = h * 0.5
        BLOCK
            if h.mean() < 2.0:
                if (self.buf > 0.5).any():
                    return h
            elif scale is None or (h > 3.0).any():
                h = h * t
                h = self.lin(h)
            if bool((h > -1.0).all()):
                p = (h * 2, h - 1) if h.mean() * t > 0.0 else (h, h)
        AFTER
        return h
"""
BLOCKS = {
    "try": ("try:", "except ValueError as error:\n            print('caught', error)"),
    "no_grad": ("with torch.no_grad():", ""),
    "enable_grad": ("with torch.enable_grad():", ""),
}


@pytest.mark.parametrize("block", BLOCKS)
def test_a_site_inside_a_try_or_with_block_keeps_the_original(load_both, block):
    """Rewritten sites inside a ``try`` body made TorchDynamo fail to rebuild the block's
    exception table for the code it resumes after a break there ("exception table entry
    start instruction has no offset"), where plain compile runs (found by helper hgen's
    program generator; a ``with torch.no_grad()`` block by the review): such sites are
    left as they are."""
    header, after = BLOCKS[block]
    source = INSIDE_A_TRY.replace("BLOCK", header).replace("AFTER", after)
    x = torch.tensor([[0.5, -1.0, -3.0, 1.0], [2.0, 4.0, 1.0, 1.0]])
    results = []
    for module in load_both(source):
        torch._dynamo.reset()
        torch.manual_seed(0)
        with torch.no_grad():
            results.append(torch.compile(module.M(), backend="eager")(x.clone(), 0.5))
    assert torch.equal(results[1], results[0])


NOT_AHEAD_OF_TIME = """
import torch


def either(x, lim):
    h = x
    if (h > 0).all() or h.mean() < lim:
        h = h.clamp(-1, 1)
    x.add_(1)
    return h * 2


def both(x, lim):
    h = x
    if (h > 0).any() and h.mean() < lim:
        h = h.clamp(-1, 1)
    x.add_(1)
    return h * 2
"""


@pytest.mark.parametrize(
    ("name", "rows"),
    [
        ("either", [[1.0, 2.0], [-1.0, 2.0], [-5.0, 2.0], [1.0, 3.0]]),
        ("both", [[1.0, 2.0], [-1.0, -2.0], [5.0, 9.0], [1.0, 3.0]]),
    ],
)
def test_a_right_side_not_traced_ahead_jumps_where_the_original_jumps(load_both, name, rows):
    """The right side guards on a number the frame is given (``lim``), so it is not traced
    ahead of time; the site is declined (``x`` is updated in place after it).  Where the
    left side's jump took the short cut, the frame resumed at a statement of its own, not
    at the one the right side's jump leads to: one graph more than plain over calls taking
    both (found by helper hgen3)."""
    plain, rewritten = load_both(NOT_AHEAD_OF_TIME)
    counts, outcomes = [], []
    for module in (plain, rewritten):
        torch._dynamo.reset()
        counter = CompileCounter()
        compiled = torch.compile(getattr(module, name), backend=counter)
        calls = [(torch.tensor([row]), 4.0) for row in rows]
        outcomes.append([(compiled(x, lim), x) for x, lim in calls])
        counts.append(counter.frame_count)
    assert counts[1] <= counts[0]
    assert all(
        torch.equal(a, b) and torch.equal(c, d) for (a, c), (b, d) in zip(*outcomes, strict=True)
    )


HOST_READ_THEN_PROPERTY = """
import torch


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("buf", torch.zeros(4))

    @property
    def factor(self):
        return 2.0 if self.buf.sum() > 0 else 1.0

    def forward(self, x):
        h = x
        if h.sum().item() > 1.0:
            h = h * 4.0
        else:
            h = h * self.factor
        return h.sum()
"""


def test_a_kept_branch_on_a_host_read_resumes_as_the_original_does(load_both):
    """The site keeps its if (the property's own if cannot be traced). Its choice read on
    the host as the truth of the device condition, torch 2.13 gave the frame, resumed with
    that bool, up at the property's break, which plain compile, resumed with the float
    .item() read, compiles: 3 graphs and a frame run in Python against 5 and none. The
    value is read again from the operand bound once (found by helper hgen3, fuzz seed
    30088)."""

    plain, rewritten = load_both(HOST_READ_THEN_PROPERTY)
    rows = ([1.0, 0.25, 0.5, -1.0], [-1.0, 0.0, 0.25, 0.0], [4.0, 0.25, -1.0, 1.0])
    seen = []
    for module in (plain, rewritten):
        torch._dynamo.reset()
        counters.clear()
        counter = CompileCounter()
        compiled = torch.compile(module.Model(), backend=counter)
        with torch.no_grad():
            outputs = [compiled(torch.tensor([row, row])) for row in rows]
        given_up = counters["frames"]["total"] - counters["frames"]["ok"]
        seen.append((counter.frame_count, given_up, outputs))
    (plain_graphs, plain_given_up, expected), (graphs, given_up, outputs) = seen
    assert all(map(torch.equal, outputs, expected))
    assert given_up <= plain_given_up and graphs <= plain_graphs


READ_TWICE = """
import torch


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0
        self.register_buffer("buf", torch.ones(4))

    @property
    def limit(self):
        self.calls += 1
        return float(self.calls)

    @property
    def factor(self):
        return 2.0 if self.buf.sum() > 0 else 1.0

    def forward(self, x):
        h = x
        if h.sum().item() > self.limit:
            h = h * 4.0
        else:
            h = h * self.factor
        return h.sum()


def both(x, lim):
    h = x
    if (h > 0).any() and h.mean().item() < lim:
        h = h.clamp(-1, 1)
    x.add_(1)
    return h * 2
"""


def test_a_kept_branch_on_a_host_read_reads_its_test_once(load_both):
    """Evaluated again as written for the choice on the host, the test ran the property
    it reads twice, and chose the other branch when its value changed (found by helper
    hrev2 in the first fix of the test above)."""
    plain, rewritten = load_both(READ_TWICE)
    seen = []
    for module in (plain, rewritten):
        torch._dynamo.reset()
        model = module.Model()
        compiled = torch.compile(model, backend="eager")
        with torch.no_grad():
            seen.append((compiled(torch.full((4,), 0.375)), model.calls))
    (expected, plain_calls), (result, calls) = seen
    assert torch.equal(result, expected) and calls == plain_calls == 1


def test_a_kept_and_on_a_host_read_jumps_once(load_both):
    """Evaluated again as written, the test jumped on its left side a second time after
    the translation had: 9 graphs against plain's 6 (found by helper hrev2)."""
    plain, rewritten = load_both(READ_TWICE)
    rows = ([1.0, 2.0], [-1.0, -2.0], [5.0, 9.0], [1.0, 3.0])
    counts, outcomes = [], []
    for module in (plain, rewritten):
        torch._dynamo.reset()
        counter = CompileCounter()
        compiled = torch.compile(module.both, backend=counter)
        calls = [torch.tensor([row]) for row in rows]
        outcomes.append([(compiled(x, 4.0), x) for x in calls])
        counts.append(counter.frame_count)
    assert counts[1] <= counts[0]
    assert all(
        torch.equal(a, b) and torch.equal(c, d) for (a, c), (b, d) in zip(*outcomes, strict=True)
    )


HOST_READ_OF_OTHERS = """
import torch


class Meter:
    def __init__(self):
        self.reads = 0

    def item(self):
        self.reads += 1
        return float(self.reads)


meter = Meter()


def of_an_object(x, y):
    if meter.item() > y:
        h = x[:2]  # shapes differ: the site keeps its break while tracing
    else:
        h = x
    return h * 2, meter.reads


def against_a_tensor(x, y):
    z = x.sum() * 3
    if z.item() > y:
        h = x[:2]
    else:
        h = x
    return h * 2


def asserted(x):
    assert x.max().item() < 100.0, "too large"
    h = x * 2
    print("h", h.sum())
    return h
"""


@pytest.mark.parametrize(
    ("name", "calls"),
    [
        ("of_an_object", [(torch.ones(4), torch.tensor(v)) for v in (0.5, 1.5, 2.5)]),
        ("against_a_tensor", [(torch.ones(4), torch.tensor(v)) for v in (1.0, 20.0)]),
        ("asserted", [(torch.ones(4),), (torch.full((4,), 200.0),)]),
    ],
)
def test_a_host_read_not_compared_on_the_device_is_read_as_the_original_reads_it(
    load_both, name, calls
):
    """Where the comparison was made on the host (an object's own ``item()``, a tensor on
    the other side), the choice is its result: read again from the operands, ``item()``
    ran twice (a wrong count), and a tensor result was read once more, a break more than
    plain (found by helper hrev3)."""
    plain, rewritten = load_both(HOST_READ_OF_OTHERS)
    runs = []
    for module in (plain, rewritten):
        module.meter.reads = 0
        torch._dynamo.reset()
        counters.clear()
        counter = CompileCounter()
        compiled = torch.compile(getattr(module, name), backend=counter)
        outcomes = []
        for arguments in calls:
            try:
                outcomes.append(compiled(*arguments))
            except AssertionError as error:
                outcomes.append(str(error))
        runs.append((outcomes, counter.frame_count, sum(counters["graph_break"].values())))
    (expected, plain_graphs, plain_breaks), (outcomes, graphs, breaks) = runs
    assert repr(outcomes) == repr(expected)
    assert graphs <= plain_graphs and breaks <= plain_breaks


READS_OF_TWO = """
import torch

calls = []


class Meter:
    def item(self):
        calls.append("item")
        return 2.0


class TensorMeter:
    def item(self):
        calls.append("item")
        return torch.tensor(2.0)


meter, tensor_meter = Meter(), TensorMeter()


def of_a_tensor_and_an_object(x):
    h = x * 2
    if x.sum().item() > meter.item():
        h = torch.cat([h, h])  # shapes differ: the site keeps its break while tracing
    return h, len(calls)


def of_a_tensor_and_an_object_giving_a_tensor(x):
    h = x * 2
    if x.sum().item() > tensor_meter.item():
        h = torch.cat([h, h])
    return h, len(calls)


def of_an_object_giving_a_tensor(x):
    h = x * 2
    if tensor_meter.item():
        h = torch.cat([h, h])
    return h, len(calls)


def equal_by_keyword(x, y):
    h = x * 2
    if torch.equal(input=x, other=y):
        h = torch.cat([h, h])
    if torch.allclose(input=x, other=y, atol=0.1):
        h = h + 1
    return h


def close_within(x, y, t):
    h = x * 2
    if torch.allclose(x, y, atol=t):
        h = torch.cat([h, h])
    return h
"""


@pytest.mark.parametrize(
    ("name", "calls"),
    [
        ("of_a_tensor_and_an_object", [(torch.tensor([v, 1.0]),) for v in (0.0, 3.0, 0.5)]),
        (
            "of_a_tensor_and_an_object_giving_a_tensor",
            [(torch.tensor([v, 1.0]),) for v in (0.0, 3.0, 0.5)],
        ),
        ("of_an_object_giving_a_tensor", [(torch.ones(2),)] * 3),
        ("equal_by_keyword", [(torch.ones(2), torch.ones(2)), (torch.ones(2), torch.zeros(2))]),
        (
            "close_within",
            [(torch.ones(2), torch.ones(2), 0.5), (torch.ones(2), torch.zeros(2), -1.0)],
        ),
    ],
)
def test_reads_of_two_values_compiled_give_what_the_original_gives(load_both, name, calls):
    """What a read of two values on the device (a comparison of two host reads,
    ``torch.equal``, ``torch.allclose``) is given is what the original is given, read as
    often (found by helper hgen6): an object's own ``item()`` on the other side of a
    tensor's was called again where the choice was made on the host (6 calls against
    3), and one whose ``item()`` gives a tensor was called again alone or compared
    (fuzz seeds 298, 359); ``torch.equal(input=x, other=y)`` raised ``TypeError`` compiled; and
    ``allclose`` with a negative ``atol`` raised TorchDynamo's ``TorchRuntimeError``
    where the original raises ``RuntimeError``."""
    plain, rewritten = load_both(READS_OF_TWO)
    runs = []
    for module in (plain, rewritten):
        module.calls.clear()
        torch._dynamo.reset()
        compiled = torch.compile(getattr(module, name), backend="eager")
        runs.append([_outcome(compiled, *arguments) for arguments in calls])
    assert repr(runs[1]) == repr(runs[0])


EQUAL_BEFORE_A_LOOP = """
import torch


def equal_then_loop(x):
    h = x * 2
    torch._dynamo.graph_break()
    if torch.equal(h, h.abs()):
        h = h + x
    for _ in range(3):
        if h.sum() > 3.0:  # a break in a loop: the frame it is in is given up
            continue
    return h
"""


def test_a_kept_torch_equal_breaks_at_the_read_as_the_original_does(load_both):
    """Where the choice of ``if torch.equal(...)`` is made on the host after all, it reads
    ``torch.equal`` again from the bound operands: a break at the call, as the original's,
    which resumes with the bool.  Read as the truth of the tensor GraphMend computed,
    the break was at the jump, whose two targets each became a frame TorchDynamo then
    gave up (one more than plain; found by helper hgen5)."""
    plain, rewritten = load_both(EQUAL_BEFORE_A_LOOP)
    calls = [(torch.tensor(v),) for v in ([1.0, 2.0], [-1.0, 2.0], [3.0, 1.0])]
    expected = compile_and_call(plain.equal_then_loop, calls)
    observed = compile_and_call(rewritten.equal_then_loop, calls)
    assert all(map(torch.equal, observed.results, expected.results))
    assert (observed.graphs, observed.given_up) == (expected.graphs, expected.given_up)


HOST_READ_OR_MORE = """
import torch


class Cache:
    def __init__(self):
        self.store = {}

    def has(self, key):
        return key in self.store


class Meter:
    def __float__(self):
        return 0.5


cache, meter = Cache(), Meter()


def or_a_method(x, t, cache=cache):
    h = x * 2
    if x[0, 0].item() >= t or cache.has("k") and h.shape[0] == 2:
        h = torch.cat([h, h])  # shapes differ: the site keeps its break while tracing
    for _ in range(3):
        if h.sum() > -2.0:  # a break in a loop: the frame it is in is given up
            break
        h = h + 1
    return h


def raised_or_an_object(x, t, meter=meter):
    h = x * 2
    if x[0, 0].item() < t or float(meter) > 0:
        raise ValueError("guard")
    return h
"""


@pytest.mark.parametrize("name", ["or_a_method", "raised_or_an_object"])
def test_a_host_read_left_of_an_or_breaks_at_the_read_as_the_original_does(load_both, name):
    """The left side of an ``and``/``or`` whose right side is not evaluated ahead of time,
    one comparison of a host read, has its truth taken where the original takes it: read
    again from its operands, a break at the read, which resumes with the number.  Taken
    as the truth of the comparison made on the device, the break was at a jump, whose
    targets each became a frame (one more break and one more frame given up than plain;
    found by helper hgen6)."""
    plain, rewritten = load_both(HOST_READ_OR_MORE)
    calls = [(torch.tensor([[v, 2.0], [0.5, -1.0]]), 0.0) for v in (1.0, -1.0, 1.0)]
    outcomes = []
    for module in (plain, rewritten):
        torch._dynamo.reset()
        counters.clear()
        counter = CompileCounter()
        compiled = torch.compile(getattr(module, name), backend=counter)
        results = [_outcome(compiled, *arguments) for arguments in calls]
        frames = counters["frames"]
        outcomes.append((repr(results), counter.frame_count, frames["total"] - frames["ok"]))
    (expected, plain_graphs, plain_given_up), (results, graphs, given_up) = outcomes
    assert results == expected
    assert graphs <= plain_graphs and given_up <= plain_given_up


CHAINED = """
import torch


def branch(x):
    h = x * 1.0
    if 0 < h.sum() < 1.0:
        h = h * 2
    return h


def selected(x):
    h = x * 1.0
    return h * 2 if 0 < h.sum() < 1.0 else h - 1


def asserted(x):
    assert 0 < x.sum() < 10, "out of range"
    return x * 2


def three_comparisons(x):
    h = x * 1.0
    if -1.0 < h.mean() <= h.max() < 5:
        h = h * 2
    return h


def after_a_break(x):
    h = x * 1.0
    print("before")
    if 0 < h.sum() < 1.0:
        h = h * 2
    return h


def operand_of_an_or(x, eps=0.3):
    s = x.sum()
    if 0 < (eps or 0.5) < s:
        return x + 1
    return x - 1
"""


@pytest.mark.parametrize(
    "name",
    ["branch", "selected", "asserted", "operand_of_an_or", "three_comparisons", "after_a_break"],
)
def test_a_chained_comparison_is_combined_as_an_and(load_both, name):
    """``0 < s < 1.0`` stood in the translated condition as written: a jump on the tensor
    ``0 < s`` broke the graph inside it, and the resumed frame traced the merge, one
    graph more than plain where the chain stops at its first comparison (found by helper
    hgen).  It is now ``0 < s and s < 1.0``, combined on the device."""
    plain, rewritten = load_both(CHAINED)
    inputs = (-torch.ones(3), torch.full((3,), 0.1), torch.ones(3), torch.full((3,), 0.3))
    function = getattr(rewritten, name)
    assert _same(
        _compiled_outcomes(function, *inputs), _compiled_outcomes(getattr(plain, name), *inputs)
    )
    graphs = [
        _graphs(getattr(module, name), x) for module in (plain, rewritten) for x in inputs[:1]
    ]
    assert graphs[1] <= graphs[0]
    # merged, over every input: the right side's function took the translation's own names
    # as parameters, which inspect.signature refuses, and each site ran its original code
    counter = CompileCounter()
    torch._dynamo.reset()
    compiled = torch.compile(function, backend=counter)
    for x in inputs:
        _outcome(compiled, x)
    assert counter.frame_count == 1
