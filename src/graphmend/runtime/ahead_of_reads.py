"""What a condition evaluates ahead of the original's break, taken back where its choice
is made on the host after all.

A translated condition (:mod:`graphmend.rewrites.conditions`) keeps on the device what the
original reads on the host, and goes on: it evaluates the other side of a comparison of a
host read (``t`` in ``float(x.mean()) < t``), and the right side of an ``and``/``or``
whose left side is a tensor (:func:`speculate_or_none`).  Where the branches merge or the
guard is lowered, nothing is read on the host, which is the point.  Where the choice is
made on the host after all, the original breaks the graph at its first read (or at its
jump on the left side) and evaluates the rest in the frame it resumes; what the
translation evaluated after that point may have made TorchDynamo guard, in the frame
before the break, on what plain compile's frame never reads (a Python float ``t``, a
counter kept in a global), or compile a graph of its own where plain compile's was empty
(``torch.allclose`` right after another break); and reading again at the choice, the
frame breaks at another place than the original, which gives another resume function
(helper hgen6's h6, h1 and h3; fuzz seeds 77, 2067).

So each place is noted: :func:`read_on_host` where the original reads, a right side's
speculation where it guarded; and the choice made on the host after all first calls
:func:`before_host_choice`, which restarts the analysis with the earliest place noted
marked: there the next analysis reads on the host, as the original does (the same break,
the same frames after it), or evaluates the right side by the original's jump.  A read is
made as written too where a runtime function would read the tensor on the host itself
(:func:`read_as_written`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from graphmend.runtime.asking import ask_tracer
from graphmend.runtime.attempts import Site, in_an_attempt, traced_attempt
from graphmend.runtime.fallbacks import record_at

#: The attribute of the ``OutputGraph`` being traced that holds, by condition, what was
#: evaluated ahead of the original's break (:class:`_Ahead`), in order.
_AHEAD = "graphmend_evaluated_ahead"


@dataclass(frozen=True)
class _Ahead:
    """A place in a condition after which the translation evaluates what the original
    evaluates after its break, and why it keeps the original's break there where the
    choice is made on the host."""

    site: Site
    reason: str
    #: whether the place is a read (:func:`read_on_host`), not a right side
    read: bool = False


def read_on_host(rewrite: str, condition: str, first: bool, *operands: Any) -> bool:
    """Whether a host read of ``condition`` (its name), of ``operands`` (evaluated
    before, as the original evaluates them), is made on the host as written: where an
    earlier analysis of this compile restarted for it (:func:`before_host_choice`),
    recorded for ``rewrite``.  ``first``: the condition's first read (what was noted of
    the condition before is of an earlier evaluation).  Nothing is noted inside an
    attempt, which may be taken back (a right side evaluated ahead of time, a branch),
    nor where no operand is a tensor (an object's own ``item()`` or ``__bool__``: the
    original does not break there).  ``False`` outside TorchDynamo.  Called only while
    tracing."""
    return ask_tracer(_read_on_host, False, rewrite, condition, first, *operands)


def _read_on_host(
    tracer: Any,
    rewrite_variable: Any,
    condition_variable: Any,
    first_variable: Any,
    *operand_variables: Any,
) -> bool | None:
    """Asked while TorchDynamo traces :func:`read_on_host`."""
    try:
        rewrite = rewrite_variable.as_python_constant()
        condition = condition_variable.as_python_constant()
        first = first_variable.as_python_constant()
        if in_an_attempt(tracer.output):
            return None
        noted = _evaluated_ahead(tracer)
        if first:
            noted[condition] = []
        if not any(map(_is_a_tensor, operand_variables)):
            return None
        site = Site(tracer)
    except (AttributeError, ImportError, KeyError, TypeError):
        return None  # the translation reads on the device, as it did before
    kept = site.kept_break()
    if kept is not None:
        record_at(tracer, rewrite, kept)
        return True
    if site.one_graph:
        return None  # the original's break would fail the compile: nothing to keep
    noted.setdefault(condition, []).append(_Ahead(site, _READ_FIRST, read=True))
    return None


def _is_a_tensor(variable: Any) -> bool:
    """Whether TorchDynamo's ``variable`` holds a tensor."""
    try:
        return issubclass(variable.python_type(), torch.Tensor)
    except NotImplementedError:
        return False


