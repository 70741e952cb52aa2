"""A break GraphMend removes before a break in a loop: the frame breaks where plain's does.

TorchDynamo gives a whole frame up (it runs in Python, its callees compiled one by
one) when a graph break comes inside a loop (or, on torch 2.13, inside a generator it
inlines); plain compile, breaking first at an output call or a branch before the loop,
compiles the code before it as one graph.  Likewise where the tracing fails after a
site: plain compile ran the graph before its break, or gave a frame up whose break
was in a loop.
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.exc import TorchRuntimeError
from torch._dynamo.testing import CompileCounter

from graphmend import GraphMendWarning
from graphmend.runtime import skipped_frames
from helpers.graphs import compile_and_run

#: The two functions each frame below calls before its first break: given up, the
#: frame has them compiled as two graphs, where plain compile makes one of its code.
PRELUDE = """
import logging
import torch

logger = logging.getLogger("gm_skipped_frames")

def embed(x):
    return x * 2 + 1

def position(x):
    return x.cumsum(0)
"""

#: A frame that calls the prelude's functions before its first break, then breaks in a
#: loop; ``{before}`` is the statement that breaks the graph first in plain compile.
BEFORE_A_LOOP = (
    PRELUDE
    + """
def forward(x):
    h = embed(x)
    h = h + position(x)
{before}
    for _ in range(2):
        h = h.sin()
        torch._dynamo.graph_break()
    return h
"""
)
LOGGED_BEFORE_A_LOOP = BEFORE_A_LOOP.format(before='    logger.warning("use_cache is ignored")')
BRANCH_BEFORE_A_LOOP = BEFORE_A_LOOP.format(before="    if h.sum() > 0:\n        h = h.abs()")

PRINTED_BEFORE_A_BREAK_IN_A_GENERATOR = (
    PRELUDE
    + """
def shifted(h):
    torch._dynamo.graph_break()
    yield h + 1

def forward(x):
    h = embed(x)
    h = h + position(x)
    print("start")
    return h + next(shifted(h))
"""
)

PRINTED_IN_A_LOOP_OF_A_CALLEE_BEFORE_A_BREAK_IN_A_LOOP = (
    PRELUDE
    + """
def shift(h):
    for i in range(2):
        print("shift", i)
        h = h + 1
    return h

def forward(x):
    h = embed(x)
    h = h + position(x)
    h = shift(h)
    for _ in range(2):
        h = h.sin()
        torch._dynamo.graph_break()
    return h
"""
)

#: A frame whose list comprehension (in ``{comprehension}``) calls a function that
#: prints, before a break in a loop.  On Python 3.12+ TorchDynamo breaks the graph at
#: the comprehension's start, in a loop or not, and resumes after it.
COMPREHENSION_BEFORE_A_LOOP = (
    PRELUDE
    + """
def step(t):
    print("step")
    return t + 1

def forward(x):
    h = embed(x)
    h = h + position(x)
{comprehension}
    for _ in range(2):
        h = h.sin()
        torch._dynamo.graph_break()
    return h
"""
)
PRINTED_IN_A_COMPREHENSION_BEFORE_A_BREAK_IN_A_LOOP = COMPREHENSION_BEFORE_A_LOOP.format(
    comprehension="    hs = [step(t) for t in (h, h * 2)]\n    h = hs[0] + hs[1]"
)
PRINTED_IN_A_COMPREHENSION_IN_A_LOOP = COMPREHENSION_BEFORE_A_LOOP.format(
    comprehension="    for _ in range(2):\n"
    "        hs = [step(t) for t in (h, h * 2)]\n"
    "        h = hs[0] + hs[1]"
)

MERGED_BEFORE_A_FAILED_TRACE = """
import torch

def forward(x, out):
    out.add_(1)
    if x.sum() > 0:
        x = x.abs()
    return x.reshape(3, -1)
"""

CONTINUED_BEFORE_A_FAILED_TRACE = """
import torch

def forward(x, out):
    out.add_(1)
    if x.sum() > 0:
        return x
    x = x * 2
    return x.reshape(3, -1)
"""

MERGED_IN_A_LOOP_BEFORE_A_FAILED_TRACE = """
import torch

def forward(x, out):
    for _ in range(2):
        out.add_(1)
        if x.sum() > 0:
            x = x.abs()
    return x.reshape(3, -1)
"""

PRINTED_WITHOUT_VALUES_BEFORE_A_FAILED_TRACE = """
import torch

def forward(x):
    print("reshaping")
    return x.reshape(3, -1)
