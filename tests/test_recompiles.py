"""A failed attempt leaves no guard behind: the frame recompiles no more often than
under plain ``torch.compile``.

T1 traces both arms of an ``if``, and continuation the rest of the function under
both outcomes, before the original ``if`` may run instead.  What a failed attempt
read (an attribute such as a cache length) would otherwise stay guarded in the frame
before the break, which plain compile never traced there: every new value compiles
that frame again (phi-1.5's rotary cache length in ``generate``: 22 graphs against
plain's 18).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch._dynamo.testing import CompileCounter
from torch._dynamo.utils import counters

from graphmend.runtime import fallbacks
from helpers.modules import import_both

SOURCE = """
import math

import torch
from torch import nn


class UntracableArm(nn.Module):
    '''T1: the untaken arm reads an attribute, then fails to trace (no such shape).'''

    def __init__(self):
        super().__init__()
        self.rows = 3

    def forward(self, x):
        if x.sum() > 0:
            y = x.reshape(self.rows, 5)
        else:
            y = x * 2
        return y + 1


class UnmergeableArms(nn.Module):
    '''T1: both arms trace, the untaken one reading an attribute, but their results
    cannot be merged (float64 against float32), nor by torch.cond.'''

    def __init__(self):
        super().__init__()
        self.rows = 3

    def forward(self, x):
        if x.sum() > 0:
            y = (x * self.rows).to(torch.float64)
        else:
            y = x * 2
        return y + 1


class Cache(nn.Module):
    def __init__(self):
        super().__init__()
        self.length = 0

    def forward(self, x):
        if x.shape[0] > self.length:
            self.length = x.shape[0]
        return x


class CacheInTheRest(nn.Module):
    '''Continuation: the rest of forward stores an attribute, which torch.cond cannot
    capture, after reading it.'''

    def __init__(self):
        super().__init__()
        self.cache = Cache()

    def forward(self, x, mask):
        if mask is not None and torch.any(~mask):
            mask = mask
        else:
            mask = None
        y = self.cache(x) * 2
        if mask is not None:
            y = y.masked_fill(mask, 0)
        return y


class SlicesByArgument(nn.Module):
    '''T1: only the arm never taken reads the int argument n.'''

    def forward(self, x, n):
        if x.sum() > 0:
            y = x[:n]
        else:
            y = x[:2]
        return y + 1


class ScalesByArgument(nn.Module):
    '''T1, torch.cond: only the arm never taken reads the float argument t.'''

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x, t):
        if x.sum() > 0:
            y = self.linear(x) * t
        else:
            y = x - 1
        return y + 1


class MaskOrSlice(nn.Module):
    '''Continuation (None against a tensor): only the branch never taken reads n.'''

    def forward(self, x, n):
        m = x > 0
        if m.all():
            m = None
            y = x[:n]
        else:
            y = x[:2]
        if m is None:
            return y * 2
        return y + 1


class ScalesByAttribute(nn.Module):
    '''T1: only the arm never taken reads the float attribute scale.'''

    def __init__(self):
        super().__init__()
        self.scale = 0.5

    def forward(self, x):
        if x.sum() > 0:
            y = x * self.scale
        else:
            y = x - 1
        return y + 1


class DropoutInTheRest(CacheInTheRest):
    '''Continuation: the rest of the function reads a submodule's number (the dropout's
    p) under either outcome, as the original does whichever branch it takes.'''

    def __init__(self):
        super().__init__()
        self.cache = nn.Dropout(0.0)


class DropsOutInAnArm(nn.Module):
    '''T1: an arm calls a dropout, whose training flag the purity check reads.'''

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        h = self.lin(x)
        if h.sum() > 0:
            y = self.drop(h)
        else:
            y = h * 2
        return y + 1


class ScalesByPi(nn.Module):
    '''T1: only the arm never taken reads math.pi, a constant of another module.'''

    def forward(self, x):
        if x.sum() > 0:
            y = x * math.pi
        else:
            y = x - 1
        return y + 1


class ScalesByItem(nn.Module):
    '''T1: only the arm never taken reads the first of the numbers it is given.'''

    def forward(self, x, scales):
        if x.sum() > 0:
            y = x * scales[0]
        else:
            y = x - 1
        return y + 1


