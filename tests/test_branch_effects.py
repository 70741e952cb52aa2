"""A branch T1 traces to merge an ``if`` acts nowhere it is not taken.

Merged with ``torch.where``, both branches run; planning a ``torch.cond``, both are
traced into the graph.  What a branch does beyond computing, hidden from the static
checks behind a property, a method of the program's own named like a tensor's, or a
submodule's ``forward`` replaced on the instance, would then happen on every call:
a list appended to, output printed, random numbers drawn, an assert raising.  Each
such site keeps its original ``if`` (or continuation's ``torch.cond`` runs only the
taken branch).  Found by an adversarial review (helper halias).
"""

from __future__ import annotations

import contextlib
import io

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

from helpers.observe import same

SOURCE = """
import torch
from torch import nn

LOG = []


class Appends(nn.Module):
    @property
    def scale(self):
        LOG.append("scale read")
        return 2.0

    def forward(self, x):
        if x.sum() > 0:
            y = x * self.scale
        else:
            y = x * 3
        return y


class Tracker:
    def add(self, t):
        LOG.append("added")
        return t + 1


class MethodNamedLikeATensors(nn.Module):
    def __init__(self):
        super().__init__()
        self.tracker = Tracker()

    def forward(self, x):
        if x.sum() > 0:
            y = self.tracker.add(x)
        else:
            y = x * 3
        return y


class Draws(nn.Module):
    @property
    def noise(self):
        return torch.randn(3)

    def forward(self, x):
        if x.sum() > 0:
            y = x + self.noise
        else:
            y = x * 3
        return y + torch.randn(3)


class Asserts(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("temp", torch.tensor(-1.0))

    @property
    def temperature(self):
        assert (self.temp > 0).all(), "temperature must be positive"
        return self.temp

    def forward(self, x):
        if x.sum() > 0:
            y = x / self.temperature
        else:
            y = x * 3
        return y


class Announcer:
    def mul(self, t):
        print("scaling")
        return t * 2


class Prints(nn.Module):
    def __init__(self):
        super().__init__()
        self.scaler = Announcer()

    def forward(self, x):
        if x.sum() > 0:
            y = self.scaler.mul(x)
        else:
            y = x * 3
        return y


class ReplacedForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        original = self.lin.forward
        self.lin.forward = lambda x: original(x) + torch.rand(3)

    def forward(self, x):
        if x.sum() > 0:
            y = self.lin(x)
        else:
            y = x * 3
        return y
"""

CASES = ["Appends", "MethodNamedLikeATensors", "Draws", "Asserts", "Prints", "ReplacedForward"]


def _observe(module, name: str, backend: str) -> list:
    """Each call's result (or exception), the module's log and printed text, the next
    random number drawn after the calls, and the graphs compiled."""
    torch._dynamo.reset()
    module.LOG.clear()
    torch.manual_seed(0)
    model = getattr(module, name)().eval()
    counter = CompileCounterWithBackend(backend)
    compiled = torch.compile(model, backend=counter)
    seen = []
    for value in (-1.0, -1.0, 1.0, -1.0):
        printed = io.StringIO()
        with torch.no_grad(), contextlib.redirect_stdout(printed):
            try:
                result = compiled(torch.full((3,), value))
            except (AssertionError, RuntimeError) as error:
                # by message: a lowered assert raises eager's AssertionError where plain
                # compile's torch._assert_async raises RuntimeError
                result = f"raised: {str(error).splitlines()[0]}"
        seen.append((result, list(module.LOG), printed.getvalue()))
    seen.append(torch.rand(1))
    return [*seen, counter.frame_count]


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("name", CASES)
def test_a_branch_not_taken_acts_as_in_plain_compile(load_both, name, backend):
    plain, rewritten = load_both(SOURCE)
    expected = _observe(plain, name, backend)
    observed = _observe(rewritten, name, backend)
    *observed, graphs = observed
    *expected, plain_graphs = expected
    assert len(observed) == len(expected)
    for got, want in zip(observed, expected, strict=True):
        assert same(got, want), (got, want)
    assert graphs <= plain_graphs


CHANGED_BEFORE = """
import torch
from torch import nn

LOG = []


class Tracker:
    def add(self, t):
        LOG.append("added")
        return t + 1


class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.tracker = Tracker()

    def forward(self, x):
        LOG.append("forward")
        if x.sum() > 0:
            y = self.tracker.add(x)
        else:
            y = x * 3
        return y
"""


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_a_branch_changing_an_object_the_frame_changed_before_acts_as_plain(load_both, backend):
    """The object the branch appends to was appended to before it: compared by which
    objects changed, the branch's change went unseen (found by the review of 856c66e)."""
    plain, rewritten = load_both(CHANGED_BEFORE)
    observed = []
    for module in (plain, rewritten):
        module.LOG.clear()
        torch._dynamo.reset()
        compiled = torch.compile(module.M(), backend=backend)
        with torch.no_grad():
            results = [compiled(torch.full((3,), -1.0)) for _ in range(2)]
        observed.append((results, list(module.LOG)))
    assert same(observed[1], observed[0])


GRAD_MODE = """
import torch
from torch import nn


class Switch:
    def on(self, t):
        torch.set_grad_enabled(True)
        return t * 2


class Merged(nn.Module):
    def __init__(self):
        super().__init__()
        self.switch = Switch()

    def forward(self, x):
        if x.sum() > 0:
            y = self.switch.on(x)
        else:
            y = x * 3
        return y * (3.0 if torch.is_grad_enabled() else 5.0)


class Continued(nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            y = None
        else:
            y = x * 2
        if y is None:
            torch.set_grad_enabled(True)
            return x * 2
        return y * (3.0 if torch.is_grad_enabled() else 5.0)


class SetBack(nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            y = None
        else:
            y = x * 2
        if y is None:
            with torch.no_grad():
                z = x * 2
            return z
        return y * 3
"""


def _grad_modes(module, name: str, backend: str) -> list:
    """Each call's result and whether autograd records after it, from autograd off."""
    torch._dynamo.reset()
    compiled = torch.compile(getattr(module, name)(), backend=backend)
    seen = []
    try:
        for value in (-1.0, 1.0, -1.0):
            torch.set_grad_enabled(False)
            seen.append((compiled(torch.full((3,), value)), torch.is_grad_enabled()))
    finally:
        torch.set_grad_enabled(True)
    return seen


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("name", ["Merged", "Continued", "SetBack"])
def test_a_branch_setting_the_grad_mode_sets_it_only_where_taken(load_both, name, backend):
    """TorchDynamo applies ``set_grad_enabled`` while it traces: the other branch of a
    continuation's ``torch.cond`` was traced, and the rest of the frame compiled, in the
    mode the first left (-6 where the original gives -10, and autograd left on after
    calls that never turned it on; found by helper hcond).  A branch that sets the mode
    back (``with torch.no_grad():``) leaves it as it found it."""
    plain, rewritten = load_both(GRAD_MODE)
    expected = _grad_modes(plain, name, backend)
    observed = _grad_modes(rewritten, name, backend)
    assert len(observed) == len(expected)
    for (got, got_mode), (want, want_mode) in zip(observed, expected, strict=True):
        assert torch.equal(got, want) and got_mode == want_mode