"""


def _same_graphs_and_result(load_both, source: str) -> None:
    plain, mended = load_both(source)
    x = torch.arange(6.0) - 2
    want = compile_and_run(plain.forward, x)
    got = compile_and_run(mended.forward, x)
    assert torch.equal(got.result, want.result)
    assert got.graphs <= want.graphs, (got, want)
    assert got.breaks <= want.breaks, (got, want)


def test_a_deferred_call_before_a_break_in_a_loop_keeps_its_break(load_both, caplog):
    # deferred, the log call left the loop's break first: the frame was given up and
    # embed and position compiled as two graphs, where plain compiles one before the call
    _same_graphs_and_result(load_both, LOGGED_BEFORE_A_LOOP)
    assert [r.getMessage() for r in caplog.records].count("use_cache is ignored") == 2


def test_a_merged_branch_before_a_break_in_a_loop_keeps_its_break(load_both):
    _same_graphs_and_result(load_both, BRANCH_BEFORE_A_LOOP)


def test_a_deferred_call_before_a_break_in_a_generator_keeps_its_break(load_both, capsys):
    # torch 2.13 gives a frame up for a break in a generator's next(), as for one in a
    # loop: deferred, the print left it first, and embed and position became two graphs
    _same_graphs_and_result(load_both, PRINTED_BEFORE_A_BREAK_IN_A_GENERATOR)
    assert capsys.readouterr().out == "start\n" * 2


def test_a_site_in_a_loop_of_an_inlined_function_keeps_its_break(load_both, capsys):
    # a break in a function TorchDynamo inlines breaks the graph at the call of it, in
    # no loop of the frame: the site's loop was taken to give the frame up all the same,
    # and embed and position became graphs of their own where plain compiles one
    plain, mended = load_both(PRINTED_IN_A_LOOP_OF_A_CALLEE_BEFORE_A_BREAK_IN_A_LOOP)
    x = torch.arange(6.0) - 2
    want, got = _operations_per_graph(plain.forward, x), _operations_per_graph(mended.forward, x)
    # plain compile's one graph, then shift's: plain runs it eagerly (the print's
    # break is in its loop), GraphMend compiles it
    assert (want, got) == ([4], [4, 2])
    assert capsys.readouterr().out == "shift 0\nshift 1\n" * 2


def test_a_site_in_a_comprehension_keeps_its_break_before_a_break_in_a_loop(load_both, capsys):
    # the comprehension's loop (up to 3.11 a function of its own, inlined; from 3.12
    # inlined by Python into the frame, where TorchDynamo breaks at the comprehension's
    # start instead of giving the frame up) was taken to give the frame up all the
    # same: embed and position became graphs of their own
    _same_graphs_and_result(load_both, PRINTED_IN_A_COMPREHENSION_BEFORE_A_BREAK_IN_A_LOOP)
    assert capsys.readouterr().out == "step\n" * 4


def test_a_site_in_a_comprehension_in_a_loop_keeps_the_graphs_of_plain_compile(load_both):
    # Python 3.12+: the site in a loop kept no break, the frame was given up, and the
    # graph of embed and position, which plain compiles with the loop's first steps,
    # lost those steps (graphs of 2, 2 and 4 operations where plain's are 2, 2 and 4 + 4)
    plain, mended = load_both(PRINTED_IN_A_COMPREHENSION_IN_A_LOOP)
    x = torch.arange(6.0) - 2
    assert _operations_per_graph(mended.forward, x) == _operations_per_graph(plain.forward, x)


def _operations_per_graph(function, *args) -> list[int]:
    """The operations of each graph ``torch.compile`` makes of ``function`` called once."""
    torch._dynamo.reset()
    graphs = []

    def count(module: torch.fx.GraphModule, example_inputs: list) -> object:
        graphs.append(
            sum(node.op in ("call_function", "call_method") for node in module.graph.nodes)
        )
        return module.forward

    torch.compile(function, backend=count)(*args)
    return graphs


@pytest.mark.parametrize(
    ("source", "updates"),
    [
        (MERGED_BEFORE_A_FAILED_TRACE, 1),
        # (the rest fails inside the continuation's own attempt, which keeps the break)
        (CONTINUED_BEFORE_A_FAILED_TRACE, 1),
        # plain's break in the loop gives the frame up: it runs in Python, and raises
        # the eager error, where GraphMend's failed compile raised TorchRuntimeError
        (MERGED_IN_A_LOOP_BEFORE_A_FAILED_TRACE, 2),
    ],
)
def test_a_site_before_a_failed_trace_keeps_its_break(load_both, source, updates):
    # plain compile breaks at the if: the graph before it runs (updating `out`) before
    # the tracing of the rest fails; merged, the one trace failed before anything ran
    outcomes = []
    for module in load_both(source):
        torch._dynamo.reset()
        out = torch.zeros(2)
        with pytest.raises(RuntimeError) as raised:
            torch.compile(module.forward, backend="eager")(torch.arange(8.0) - 20, out)
        outcomes.append((type(raised.value).__name__, out.tolist()))
    assert outcomes[1] == outcomes[0]
    assert outcomes[0][1] == [updates] * 2


def test_a_call_of_no_values_keeps_its_break_before_a_failed_trace(load_both, capsys):
    # a deferred call of no values ignored the decision to keep its break: the text
    # plain prints before the compile fails was lost with the trace
    plain, mended = load_both(PRINTED_WITHOUT_VALUES_BEFORE_A_FAILED_TRACE)
    outcomes = []
    for module in (plain, mended):
        torch._dynamo.reset()
        try:
            torch.compile(module.forward, backend="eager")(torch.ones(8))
        except Exception as error:  # the same failure in both
            outcomes.append((type(error).__name__, capsys.readouterr().out))
    assert outcomes[0] == outcomes[1] == ("TorchRuntimeError", "reshaping\n")


BRANCH_IN_A_LOOP_OVER_A_SIZE = """
import torch