class ActivationByName(nn.Module):
    '''T1: only the arm never taken reads the str argument act.'''

    def forward(self, x, act):
        if x.sum() > 0:
            y = x + 1 if act is None else x - 1
        else:
            y = x * 3
        return y


class GuardNamesArgument(nn.Module):
    '''T3: only the message of a guard that never fires reads n.'''

    def forward(self, x, n):
        if (x < -10).any():
            raise ValueError(f"too small at step {n}")
        return x + 1


class MaskWhenPaddedOrCached(nn.Module):
    '''ChatGLM's mask condition: the right side of its or reads the cache, which the
    original reads only when the mask has no padding.'''

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def get_masks(self, x, past, mask):
        full = torch.ones(x.shape[0], x.shape[1], x.shape[1])
        if past:
            full = torch.cat((torch.ones(x.shape[0], x.shape[1], past[0].shape[1]), full), -1)
        return full * mask.unsqueeze(1)

    def forward(self, x, mask, past=None):
        seq = x.shape[1]
        full = None
        if (mask is not None and not mask.all()) or (past and seq != 1):
            full = self.get_masks(x, past, mask)
        h = self.proj(x)
        if past is not None:
            h = torch.cat((past[0], h), 1)
        return h if full is None else h * full.sum(), (h,)


class AllOnesOrLarge(nn.Module):
    '''Bamba's mamba mask condition, the mask read before it: the right side of its or
    guards only a global (torch.all is the builtin) and what the frame has read already.'''

    def forward(self, x, mask):
        h = x * mask
        if x.sum() > 100 or torch.all(mask == 1):
            kept = None
        else:
            kept = mask
        print("all ones", kept is None)  # torch.cond cannot capture the rest
        if kept is not None:
            h = h * kept
        return h


class Meter:
    def __init__(self):
        self.reads = 0

    def item(self):
        self.reads += 1
        return 2.0


class ComparedWithAnObjectsItem(nn.Module):
    '''The other side is an object's own item(), which counts its calls.'''

    def __init__(self):
        super().__init__()
        self.meter = Meter()

    def forward(self, x):
        h = x * 2
        if x.sum().item() > self.meter.item():
            h = torch.cat([h, h])
        return h


class CloseAfterABreak(nn.Module):
    '''torch.allclose first thing after a break: plain compile's frame breaks there with
    nothing computed, so it compiles no graph.'''

    def forward(self, x, y, t):
        h = x * 2
        torch._dynamo.graph_break()
        assert torch.allclose(x, y, atol=t), "not close"
        return h + 1


class AssertsARead(nn.Module):
    '''The guard keeps its break (its message formats a number it is given), and the
    frame resumed after its read is compiled again for a new value, which TorchDynamo
    then holds as a symbolic float.'''

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x, y, t):
        h = self.lin(x)
        assert h.mean().item(), f"zero mean at {t}"
        if float(y.max()):
            h = h * 2
        return h


class ReadAgainBeforeAnEqual(nn.Module):
    '''Two reads, then torch.equal left of an or with a host read on its right, then a
    loop that gives the frame up: the frames resumed after the reads compile again for
    new values.'''

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.seen = 0

    def bump(self):
        self.seen += 1
        return self.seen % 2 == 0

    def forward(self, x, y, t):
        h = self.lin(x)
        h = h * 2 if int(x.argmax()) <= h.abs().max().item() or self.bump() else h - 1
        if torch.equal(x.long(), y.long()) or float(y.sum()) > t:
            h = h.t()
        for _ in range(3):
            if h.sum() > 0:
                break
            h = h + 1
        return h


class ComparesTwoReads(nn.Module):
    '''Two reads compared in a guard that keeps its break (its message formats a number
    it is given): the frame resumed after the first read reads the second at once.'''

    def forward(self, x, y, t):
        h = x + y
        assert (x * y).sum().item() >= x[0, 0].item(), f"bad {t}"
        return h


class EqualRightOfAComparedRead(nn.Module):
    '''A read compared with a tensor, and torch.equal right of it, in a guard that keeps
    its break: the frame resumed after the jump on the comparison reads torch.equal by
    the jump on it.'''

    def forward(self, x, y, t):
        h = x + y
        assert float(x.mean()) != y.sum() and torch.equal(x, y), f"bad {t}"
        return h


CALLS = {}


