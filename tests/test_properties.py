"""Property: for generated modules mixing the patterns GraphMend rewrites, GraphMend
changes nothing a caller can observe, eagerly or compiled, and never adds graphs.

Each program (``helpers.programs``) is run four ways: plain and through GraphMend,
eagerly and under ``torch.compile`` with a counting backend from a clean Dynamo
state, calling the compiled module several times with different Python values and
shapes (recompiles, automatic dynamic shapes).  GraphMend's run must match the plain
run of the same kind in outputs (bit for bit), the caller's tensor after each call,
the module's parameters and buffers, printed text, log records and warnings (in
order) and exceptions (type and message), with no more graphs and no more graph
breaks than plain.

A second property: programs made only of what GraphMend claims to fix (tensor
branches with mergeable arms, output calls, guards) compile with ``fullgraph=True``
through GraphMend and behave as the plain eager program.

Scale: ``GRAPHMEND_PROPERTY_EXAMPLES=500`` runs that many programs per test case
(default 25); ``GRAPHMEND_PROPERTY_SHRINK=1`` shrinks a failing program to a minimal
one (minutes, a compile per step; off by default, so a failing run stays quick).
:data:`COUNTEREXAMPLES` holds the minimal programs found so far, one per defect.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from helpers.observe import differences, run
from helpers.programs import Call, Program, programs

EXAMPLES = int(os.environ.get("GRAPHMEND_PROPERTY_EXAMPLES", "25"))
SHRINK = os.environ.get("GRAPHMEND_PROPERTY_SHRINK", "0") not in ("", "0")
PROPERTY = settings(
    max_examples=EXAMPLES,
    deadline=None,
    phases=tuple(Phase) if SHRINK else (Phase.explicit, Phase.reuse, Phase.generate),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

#: Pattern mixes, each aimed at a class of defects; "mixed" draws from every pattern.
FAMILIES = {
    "branches": ("assign", "if", "conditional", "mask"),
    "stores": ("assign", "if", "in_place", "store"),
    "outputs and guards": ("assign", "if", "output", "guard", "output_then_guard"),
    "mixed": None,
}


def check(program: Program) -> None:
    """Fail with the program, its calls and every difference GraphMend makes.

    GraphMend's eager run must match the plain eager run; its compiled run, in each
    call and field, the plain eager or the plain compiled one (plain compile itself
    differs from eager in places: a failing tensor ``assert`` raises ``RuntimeError``).
    """
    plain = run(program, mended=False, compiled=False)
    plain_compiled = run(program, mended=False, compiled=True)
    mended = run(program, mended=True, compiled=False)
    mended_compiled = run(program, mended=True, compiled=True)
    problems = [f"eager: {difference}" for difference in differences([plain], mended)]
    problems += [
        f"compiled: {difference}"
        for difference in differences([plain, plain_compiled], mended_compiled)
    ]
    counts = (
        f"graphs: plain {plain_compiled.graphs} ({plain_compiled.breaks} breaks), "
        f"graphmend {mended_compiled.graphs} ({mended_compiled.breaks} breaks)"
    )
    assert not problems, "\n".join([program.describe(), counts, *problems])


@pytest.mark.parametrize("family", FAMILIES)
@PROPERTY
@given(data=st.data())
def test_graphmend_changes_nothing_observable(family: str, data: st.DataObject) -> None:
    patterns = FAMILIES[family]
    check(data.draw(programs() if patterns is None else programs(patterns), label="program"))


#: What GraphMend claims to fix: mergeable or submodule-calling arms, no early return.
FIXABLE = programs(
    ("assign", "if", "conditional", "output", "guard", "output_then_guard"),
    values=("pure", "linear"),
    returns=False,
)


@PROPERTY
@given(program=FIXABLE)
def test_fixable_programs_compile_as_one_graph(program: Program) -> None:
    plain = run(program, mended=False, compiled=False)
    mended = run(program, mended=True, compiled=True, fullgraph=True)
    problems = differences([plain], mended)
    assert not problems, "\n".join([program.describe(), "fullgraph=True:", *problems])


def _calls(*calls: tuple[tuple[tuple[float, ...], ...], float]) -> tuple[Call, ...]:
    return tuple(Call(rows, t) for rows, t in calls)


#: Minimal failing programs, one per defect, named after the issue item they show.
COUNTEREXAMPLES = {
    "issue10-17-guard-message-with-changing-float": Program(
        'if (x > 3.0).any():\n    raise ValueError(f"bad t={t}")\nreturn x\n',
        _calls((((0.0, 0.0, 0.0, 0.0),), 0.5), (((0.0, 0.0, 0.0, 0.0),), 1.5)),
    ),
}


@pytest.mark.parametrize("program", COUNTEREXAMPLES.values(), ids=COUNTEREXAMPLES)
def test_counterexample(program: Program) -> None:
    check(program)
