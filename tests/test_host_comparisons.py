"""Host values compared on the device (runtime.conditions.compare): exactly as Python
compares the numbers, or as the original did, where float64 or int64 cannot hold them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from torch._dynamo.testing import CompileCounter
from torch._dynamo.utils import counters

from graphmend.pipeline import compile_module, rewrite
from graphmend.runtime import fallbacks
from helpers.modules import import_both, run_as_module
from test_predicate import bitwise_equal

SOURCE = """
def above(x, limit):
    if x.item() > limit:
        y = x + 1
    else:
        y = x - 1
    return y

def equal(x, limit):
    if x.item() == limit:
        y = x + 1
    else:
        y = x - 1
    return y
"""

CASES = {
    # an int64 beyond 2**53 against a float: float64 rounded 2**53 + 1 to 2**53
    "int64-above-2**53-float": ("above", torch.tensor([2**53 + 1]), float(2**53)),
    # a float64 against an int beyond 2**53: float64 rounded the int
    "float64-int-beyond-2**53": ("equal", torch.tensor([2.0**53], dtype=torch.float64), 2**53 + 1),
    # a Python int beyond int64: the device comparison raised
    "int64-int-beyond-int64": ("above", torch.tensor([5]), 2**64),
    "float-int-beyond-float64": ("above", torch.tensor([5.0]), 10**400),
    # still compared on the device: every int32 is a float64
    "int32-float": ("above", torch.tensor([2**31 - 1], dtype=torch.int32), 2147483646.5),
    "float32-float": ("equal", torch.tensor([0.1]), 0.1),
}


@pytest.fixture(scope="module")
def modules(tmp_path_factory):
    return import_both(tmp_path_factory.mktemp("host_comparisons"), "host_comparisons", SOURCE)


def _compiled(function, *args):
    torch._dynamo.reset()
    counter = CompileCounter()
    return torch.compile(function, backend=counter)(*args), counter.frame_count


ROUNDED = pytest.mark.xfail(
    strict=True,
    reason="an int64 host value is compared with a float in float64, which rounds 2**53 + 1 "
    "to 2**53; read on the host instead, a lowered guard's test (assert n.max().item() <= "
    "5.0) fails the compile (test_trap.py, host_read)",
)


@pytest.mark.parametrize(
    "case",
    [pytest.param(case, marks=ROUNDED if case.startswith("int64-above") else ()) for case in CASES],
)
def test_a_host_value_compares_as_python_does(modules, case):
    plain, mended = modules
    name, x, limit = CASES[case]
    expected, plain_graphs = _compiled(getattr(plain, name), x, limit)
    result, graphs = _compiled(getattr(mended, name), x, limit)
    assert torch.equal(expected, getattr(plain, name)(x, limit))
    assert torch.equal(result, expected)
    assert graphs <= plain_graphs


AGAINST_A_TENSOR = """
def against_a_tensor(x, y):
    h = x * 2
    if int(x.argmax()) < y[0, 0]:  # a host read compared with a tensor: on the host
        h = h[:1]
    else:
        h = h + 1
    return h * 3

def int_of_a_float(x):
    h = x * 2
    if int(x.max()) > 1:  # int() of a float: on the host (NaN and inf raise)
        h = h[:1]
    else:
        h = h + 1
    return h * 3