class TensorCounter:
    '''item() gives a tensor, and counts its calls in a global.'''

    def __init__(self):
        self.value = torch.tensor(0.25)

    def item(self):
        CALLS["item"] = CALLS.get("item", 0) + 1
        return self.value


class AssertsAnObjectsTensor(nn.Module):
    '''An assert on the tensor an object's item() gives, between two breaks, its message
    formatting a float: the guard stays in Python (the count waits for the graph's end),
    and the frame compiles again on every call, as plain compile's does.'''

    def __init__(self):
        super().__init__()
        self.counter = TensorCounter()

    def forward(self, x, y, t):
        h = x + y
        torch._dynamo.graph_break()
        assert self.counter.item(), f"bad {t}"
        torch._dynamo.graph_break()
        return h + 1


class AssertsNotAComparedRead(nn.Module):
    '''An assert whose test, not of a read compared with a tensor, jumps on that tensor
    as written (its message formats a number it is given).'''

    def forward(self, x, y, t):
        h = x + y
        assert not float(x.double().sum()) != y.sum(), f"bad {t}"
        return h


def positive(v):
    CALLS["positive"] = CALLS.get("positive", 0) + 1
    return v.sum() > 0


class AssertsTwoReadsAndACall(nn.Module):
    '''Two reads compared, and a call that counts itself right of them: the assert's
    truth is taken by its jump on what the call gives.'''

    def forward(self, x, y, t):
        h = x * 2
        assert not (x * y).sum().item() == y.sum().item() and positive(h), f"bad {t}"
        return h


class EqualOrAMethod(nn.Module):
    '''torch.equal left of an or whose right side, a method, is not evaluated ahead of
    time: the left side's truth is read on the host at once.'''

    def __init__(self):
        super().__init__()
        self.seen = 0

    def bump(self):
        self.seen += 1
        return self.seen % 2 == 0

    def forward(self, x, y):
        h = x + y
        torch._dynamo.graph_break()
        assert torch.equal(x, y) or self.bump(), "not equal"
        return h + 1
"""

#: A comparison of a host read whose other side is a Python float, read by the original
#: only after its break at float(), where the rest of the frame is given up: on its own,
#: and on the right of an and whose left side is a Python value.
COMPARED_AFTER_ITS_READ = """

class {name}(nn.Module):
    def forward(self, x, t):
        h = x * 2
        if {test}:
            h = h * 2
        else:
            h = h[:1]
        for _ in range(3):
            if h.sum() > 1.0:
                break
            h = h + 1
        return h
