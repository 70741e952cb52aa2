"""Count graphs and graph breaks the way the tests need them."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch._dynamo
from torch._dynamo.testing import CompileCounter
from torch._dynamo.utils import counters


@dataclass(frozen=True)
class Compiled:
    result: Any
    graphs: int
    breaks: int
    operations: int  # in all graphs together


def compile_and_run(function: Callable[..., Any], *args: Any, fullgraph: bool = False) -> Compiled:
    """Run ``function`` under ``torch.compile`` (counting backend) from a clean Dynamo state."""
    torch._dynamo.reset()
    counters.clear()
    counter = CompileCounter()
    result = torch.compile(function, backend=counter, fullgraph=fullgraph)(*args)
    # Dynamo's break counter misses some breaks (a data-dependent branch, for
    # one); every graph after the first also starts at a break.
    breaks = max(sum(counters["graph_break"].values()), counter.frame_count - 1)
    return Compiled(result, counter.frame_count, breaks, counter.op_count)


@dataclass(frozen=True)
class Calls:
    results: list[Any]
    graphs: int
    given_up: int  # frames TorchDynamo gave up: they ran in Python


def compile_and_call(function: Callable[..., Any], calls: Iterable[tuple[Any, ...]]) -> Calls:
    """Call ``function`` under ``torch.compile`` (counting backend), from a clean Dynamo
    state, with each of ``calls`` in turn."""
    torch._dynamo.reset()
    counters.clear()
    counter = CompileCounter()
    compiled = torch.compile(function, backend=counter)
    results = [compiled(*arguments) for arguments in calls]
    frames = counters["frames"]
    return Calls(results, counter.frame_count, frames["total"] - frames["ok"])
