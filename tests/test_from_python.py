"""Tests of a tensor built from Python values, decided from those values (rewrites/from_python)."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounter

from graphmend.config import ALL_REWRITES
from graphmend.findings import Decision
from graphmend.pipeline import rewrite
from helpers.graphs import compile_and_run
from helpers.modules import import_both

# transformers 4.51's HybridCache.__init__, cut down: built inside forward, it breaks
# the graph at every layer.
CACHES = """
import torch

class Cache:
    def __init__(self, layers, pattern, length):
        self.is_sliding = torch.tensor(
            [bool((i + 1) % pattern) for i in range(layers)], dtype=torch.bool
        )
        self.keys = []
        for i in range(layers):
            shape = (2, length) if not self.is_sliding[i] else (2, 1)
            key = torch.zeros(shape)
            torch._dynamo.mark_static_address(key)  # refused while tracing: made after
            self.keys.append(key)

def forward(x, layers=4, pattern=2):
    cache = Cache(layers, pattern, x.shape[-1])
    return [x.sum() + key.sum() for key in cache.keys], [key.shape for key in cache.keys]

def keys(x):
    return x + 1, Cache(3, 2, 4).keys

def local_flags(x):
    flags = torch.tensor([True, False, True])
    out = x
    for i in range(3):
        if flags[i] and x.shape[0] > 1:
            out = out + i
        while not flags[-1 - i]:
            out = out * 2
            break
    return out

def made_in_a_loop(x):
    sizes = []
    for i in range(3):
        flags = torch.tensor([i > 0, i > 1])
        sizes.append(2 if flags[0] else 3)
    return x * 2, sizes

def numbers(x):
    y = x * 2
    # not booleans: the items' truth is not the values' (0.5 is truthy, int 0 is not)
    flags = torch.tensor([0.5, 0.0], dtype=torch.int64)
    return y.sum(), (2 if flags[0] else 3)

def updated(x):
    y = x * 2
    flags = torch.tensor([True, False])
    flags.logical_not_()
    return y.sum(), (2 if flags[0] else 3)

def rebound(x):
    y = x * 2
    flags = torch.tensor([True, False])
    flags = x > 0
    return y.sum(), (2 if flags[0] else 3)

def compared_flags(x, k):
    flags = torch.tensor([j < k for j in range(4)])
    return x * 2, (1 if flags[2] else 0)

def symbolic_index(x):
    flags = torch.tensor([True, False, True, False, True, False, True, False, True, False])
    y = x * 2
    if flags[x.shape[0] - 2]:
        y = y + 1
    return y

def over_a_size(x):
    flags = torch.tensor([True, False, True, False, True, False, True, False])
    y = x
    for i in range(x.shape[0]):
        if flags[i]:
            y = y + 1
    return y

class Touched:
    def __init__(self, through):
        self.flags = torch.tensor([True, False])
        if through == "property":
            self.touch
        elif through == "data":
            self.touch_data
        elif through == "store":
            self.touch_item
        else:
            self + 1
        self.size = 2 if self.flags[0] else 3

    @property
    def touch(self):
        self.flags.logical_not_()

    @property
    def touch_data(self):
        self.flags.data[0] = False  # counted in a version of its own, not self.flags's

    @property
    def touch_item(self):
        self.flags[0] = False  # TorchDynamo 2.5 does not run it on the fake tensor

    def __add__(self, other):
        self.flags.logical_not_()

def touched(x, through):
    return x * Touched(through).size

def out_of_range(x):
    y = x * 2
    flags = torch.tensor([True])
    return y.sum(), (2 if flags[3] else 3)

def built(i):
    flags = torch.tensor([True, False])
    return 1 if flags[i] else 2

def marks_in_a_loop(x):
    for i in range(2):
        n = built(i)
        torch._dynamo.mark_dynamic(x, 0)  # refused while tracing
    return x * n

def indexed_in_a_loop(x, k):
    sizes = []
    for i in range(1):
        flags = torch.tensor([False])
        sizes.append(1 if flags[k] else 2)
    return x * 2, sizes

def sizes(k):
    flags = torch.tensor([bool((i + 1) % k) for i in range(3)])
    out = []
    for i in range(3):
        out.append(1 if flags[i] else 2)
    return out

def sizes_of_a_number_given(x, k):
    return x * 2, sizes(k)