def forward(x):
    y = x * 2
    signs = torch.sign(x)
    for i in range(x.shape[0]):
        if signs[i] > 0:
            y = y + 1
    return y
"""


def test_a_branch_in_a_loop_over_a_size_does_not_compile_a_graph_per_size(load_both):
    # plain compile's break in the loop gives the frame up (no graph); merged, the
    # frame compiled again for every size, range(x.shape[0]) pinning each (5 graphs
    # over 5 sizes): from the second size on, where sizes are symbolic, it keeps its break
    plain, mended = load_both(BRANCH_IN_A_LOOP_OVER_A_SIZE)
    graphs = []
    for module in (plain, mended):
        torch._dynamo.reset()
        counter = torch._dynamo.testing.CompileCounter()
        compiled = torch.compile(module.forward, backend=counter)
        for size in range(3, 8):
            x = torch.arange(float(size)) - 1
            assert torch.equal(compiled(x), plain.forward(x))
        graphs.append(counter.frame_count)
    assert graphs[1] <= graphs[0] + 1  # the first size's graph, the break removed


def test_a_branch_in_a_loop_over_a_size_stays_merged_under_fullgraph(load_both):
    # there a break fails the call: compiling again for every size is the lesser cost
    _, mended = load_both(BRANCH_IN_A_LOOP_OVER_A_SIZE)
    torch._dynamo.reset()
    compiled = torch.compile(mended.forward, backend="eager", fullgraph=True)
    for size in range(3, 6):
        x = torch.arange(float(size)) - 1
        assert torch.equal(compiled(x), mended.forward(x))


#: A function whose traced path differs from its eager one (transformers' LongT5 builds
#: its default mask only when not compiling) and fails before a site in its loop.
TRACED_PATH_FAILS_BEFORE_A_LOOP = """
import torch

def inner(x, m):
    if m is None and not torch.compiler.is_compiling():
        m = torch.zeros(3)
    if m is None:
        x = torch.cat([x, torch.ones(2, 2)])
    for _ in range(2):
        if x.sum() > 0:
            x = x * 2
        else:
            x = x - 1
    return x + m

def outer(x, m):
    return inner(x, m) + 1
"""


def test_a_later_call_failing_in_a_frame_plain_gives_up_runs_it_in_python(load_both):
    # plain compile gives inner up at its branch in the loop (and, compiling outer again
    # for the call without m, inlines it again and fails: its break comes after the
    # failing code; in LongT5 it comes before, and plain compile succeeds); GraphMend,
    # merging the branch, compiled inner into outer, and the call without m traced the
    # path that fails (TorchRuntimeError).  Given up, outer runs in Python, and the
    # call gives what eager gives.
    plain, mended = load_both(TRACED_PATH_FAILS_BEFORE_A_LOOP)
    torch._dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(mended.outer, backend=counter)
    for m in (torch.ones(3), None):
        assert torch.equal(compiled(torch.ones(3), m), plain.outer(torch.ones(3), m))
    assert counter.frame_count <= 2  # outer merged, at the first call; nothing after


class _RunsCodeWhenRead:
    """A ``self`` in a traceback that is no translator: TorchDynamo's lazy variables
    build themselves when an attribute is read, and may raise (torch 2.14)."""

    def __getattr__(self, name: str) -> object:
        raise ValueError(f"read {name}")

    def fail(self) -> None:
        raise KeyError("traced code failed")


def test_only_translators_in_a_failed_traces_traceback_are_read() -> None:
    """On torch 2.14 reading ``f_code`` off every ``self`` in the traceback replaced the
    compile's own error with the lazy variable's (a plain module's compile failed with
    GraphMend installed)."""
    root = type("Root", (), {"one_graph": False, "error_on_graph_break": False})()
    try:
        _RunsCodeWhenRead().fail()
    except KeyError as error:
        assert not skipped_frames._failed_where_plain_gives_up(root, error)


def test_a_failure_of_graphmends_check_leaves_the_compiles_own_error(
    load_both, monkeypatch
) -> None:
    """Whatever the check made when a frame's tracing fails raises, the compile fails with
    its own error, as without GraphMend, and GraphMend says once that it failed."""
    plain, _ = load_both("import torch\n\ndef f(x):\n    return x + torch.ones(3)\n")

    def broken(_error: BaseException) -> bool:
        raise RuntimeError("GraphMend's own bug")

    monkeypatch.setattr(skipped_frames, "_gives_frame_up", broken)
    torch._dynamo.reset()
    compiled = torch.compile(plain.f, backend="eager")
    with pytest.warns(GraphMendWarning, match="own bug"), pytest.raises(TorchRuntimeError):
        compiled(torch.ones(2))
