"""Asking TorchDynamo a question while it traces, with a default answer otherwise.

A runtime function that needs what only the tracer knows (the fake tensor behind a
value, the speculation log, the graph being built) asks it through :func:`ask_tracer`:
a ``comptime`` hook runs in Python while TorchDynamo traces the caller, leaving nothing
in the graph, and its answer becomes the function's result.  Eagerly, under non-strict
``torch.export`` and where this torch's tracer lacks the internals the hook reads, the
caller gets the default.  The translator and variables handed to a hook are TorchDynamo
internals, used on the releases GraphMend is tested with (2.5 and 2.13).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch

T = TypeVar("T")


def ask_tracer(hook: Callable[..., Any], default: T, *values: Any) -> T:
    """``hook(tracer, *variables)``'s answer, run in Python while TorchDynamo traces the
    caller: ``tracer`` is the caller's translator, ``variables`` TorchDynamo's variables
    for ``values``.  The hook answers a Python constant or a TorchDynamo variable;
    ``None`` (return a variable to answer ``None`` itself) leaves ``default``, which is
    also the answer outside TorchDynamo."""
    answer = default  # set by _answer while TorchDynamo traces this frame
    torch._dynamo.comptime.comptime(_answer)
    return answer


def _answer(context: Any) -> None:
    """Runs in Python while TorchDynamo traces :func:`ask_tracer`."""
    try:
        from torch._dynamo.variables import ConstantVariable, VariableTracker

        tracer = context._i_will_not_complain_if_bc_breaks_InstructionTranslator()
        hook = tracer.symbolic_locals["hook"].as_python_constant()
        variables = tracer.symbolic_locals["values"].items
        caller = tracer.parent
    except (AttributeError, ImportError, KeyError, NotImplementedError):
        return  # a release without these internals
    if caller is None:
        return  # compiled as a frame of its own: the caller runs in Python
    answer = hook(caller, *variables)
    if answer is not None:
        if not isinstance(answer, VariableTracker):
            answer = ConstantVariable.create(answer)
        tracer.symbolic_locals["answer"] = answer