"""


def _break_lines(function, *args) -> list[tuple[str, int]]:
    torch._dynamo.reset()
    explained = torch._dynamo.explain(function)(*args)
    return [
        (frame.filename, frame.lineno)
        for frame in (reason.user_stack[-1] for reason in explained.break_reasons)
    ]


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("against_a_tensor", (torch.tensor([[0.5, 0.25]]), torch.tensor([[3.0]]))),
        ("int_of_a_float", (torch.tensor([[0.5, 2.25]]),)),
    ],
)
def test_a_host_read_made_on_the_host_after_all_breaks_at_the_users_read(load_both, name, args):
    """Where the runtime reads on the host after all, the graph broke inside it (at
    ``runtime/conditions.py``), the rest of its function run in Python: the break is
    the original's, at the user's read (the continuation may remove the original's
    jump on the comparison with a tensor after it)."""
    plain, mended = load_both(AGAINST_A_TENSOR)
    expected = _break_lines(getattr(plain, name), *args)
    lines = _break_lines(getattr(mended, name), *args)
    assert lines and len(lines) <= len(expected)
    assert {line for _, line in lines} <= {line for _, line in expected}
    assert all(filename == mended.__file__ for filename, _ in lines)


HELD = """
import torch


class Held:
    def __init__(self):
        self.value = torch.tensor(0.1, dtype=torch.float64)

    def item(self):  # an object's own item(), which gives a tensor
        return self.value


held = Held()


def below(x, y):
    h = x * 2
    if held.item() < y[0, 0]:
        h = h[:1]  # shapes differ: the choice is made on the host
    else:
        h = h + 1
    return h