"""
SOURCE += COMPARED_AFTER_ITS_READ.format(name="ComparedAfterItsRead", test="float(x.mean()) < t")
SOURCE += COMPARED_AFTER_ITS_READ.format(
    name="ComparedRightOfAnAnd", test="x is not None and float(x.mean()) < t"
)


@pytest.fixture(scope="module")
def modules(tmp_path_factory: pytest.TempPathFactory):
    directory: Path = tmp_path_factory.mktemp("recompiles")
    return import_both(directory, "recompiles", SOURCE)


def _untracable_arm(module) -> tuple[int, list[torch.Tensor]]:
    return _arm_reading_rows(module.UntracableArm())


def _unmergeable_arms(module) -> tuple[int, list[torch.Tensor]]:
    return _arm_reading_rows(module.UnmergeableArms())


def _arm_reading_rows(model) -> tuple[int, list[torch.Tensor]]:
    counter = CompileCounter()
    compiled = torch.compile(model, backend=counter)
    results = []
    for rows in range(4):
        model.rows = rows  # read only by the arm that is never taken
        results.append(compiled(-torch.ones(4, 4)))
    return counter.frame_count, results


def _cache_in_the_rest(module) -> tuple[int, list[torch.Tensor]]:
    model = module.CacheInTheRest()
    counter = CompileCounter()
    compiled = torch.compile(model, backend=counter)
    results = []
    x, mask = torch.ones(4, 4), torch.ones(4, 4, dtype=torch.bool)
    for length in range(4):
        model.cache.length = length  # a new value at each call, as a growing cache
        results.append(compiled(x, mask))
    return counter.frame_count, results


@pytest.mark.parametrize("case", [_untracable_arm, _unmergeable_arms, _cache_in_the_rest])
def test_a_failed_attempt_leaves_no_guard_behind(modules, case) -> None:
    plain, mended = modules
    torch._dynamo.reset()
    with torch.no_grad():
        plain_graphs, expected = case(plain)
    torch._dynamo.reset()
    fallbacks.clear()
    with torch.no_grad():
        graphs, results = case(mended)
    assert graphs == plain_graphs
    for result, want in zip(results, expected, strict=True):
        assert torch.equal(result, want)
    assert fallbacks.records(), "the site ran its original code, and says why"


@pytest.mark.parametrize(
    ("name", "values"),
    [
        ("SlicesByArgument", (1, 2, 3)),
        ("ScalesByArgument", (0.5, 0.25, 0.75)),
        ("MaskOrSlice", (1, 2, 3)),
        ("GuardNamesArgument", (1, 2, 3)),
        ("ScalesByItem", ((0.5, 1.0), (0.25, 1.0), (0.75, 1.0))),
        ("ActivationByName", ("gelu", "relu", "tanh")),  # a str given
        ("GuardNamesArgument", ("layer1", "layer2", "layer3")),
    ],
)
def test_an_arm_never_taken_guards_no_number_or_text_argument(modules, name, values) -> None:
    """Tracing an arm plain compile never takes must not guard on the value of a number
    argument only that arm reads: the frame would compile again for each new value
    (one graph more than plain), and a recompile fails under ``error_on_recompile``."""
    plain, mended = modules
    runs = []
    for module in (plain, mended):
        torch._dynamo.reset()
        counter = CompileCounter()
        compiled = torch.compile(getattr(module, name)(), backend=counter)
        with torch.no_grad(), torch._dynamo.config.patch(error_on_recompile=True):
            results = [compiled(-torch.ones(4, 4), value) for value in values]
        runs.append((counter.frame_count, results))
    (plain_graphs, expected), (graphs, results) = runs
    assert graphs == plain_graphs
    for result, want in zip(results, expected, strict=True):
        assert torch.equal(result, want)


def test_an_arm_never_taken_guards_no_number_attribute(modules) -> None:
    """The same for an attribute the caller changes between calls (a schedule)."""
    plain, mended = modules
    runs = []
    for module in (plain, mended):
        torch._dynamo.reset()
        model = module.ScalesByAttribute()
        counter = CompileCounter()
        compiled = torch.compile(model, backend=counter)
        results = []
        with torch.no_grad(), torch._dynamo.config.patch(error_on_recompile=True):
            for value in (0.5, 0.25, 0.75):
                model.scale = value
                results.append(compiled(-torch.ones(4, 4)))
        runs.append((counter.frame_count, results))
    (plain_graphs, expected), (graphs, results) = runs
    assert graphs == plain_graphs
    for result, want in zip(results, expected, strict=True):
        assert torch.equal(result, want)


def test_an_arm_never_taken_that_reads_a_module_constant_is_merged(modules) -> None:
    """Globals are not followed: ``math.pi`` never changes between calls."""
    plain, mended = modules
    x = -torch.ones(4, 4)
    torch._dynamo.reset()
    counter = CompileCounter()
    with torch.no_grad():
        result = torch.compile(mended.ScalesByPi(), backend=counter)(x)
    assert torch.equal(result, plain.ScalesByPi()(x))
    assert counter.frame_count == 1


def test_a_submodule_number_read_under_both_outcomes_is_continued(modules) -> None:
    """Numbers reached through a module's submodules are not followed (phi-1.5's
    ``self.drop.p``, read by the rest of the function whichever branch runs)."""
    plain, mended = modules
    x, mask = torch.ones(4, 4), torch.eye(4, dtype=torch.bool)
    torch._dynamo.reset()
    counter = CompileCounter()
    with torch.no_grad():
        model = mended.DropoutInTheRest().eval()
        result = torch.compile(model, backend=counter)(x, mask)
    assert torch.equal(result, plain.DropoutInTheRest().eval()(x, mask))
    assert counter.frame_count == 1


@pytest.mark.parametrize("dynamic", [None, True])
def test_a_declined_submodule_check_leaves_no_training_guard(modules, dynamic) -> None:
    """The check that an arm's submodule is pure reads its training flag; where the site
    then keeps its break (autograd records; under ``dynamic=True`` the dropout's ``p``
    would be pinned), TorchDynamo's guard on that flag stayed in the frame before the
    break, which plain compile's never reads there: each ``model.train()`` or
    ``eval()`` compiled that frame again (5 graphs against plain's 4)."""
    runs = []
    for module in modules:
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = module.DropsOutInAnArm()
        counter = CompileCounter()
        compiled = torch.compile(model, backend=counter, dynamic=dynamic)
        results = []
        for sign, training in ((-1, False), (1, True), (-1, False), (1, True)):
            model.train(training)
            torch.manual_seed(1)
            with torch.set_grad_enabled(dynamic is None):
                results.append(compiled(sign * torch.ones(3, 4)).detach())
        runs.append((counter.frame_count, results))
    (plain_graphs, expected), (graphs, results) = runs
    assert graphs <= plain_graphs
    assert all(map(torch.equal, results, expected))


def test_a_right_side_evaluated_ahead_of_time_leaves_no_guard_behind(modules) -> None:
    """The right side of an ``or`` evaluated ahead of time read the cache (its sizes
    guarded), and the site then kept its break (a method its branch calls is no
    submodule): the frame before the break recompiled as the cache grew, which plain
    compile's never guards (ChatGLM2 decoding on torch 2.5: 8 graphs against 7; found by
    helper hreal2).  That side is then read by the original's jump."""
    runs = []
    for module in modules:
        torch._dynamo.reset()
        counter = CompileCounter()
        torch.manual_seed(0)
        compiled = torch.compile(module.MaskWhenPaddedOrCached(), backend=counter)
        x, mask, past = torch.ones(2, 8, 4), torch.ones(2, 8), None
        mask[1, :3] = 0  # left padding: the left side is true, and stays so
        results = []
        with torch.no_grad():
            for _ in range(4):  # a prompt, then three steps with a cache one longer each
                out, past = compiled(x, mask, past)
                results.append(out)
                x, mask = torch.ones(2, 1, 4), torch.cat((mask, torch.ones(2, 1)), 1)
        runs.append((counter.frame_count, results))
    (plain_graphs, expected), (graphs, results) = runs
    assert graphs <= plain_graphs
    assert all(map(torch.equal, results, expected))


def test_a_right_side_evaluated_ahead_of_time_guarding_only_globals_is_kept(modules, capsys):
    """A guard the right side's speculation installs on a global (``torch.all`` is the
    builtin) holds whatever the call: the speculation stays, as one jump on the
    condition.  Taken as a reason to read that side by the original's jumps, the frame
    resumed after each compiled the rest, which plain compile runs in Python (3 graphs
    against 2)."""
    runs = []
    for module in modules:
        torch._dynamo.reset()
        counter = CompileCounter()
        compiled = torch.compile(module.AllOnesOrLarge(), backend=counter)
        calls = [([1.0, 2.0], [1.0, 1.0]), ([1.0, 2.0], [1.0, 0.0]), ([1.0, 200.0], [1.0, 0.0])]
        with torch.no_grad():
            results = [compiled(torch.tensor(x), torch.tensor(mask)) for x, mask in calls]
        runs.append((counter.frame_count, results, capsys.readouterr().out))
    (plain_graphs, expected, printed), (graphs, results, printed_mended) = runs
    assert graphs <= plain_graphs
    assert printed_mended == printed
    assert all(map(torch.equal, results, expected))


_CLOSE = torch.tensor([[0.5, 0.25], [1.25, -2.0]])
_NEAR = _CLOSE + 1e-4
_ROWS = [
    torch.tensor([[-2.0, 2.0, 0.75, 1.75], [-1.75, -1.75, -0.75, -0.25]]),
    torch.tensor([[-1.75, 1.5, -0.75, 1.0], [-1.0, -0.75, -2.0, 0.25]]),
    torch.tensor([[0.75, -1.5, 0.5, 1.0], [-0.25, 0.5, 1.0, 1.25]]),
]
_LIMITS = (0.001, 2.0, 2.0)
_PAIRS = [
    (
        torch.tensor([[-1.0, 1.75, 1.75, -1.25], [-0.5, -0.25, 0.5, -1.75]]),
        torch.tensor([[-1.25, 1.75, 1.5, 1.75], [1.25, 1.25, -1.5, -0.75]]),
        0.0,
    ),
    (
        torch.tensor([[0.25, -0.5, -1.75, 1.75], [-1.0, 0.75, 1.5, -0.5]]),
        torch.tensor([[0.25, -0.5, -1.75, 1.75], [-1.0, 0.75, 1.5, -0.5]]),
        0.5,
    ),
    (
        torch.tensor([[-0.5, -0.25, -1.25, -1.75], [-1.75, -0.5, 0.5, -1.75]]),
        torch.tensor([[0.75, 1.0, -1.25, 1.25], [-0.75, 2.0, 1.75, -0.75]]),
        1.0,
    ),
    (
        torch.tensor([[-1.0, -0.5, 0.25, 0.25], [1.75, 0.75, 0.25, -0.5]]),
        torch.tensor([[0.5, -1.75, 0.25, 1.0], [1.25, 1.0, -0.75, 1.5]]),
        1.0,
    ),
]


@pytest.mark.parametrize(
    ("name", "calls"),
    [
        ("ComparedAfterItsRead", [(_CLOSE, t) for t in (1.0, 0.0, 2.0)]),
        ("ComparedRightOfAnAnd", [(_CLOSE, t) for t in (1.0, 0.0, 2.0)]),
        ("ComparedWithAnObjectsItem", [(_CLOSE,), (_NEAR,), (-_CLOSE,)]),
        ("CloseAfterABreak", [(_CLOSE, _NEAR, t) for t in (0.5, 0.0, 1.0)]),
        ("AssertsARead", [(_CLOSE + t, _CLOSE, t) for t in (1.0, 2.0, 3.0, 4.0)]),
        ("EqualOrAMethod", [(_CLOSE, _CLOSE), (_NEAR, _NEAR), (_CLOSE, _CLOSE), (_CLOSE, _NEAR)]),
        ("ReadAgainBeforeAnEqual", [(x, x, t) for x, t in zip(_ROWS, _LIMITS, strict=True)]),
        ("ComparesTwoReads", _PAIRS),
        ("EqualRightOfAComparedRead", _PAIRS),
        ("AssertsAnObjectsTensor", _PAIRS),
        ("AssertsNotAComparedRead", _PAIRS),
        ("AssertsTwoReadsAndACall", _PAIRS),
    ],
)
def test_what_a_condition_reads_after_its_first_host_read_is_read_after_the_break(
    modules, name, calls
) -> None:
    """Where the choice is made on the host after all, the original breaks at its first
    host read and reads the rest of the condition in the frame it resumes.  Evaluated
    ahead, on the device, that rest was guarded in the frame before the break (a new
    ``t`` compiled it again, so did the object's count), or computed in a graph plain
    compile's frame does not have (``isclose``, ``eq``): 2, 3, 3 and 3 graphs against
    plain's 1, 1, 2 and 2 (helper hgen6's h6, h1 and h3; fuzz seed 77).  And the truth
    of a read TorchDynamo holds as a symbolic float, taken by ``not``, was a graph
    break: 5 graphs against 4 (fuzz seed 231).  Reading at the choice where a recompile
    did not guard more, the frame broke at a place of its own, whose resume function
    TorchDynamo gave up once more: 2 frames given up against 1 (fuzz seed 2067).  A
    second read, compared on the device with the first's value after its break, guarded
    that value in the resumed frame: 5 graphs against 3 (fuzz seed 2637).  A right side
    read by the original's jump, after the left side's, computed ``torch.equal`` on the
    device in a graph of its own before the jump on it: 4 graphs against 3 (fuzz seed
    3142).  An assert kept in Python computed its negation, and built its message, before
    it declined to lower the guard: each recompile made a graph where plain compile's
    frame had none, 6 against 2 (fuzz seed 3744)."""
    runs = []
    for module in modules:
        torch._dynamo.reset()
        counters.clear()
        counter = CompileCounter()
        torch.manual_seed(0)
        model = getattr(module, name)()
        compiled = torch.compile(model, backend=counter)
        results = []
        with torch.no_grad():
            for arguments in calls:
                try:
                    results.append(compiled(*arguments))
                except AssertionError as error:
                    results.append(str(error))
        reads = model.meter.reads if hasattr(model, "meter") else None
        given_up = counters["frames"]["total"] - counters["frames"]["ok"]
        runs.append((counter.frame_count, given_up, repr(results), reads))
    (plain_graphs, plain_given_up, *expected), (graphs, given_up, *observed) = runs
    assert observed == expected
    assert graphs <= plain_graphs and given_up <= plain_given_up
