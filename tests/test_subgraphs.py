"""Sites in the body of a higher-order operator the program calls itself (a
``torch.utils.checkpoint`` region, a ``torch.cond`` of its own) keep their original code:
plain compile breaks the graph there and the operator falls back on what it does without
TorchDynamo (``runtime/subgraphs.py``)."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounter, CompileCounterWithBackend

CHECKPOINTED = """
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        h = self.drop(self.lin(x))
        if (h.abs() > 1e6).any():
            raise ValueError("activation too large")
        return h

class M(nn.Module):
    def __init__(self, reentrant):
        super().__init__()
        self.block = Block()
        self.reentrant = reentrant

    def forward(self, x):
        return checkpoint(self.block, x, use_reentrant=self.reentrant) * 3
"""


def _backward(module, backend: str, reentrant: bool, requires_grad: bool):
    torch.manual_seed(0)
    model = module.M(reentrant)
    x = torch.randn(3, 4, requires_grad=requires_grad)
    counter = CompileCounter() if backend == "eager" else CompileCounterWithBackend(backend)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=counter)
    torch.manual_seed(1)
    try:
        compiled(x).sum().backward()
        outcome = model.block.lin.weight.grad.tolist()
    except RuntimeError as error:
        outcome = str(error)
    return outcome, torch.rand(2).tolist(), counter.frame_count


@pytest.mark.filterwarnings("ignore:None of the inputs have requires_grad")
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize(
    ("reentrant", "requires_grad"),
    [(False, True), (True, False)],
    ids=["non-reentrant", "reentrant"],
)
def test_a_guard_in_a_checkpointed_block_keeps_the_checkpoints_behaviour(
    load_both, backend, reentrant, requires_grad
):
    # the lowered guard removed the break plain compile makes in the checkpointed block:
    # TorchDynamo captured the checkpoint, whose recomputation drew another dropout mask
    # under the eager backend (other gradients, other numbers drawn after the call), and
    # which gave the parameters gradients where the reentrant original raises
    plain, mended = load_both(CHECKPOINTED)
    expected = _backward(plain, backend, reentrant, requires_grad)
    assert _backward(mended, backend, reentrant, requires_grad) == expected


PROGRAMS_COND = """
import torch

def positive(x):
    if (x.abs() > 1e6).any():
        raise ValueError("too large")
    return x * 2

def negative(x):
    return -x

def f(x):
    return torch.cond(x.mean() > 0, positive, negative, (x,))
"""


def test_a_site_in_a_branch_of_the_programs_torch_cond_is_left_as_it_is(load_both):
    # lowered there, the guard let the program's torch.cond succeed where the original
    # fails (a raise in a branch)
    outcomes = []
    for module in load_both(PROGRAMS_COND):
        torch._dynamo.reset()
        with pytest.raises(torch._dynamo.exc.UncapturedHigherOrderOpError) as raised:
            module.f(torch.tensor([1.0, -2.0, 4.0]))
        outcomes.append(str(raised.value).splitlines()[0])
    assert outcomes[1] == outcomes[0]