"""


def test_a_tensor_an_objects_item_gives_is_compared_as_the_original_compares_it(load_both):
    """The float64 tensor an object's ``item()`` gives was read with ``.item()`` and the
    Python float compared with a float32 tensor, which rounds it to float32 (0.1 < 0.1f
    false); the original compares the two tensors in float64 (true): the compiled call
    took the other branch."""
    plain, mended = load_both(HELD)
    x, y = torch.ones(2, 2), torch.tensor([[0.1]])
    expected = plain.below(x, y)
    result, graphs = _compiled(mended.below, x, y)
    assert torch.equal(result, expected)
    assert graphs <= _compiled(plain.below, x, y)[1]


#: What a host read reads, and how (the read on the left of the comparison).
READS = ["a.item()", "float(a)", "int(a)", "bool(a)", "held.item()"]
#: What it is compared with.
OTHERS = ["b[0]", "float(b[0])", "c", "b[0].item()"]
SYMBOLS = ["<", "<=", ">", ">=", "==", "!="]
#: Arms that merge (the comparison made on the device), and arms of other shapes (the
#: choice made on the host after all).
ARMS = {"merged": ("h * 2", "h + 1"), "on the host": ("h[:1]", "h + 1")}
DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int32, torch.int64]
VALUES = [0.1, 1 / 3, -0.0, 0.5, 2.0, 3.0, 2.0**24 + 1, -7.0, float("nan"), float("inf")]


class _Held:
    """An object whose own ``item()`` gives a tensor (the original compares it as one)."""

    def __init__(self) -> None:
        self.value = torch.tensor(0.0)

    def item(self) -> torch.Tensor:
        return self.value


def _choosing(test: str, arms: str) -> str:
    then, otherwise = ARMS[arms]
    return (
        "import torch\n\n"
        "def f(a, b, c, held):\n"
        "    h = b * 1\n"
        f"    if {test}:\n"
        f"        h = {then}\n"
        "    else:\n"
        f"        h = {otherwise}\n"
        "    return h\n"
    )


#: A guard's forms: an assert's message that formats a number it is given keeps the
#: guard in Python where the number is pinned (README, Known limits), the rest lowered.
GUARDS = {
    "assert": "assert not ({test}), 'bad'",
    "assert formatting c": "assert not ({test}), f'bad {{c}}'",
    "raise": "if {test}:\n        raise ValueError('bad')",
}


def _guarding(test: str, form: str) -> str:
    guard = GUARDS[form].format(test=test)
    return f"import torch\n\ndef f(a, b, c, held):\n    h = b * 1\n    {guard}\n    return h * 2\n"


def _chooses_as_the_original(
    source: str, arguments: tuple[object, ...], rewrites: frozenset[str] = frozenset({"predicate"})
) -> None:
    """The function ``f`` of ``source``, rewritten and compiled, gives what the original
    gives eagerly, or raises the same kind of error (or what plain compile gives: an
    assert TorchDynamo turns into ``torch._assert_async`` itself raises a
    ``RuntimeError``), and compiles no more graphs, nor gives up more frames, than the
    original compiled."""
    original = run_as_module(compile(source, "<host read>", "exec"), "gm_plain_read")["f"]
    result = rewrite(source, "<host read>", set(rewrites))
    mended = run_as_module(compile_module(result.tree, "<host read>"), "gm_read")["f"]
    expected, _ = _outcome(original, arguments, compiled=False)
    plain, plain_graphs = _outcome(original, arguments, compiled=True)
    outcome, graphs = _outcome(mended, arguments, compiled=True)
    assert bitwise_equal(outcome, expected) or bitwise_equal(outcome, plain), source
    assert all(map(int.__le__, graphs, plain_graphs)), source


def _outcome(
    function: Callable[..., Any], arguments: tuple[object, ...], compiled: bool
) -> tuple[object, tuple[int, int]]:
    """What ``function(*arguments)`` gives (an error by its type and, but for torch's
    own, its message), and how many graphs it compiled and frames it gave up
    (``compiled``: under the eager backend, from a clean TorchDynamo state)."""
    counter = CompileCounter()
    if compiled:
        torch._dynamo.reset()
        counters.clear()
        function = torch.compile(function, backend=counter)
    try:
        outcome = function(*arguments)
    except (AssertionError, OverflowError, RuntimeError, ValueError) as error:  # int(nan)
        outcome = (type(error), str(error) if type(error) is not RuntimeError else "")
    frames = counters["frames"]
    return outcome, (counter.frame_count, frames["total"] - frames["ok"])


def _tensor_of(value: float, dtype: torch.dtype) -> torch.Tensor | None:
    """``value`` as a one-element tensor of ``dtype``; ``None`` where it has no such
    value (NaN or infinity of an integer dtype)."""
    if not dtype.is_floating_point and (value != value or abs(value) == float("inf")):
        return None
    return torch.tensor([value]).to(dtype)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    read=st.sampled_from(READS),
    symbol=st.sampled_from(SYMBOLS),
    other=st.sampled_from(OTHERS),
    arms=st.sampled_from(sorted(ARMS)),
    values=st.tuples(*[st.sampled_from(VALUES)] * 3),
    dtypes=st.tuples(*[st.sampled_from(DTYPES)] * 3),
    python_other=st.sampled_from([0, 1, 3, 0.1, 2.5, -0.0, 2**24 + 1]),
)
def test_a_comparison_of_a_host_read_compiled_chooses_as_the_original(
    read, symbol, other, arms, values, dtypes, python_other
):
    """Compiled under GraphMend, a comparison of a host read (of a tensor, or an object's
    own ``item()`` giving one) with a number, a tensor or another host read, of any
    dtype, chooses what the original chooses, merged on the device or on the host."""
    a, b, held_value = (
        _tensor_of(value, dtype) for value, dtype in zip(values, dtypes, strict=True)
    )
    assume(a is not None and b is not None and held_value is not None)
    held = _Held()
    held.value = held_value.reshape(())
    _chooses_as_the_original(
        _choosing(f"{read} {symbol} {other}", arms), (a, b, python_other, held)
    )


#: Tests that read tensors on the host otherwise: kept on the device by GraphMend
#: (torch.equal, torch.allclose, a search), their truth taken, in and/or.
TESTS = [
    "torch.equal(a, b)",
    "not torch.equal(a, b)",
    "torch.allclose(a, b)",
    "torch.allclose(a, b, rtol=0, atol=c)",
    "torch.allclose(a, b, 0.5, 0.0, True)",
    "c in a",
    "c not in a",
    "torch.equal(a, b) or c > 1",
    "c > 1 and torch.equal(a, b)",
    "bool(a[0]) and c > 0",
    "not a[0].item()",
    "a[0].item() and b[0].item()",
    "c < a[0].item() <= 3",
    "float(a[0]) > c or float(b[0]) < c",
    "float(a[0]) != b[0] and torch.equal(a, b)",
    "not float(a[0]) != b[0]",
]


#: Two rows of one or two values, and the numbers the tests compare with.
ROWS = st.tuples(*[st.lists(st.sampled_from(VALUES), min_size=1, max_size=2)] * 2)
NUMBERS = st.sampled_from([0, 1, 3, 0.1, 0.5, -0.0, float("nan")])


def _tensors(rows: tuple[list[float], ...], dtypes: tuple[torch.dtype, ...]) -> list[torch.Tensor]:
    """A tensor of each of ``rows`` in its dtype; the example is dropped where a value
    has none in its dtype (NaN of an integer dtype)."""
    tensors = []
    for row, dtype in zip(rows, dtypes, strict=True):
        elements = [_tensor_of(value, dtype) for value in row]
        assume(all(element is not None for element in elements))
        tensors.append(torch.cat(elements))  # type: ignore[arg-type]
    return tensors


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    test=st.sampled_from(TESTS),
    arms=st.sampled_from(sorted(ARMS)),
    rows=ROWS,
    dtypes=st.tuples(*[st.sampled_from(DTYPES)] * 2),
    c=NUMBERS,
)
def test_a_test_reading_tensors_compiled_chooses_as_the_original(test, arms, rows, dtypes, c):
    """The same for tests that read tensors otherwise (``torch.equal``,
    ``torch.allclose``, a search of a tensor for a number, truth of a host read, in
    ``and``/``or`` and chained), tensors of one or two elements of any dtype."""
    a, b = _tensors(rows, dtypes)
    _chooses_as_the_original(_choosing(test, arms), (a, b, c, _Held()))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    test=st.sampled_from(TESTS + [f"a[0].item() {symbol} c" for symbol in SYMBOLS]),
    form=st.sampled_from(sorted(GUARDS)),
    rows=ROWS,
    dtypes=st.tuples(*[st.sampled_from(DTYPES)] * 2),
    c=NUMBERS,
)
def test_a_guard_reading_tensors_compiled_raises_as_the_original(test, form, rows, dtypes, c):
    """The same tests as guards GraphMend lowers (``assert``, ``if ...: raise``)."""
    a, b = _tensors(rows, dtypes)
    _chooses_as_the_original(_guarding(test, form), (a, b, c, _Held()), frozenset({"trap"}))


@pytest.mark.parametrize(
    "b",
    [torch.tensor([0.1], dtype=torch.float16), torch.tensor([0.1], dtype=torch.bfloat16).float()],
    ids=["holds", "fails"],
)
def test_an_assert_torchdynamo_lowers_itself_is_lowered_by_it_where_kept(b):
    """``assert not (not <test>)``: Python folds both ``not`` into the assert's jump, one
    if true, which TorchDynamo turns into ``torch._assert_async`` itself.  Taken for a
    jump GraphMend moved to the device, the guard kept in Python broke the graph there:
    3 graphs against 2 (found by the property above)."""
    a = torch.tensor([0.1], dtype=torch.bfloat16)
    _chooses_as_the_original(
        _guarding("not float(a[0]) != b[0]", "assert"), (a, b, 0, _Held()), frozenset({"trap"})
    )


def test_an_objects_own_read_is_not_read_again_as_written(load_both):
    """An object's own ``item()`` is no read of a tensor: the original does not break
    there, and the analysis does not restart to read it as written."""
    plain, mended = load_both(HELD)
    x, y = torch.ones(2, 2), torch.tensor([[0.1]])
    fallbacks.clear()
    result, _ = _compiled(mended.below, x, y)
    assert torch.equal(result, plain.below(x, y))
    reasons = [record.reason for record in fallbacks.records()]
    assert reasons and not any("reads where the original reads first" in r for r in reasons)