def marks_a_number(x, y):
    for i in range(2):
        flags = torch.tensor([True, False])
        n = 1 if flags[0] else 2
        torch._dynamo.mark_static_address(n)  # raises TypeError
        torch.add(y, 1, out=y)
    return x * n
"""


@pytest.fixture(scope="module")
def modules(tmp_path_factory):
    return import_both(tmp_path_factory.mktemp("from_python"), "from_python", CACHES)


def _explained(function, *args) -> tuple[int, list[str]]:
    explained = torch._dynamo.explain(function)(*args)
    return explained.graph_count, [reason.reason for reason in explained.break_reasons]


def test_tests_of_a_cache_built_in_forward_break_no_more(modules):
    plain, mended = modules
    x = torch.randn(2, 3)
    before = compile_and_run(plain.forward, x)
    after = compile_and_run(mended.forward, x)
    assert before.breaks >= 1
    assert (after.graphs, after.breaks) == (1, 0)
    assert _explained(mended.forward, x) == (1, [])
    assert after.result[1] == before.result[1] == plain.forward(x)[1]
    assert all(map(torch.equal, after.result[0], plain.forward(x)[0]))


def test_static_addresses_are_marked_after_the_graph(modules):
    plain, mended = modules
    x = torch.randn(2)
    compiled = compile_and_run(mended.keys, x, fullgraph=True)
    expected = plain.keys(x)
    assert [key.shape for key in compiled.result[1]] == [key.shape for key in expected[1]]
    marks = [getattr(key, "_dynamo_static_input_type", None) for key in compiled.result[1]]
    assert marks == [key._dynamo_static_input_type for key in expected[1]] != [None] * 3


def test_a_tensor_made_anew_in_each_iteration(modules):
    plain, mended = modules
    x = torch.randn(3)
    with pytest.raises(torch._dynamo.exc.Unsupported):  # plain: a break in the loop
        torch.compile(plain.made_in_a_loop, backend="eager", fullgraph=True)(x)
    assert _explained(mended.made_in_a_loop, x) == (1, [])
    compiled = compile_and_run(mended.made_in_a_loop, x, fullgraph=True).result
    assert compiled[1] == plain.made_in_a_loop(x)[1] == [3, 2, 2]
    assert torch.equal(compiled[0], plain.made_in_a_loop(x)[0])


def test_local_flags_with_not_and_while_tests(modules):
    plain, mended = modules
    x = torch.randn(3, 2)
    after = compile_and_run(mended.local_flags, x, fullgraph=True)
    assert torch.equal(after.result, plain.local_flags(x))
    assert torch.equal(mended.local_flags(x), plain.local_flags(x))


@pytest.mark.parametrize("name", ["numbers", "updated", "rebound"])
def test_items_not_known_from_the_values_keep_the_branch(modules, name):
    plain, mended = modules
    x = torch.randn(3)
    before, after = _explained(getattr(plain, name), x), _explained(getattr(mended, name), x)
    assert after == before
    assert before[1] == ["generic_jump TensorVariable()"]
    assert getattr(mended, name)(x) == getattr(plain, name)(x)


def test_a_symbolic_index_is_not_pinned(modules):
    # x.shape[0] - 2 turns symbolic at the second size: looking the item up in the
    # values pinned it, and the frame compiled again for every size (8 graphs against
    # plain's 3, then ran eagerly past the recompile limit)
    calls = [(torch.randn(size),) for size in range(3, 12)]
    _assert_no_more_graphs(*modules, "symbolic_index", calls)


def test_symbolic_values_are_not_pinned(modules):
    # j < k turns symbolic when k changes: asking each value's type pinned it, and the
    # frame compiled again for every k (3 graphs against plain's 2)
    calls = [(torch.ones(2), k) for k in (1, 2, 3, 4, 0)]
    _assert_no_more_graphs(*modules, "compared_flags", calls)


@pytest.mark.xfail(
    strict=True,
    reason="the decided items guard on k == 2; plain compile, breaking in the loop of "
    "the function it inlines, restarts without those guards and gives that function up: "
    "its graph holds no guard on k. A second k compiles f again (3 graphs against 2); "
    "declining values read from a number the frame is given would decline HybridCache, "
    "whose values come from config.num_hidden_layers and config.sliding_window_pattern",
)
def test_values_from_a_number_given_do_not_recompile_the_frame(modules):
    calls = [(torch.ones(2), k) for k in (2, 3)]
    _assert_no_more_graphs(*modules, "sizes_of_a_number_given", calls)


def test_an_index_from_a_range_over_a_size_is_not_pinned(modules):
    # range(x.shape[0]) pins the size, symbolic from the second size on: decided, the
    # test compiled the frame again for every size (5 graphs, where plain compile gives
    # the frame up at the break in its loop); now only the first size's, as in
    # made_in_a_loop
    plain, mended = modules
    torch._dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(mended.over_a_size, backend=counter)
    for size in range(3, 8):
        x = torch.ones(size)
        assert torch.equal(compiled(x), plain.over_a_size(x))
    assert counter.frame_count == 1


def _assert_no_more_graphs(plain, mended, name, calls) -> None:
    """Over ``calls`` (argument tuples), the compiled GraphMend function gives plain's
    results with no more graphs than plain compile."""
    graphs = {}
    for module in (plain, mended):
        torch._dynamo.reset()
        counter = CompileCounter()
        compiled = torch.compile(getattr(module, name), backend=counter)
        for arguments in calls:
            assert _same(compiled(*arguments), getattr(plain, name)(*arguments))
        graphs[module] = counter.frame_count
    assert graphs[mended] <= graphs[plain]


def _same(left, right) -> bool:
    """Equal results: tensors equal, tuples item by item, anything else by ``==``."""
    if isinstance(left, tuple):
        return isinstance(right, tuple) and len(left) == len(right) and all(map(_same, left, right))
    if isinstance(left, torch.Tensor):
        return torch.equal(left, right)
    return left == right


@pytest.mark.parametrize("through", ["property", "operator", "data", "store"])
def test_a_tensor_updated_through_code_the_rewrite_cannot_see(modules, through):
    # self.touch (a property) and self + 1 (__add__) updated self.flags in place; so did
    # self.touch_data through self.flags.data, and on torch 2.5 self.touch_item, both
    # leaving the fake tensor's version at 0: the item was decided from the values it
    # was made of, and the size was wrong
    plain, mended = modules
    x = torch.ones(2)
    expected = plain.touched(x, through)
    assert torch.equal(expected, x * 3)
    torch._dynamo.reset()
    assert torch.equal(torch.compile(mended.touched, backend="eager")(x, through), expected)


def test_an_index_out_of_range_raises_as_before(modules):
    plain, mended = modules
    x = torch.randn(3)
    raised = [
        _raised(function, x)
        for function in (
            plain.out_of_range,
            mended.out_of_range,
            torch.compile(plain.out_of_range, backend="eager"),
            torch.compile(mended.out_of_range, backend="eager"),
        )
    ]
    assert raised[0] == raised[1]
    assert raised[2] == raised[3]
    assert issubclass(raised[0][0], IndexError)


def test_an_index_turned_symbolic_out_of_range_raises_as_plain(modules):
    # plain compile gives up the frame at the break in its loop and runs it as Python
    # ever after; GraphMend compiled it (the item decided at the first call), and when k
    # turned symbolic the fake lookup of flags[k] raised IndexError with TorchDynamo's
    # message ('select(): index s16 out of range...'), where Python's is plain's.  The
    # failed compile now gives the frame up (runtime.skipped_frames).
    plain, mended = modules
    raised = []
    for module in (plain, mended):
        torch._dynamo.reset()
        compiled = torch.compile(module.indexed_in_a_loop, backend="eager")
        compiled(torch.ones(2), 0)
        raised.append(_raised(compiled, torch.ones(2), 1))
    assert raised[0] == raised[1]


def test_a_caller_whose_code_cannot_be_traced_keeps_the_break(modules):
    # the item decided, the caller's loop was traced through: mark_dynamic failed the
    # compiled call (AssertionError: forbidden callable) where plain compile runs it
    plain, mended = modules
    x = torch.ones(2)
    before = compile_and_run(plain.marks_in_a_loop, x)
    after = compile_and_run(mended.marks_in_a_loop, x)
    assert torch.equal(after.result, before.result)
    assert after.graphs <= before.graphs


def test_a_mark_that_raises_raises_before_what_follows(modules):
    # made after the graph, the mark of a number raised after the graph had updated y
    plain, mended = modules
    outcomes = []
    for function in (plain.marks_a_number, mended.marks_a_number):
        torch._dynamo.reset()
        y = torch.zeros(2)
        outcomes.append((_raised(torch.compile(function, backend="eager"), torch.ones(2), y), y))
    assert outcomes[0][0] == outcomes[1][0]
    assert issubclass(outcomes[0][0][0], TypeError)
    assert torch.equal(outcomes[1][1], outcomes[0][1])


def _raised(function, *args) -> tuple[type[BaseException], str]:
    """The exception ``function`` raises: its type and the first line of its message."""
    with pytest.raises(Exception) as raised:
        function(*args)
    return type(raised.value), str(raised.value).splitlines()[0]


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("use(flags)\n    return x if flags[0] else -x", "use() may reach flags"),
        ("return x if flags[0] else -x, flags", "read other than by tests"),
        ("f = lambda: flags\n    return x if flags[0] else -x", "nested function"),
        # a reference to a builtin reading the frame (its call leaves the function alone)
        ("read = locals\n    return x if flags[0] else -x", "locals() may read"),
        (
            "torch._dynamo.mark_dynamic(x, 0)\n    return x if flags[0] else -x",
            "mark_dynamic() cannot be traced",
        ),
    ],
)
def test_a_tensor_read_otherwise_is_declined(body, reason):
    source = f"import torch\ndef f(x, use):\n    flags = torch.tensor([True])\n    {body}\n"
    findings = rewrite(source, "m.py", ALL_REWRITES).findings
    [finding] = [f for f in findings if f.rewrite == "from_python"]
    assert finding.decision is Decision.DECLINED
    assert reason in finding.reason


@pytest.mark.parametrize(
    "call",
    ["helper(self)", "self.reset()", "super().reset()", "helper(*parts)", "helper(self.size)"],
)
def test_an_attribute_tensor_whose_owner_is_handed_on_is_declined(call):
    source = (
        "import torch\nclass C:\n    def __init__(self, helper, parts):\n"
        "        self.flags = torch.tensor([True])\n"
        f"        {call}\n"
        "        self.size = 1 if self.flags[0] else 2\n"
    )
    findings = rewrite(source, "m.py", ALL_REWRITES).findings
    [finding] = [f for f in findings if f.rewrite == "from_python"]
    assert finding.decision is Decision.DECLINED
    assert "may reach self" in finding.reason


@pytest.mark.parametrize(
    "code",
    [
        # after the block: plain compile ran it eagerly after the break at the test
        "    if x.shape[0]:\n        flags = torch.tensor([True])\n        y = 1 if flags[0] else 2"
        "\n    helper(x)\n",
        # in the loop again, before the tensor is made anew
        "    for i in range(2):\n        helper(x)\n        flags = torch.tensor([True])\n"
        "        y = 1 if flags[0] else 2\n",
        "    for i in range(2):\n        flags = torch.tensor([True])\n"
        "        y = 1 if flags[0] else 2\n        helper(x)\n",
        "    flags = torch.tensor([True])\n    y = 1 if flags[0] else 2\n    x.add_(1)\n",
        # in a try's handlers or finally (plain compile ran the frame eagerly after the
        # break in the try; a forbidden call there failed the compiled call)
        "    try:\n        flags = torch.tensor([True])\n        y = 1 if flags[0] else 2\n"
        "    finally:\n        helper(x)\n",
        "    try:\n        flags = torch.tensor([True])\n        y = 1 if flags[0] else 2\n"
        "    except ValueError:\n        helper(x)\n",
        # a list the caller gave (a local bound to a new list is known)
        "    flags = torch.tensor([True])\n    helper.append(1 if flags[0] else 2)\n",
        "    sizes = []\n    sizes = helper\n    flags = torch.tensor([True])\n"
        "    sizes.append(1 if flags[0] else 2)\n",
    ],
)
def test_code_after_the_tests_that_may_not_trace_is_declined(code):
    source = f"import torch\ndef f(x, helper):\n{code}"
    findings = rewrite(source, "m.py", ALL_REWRITES).findings
    [finding] = [f for f in findings if f.rewrite == "from_python"]
    assert finding.decision is Decision.DECLINED
    assert "fail to trace" in finding.reason


def test_an_index_from_a_range_over_a_size_is_decided_under_fullgraph(modules):
    # there the break would fail the call: compiling again for every size is the lesser
    # cost (plain compile fails at the test)
    plain, mended = modules
    torch._dynamo.reset()
    compiled = torch.compile(mended.over_a_size, backend="eager", fullgraph=True)
    for size in range(3, 6):
        x = torch.ones(size)
        assert torch.equal(compiled(x), plain.over_a_size(x))