_READ_FIRST = (
    "the choice is made on the host: the condition reads where the original reads first, "
    "its break, and evaluates the rest after it"
)


def read_as_written(condition: str) -> None:
    """Restart the analysis, the first read noted for ``condition`` (:func:`read_on_host`)
    marked to be made as written: called where the runtime is about to read a tensor of
    the condition on the host after all (a comparison with what is no number, ``int()``
    of a float), a break inside a runtime function, where the original's is at its
    read, and the rest of the function run in Python.  Called only while tracing."""
    ask_tracer(_read_as_written, None, condition)


def _read_as_written(tracer: Any, condition_variable: Any) -> None:
    """Asked while TorchDynamo traces :func:`read_as_written`."""
    if in_an_attempt(tracer.output):
        return
    noted = _evaluated_ahead(tracer).get(condition_variable.as_python_constant(), [])
    reads = [entry for entry in noted if entry.read]
    if reads:
        reads[0].site.keep_break(
            "the condition reads a tensor on the host after all, where the original reads it first"
        )


def speculate_or_none(
    rewrite: str, condition: str, function: Callable[..., Any], arguments: Sequence[Any]
) -> Any | None:
    """``function(*arguments)`` traced as an attempt (``None`` where it fails, undone and
    recorded for ``rewrite``: ``runtime.attempts.call_or_none``), for the right side of an
    ``and``/``or`` in ``condition`` (its name), evaluated ahead of time; where it leaves
    guards, a choice made on the host after all keeps the original's jump instead
    (:func:`before_host_choice`).  Called only while tracing."""
    return ask_tracer(_speculate, None, rewrite, condition, function, arguments)


def _speculate(
    tracer: Any,
    rewrite_variable: Any,
    condition_variable: Any,
    function: Any,
    arguments_variable: Any,
) -> Any:
    """Asked while TorchDynamo traces :func:`speculate_or_none`."""
    traced = traced_attempt(
        tracer, rewrite_variable, function, arguments_variable, guards_kept=True
    )
    attempt, site = traced.attempt, traced.site
    if (
        traced.result is not None
        and attempt is not None
        and site is not None
        and attempt.guarded_what_may_change()
    ):
        noted = _evaluated_ahead(tracer).setdefault(condition_variable.as_python_constant(), [])
        noted.append(_Ahead(site, _GUARDED_RIGHT_SIDE))
    return traced.result


_GUARDED_RIGHT_SIDE = (
    "evaluated ahead of time, it made TorchDynamo guard on what the original reads only "
    "after its jump, and the choice is made on the host"
)


def before_host_choice(condition: str) -> None:
    """Before a choice on ``condition`` is made on the host after all (its site kept its
    break): restart the analysis if the condition noted a place ahead of which the
    original breaks (a host read of a tensor, a right side speculated that guarded), the
    earliest such place marked to keep the break.  Called only while tracing."""
    ask_tracer(_before_host_choice, None, condition)


def jumped_on(condition: str, value: Any) -> Any:
    """``value``, a side of ``condition`` (its name) that the caller's jump reads on the
    host next, after :func:`before_host_choice`: what evaluating it noted (a read kept on
    the device) is made as written, the original's break, not a graph of the device form
    and a break at the jump on it (fuzz seed 3142).  Called only while tracing."""
    before_host_choice(condition)
    return value


def _before_host_choice(tracer: Any, condition_variable: Any) -> None:
    """Asked while TorchDynamo traces :func:`before_host_choice`."""
    if in_an_attempt(tracer.output):
        return  # a right side's own choice, evaluated ahead of time: the condition's comes
    noted = _evaluated_ahead(tracer).pop(condition_variable.as_python_constant(), [])
    if noted:
        first = min(noted, key=lambda entry: entry.site.position)
        first.site.keep_break(first.reason)


def _evaluated_ahead(tracer: Any) -> dict[str, list[_Ahead]]:
    """What the graph ``tracer`` traces noted for each condition (:class:`_Ahead`)."""
    noted = getattr(tracer.output, _AHEAD, None)
    if noted is None:
        noted = {}
        setattr(tracer.output, _AHEAD, noted)
    return noted
