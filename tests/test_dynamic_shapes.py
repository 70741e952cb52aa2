"""Dynamic shapes: rewritten sites compiled with symbolic sizes (``dynamic=True``,
automatic dynamic shapes) recompile no more often than the original code.

T1 and continuation trace code the original may never run (the untaken arm, the rest
of the function under the other outcome).  Where that code pins a symbolic size to one
value (``x.split(2)`` of ``s0`` rows guards ``(s0 + 1) // 2 == 3``), every new size
would compile the frame again, until TorchDynamo's recompile limit sends the whole
frame to eager; plain compile, breaking at the ``if``, never traces that arm.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
from torch._dynamo.testing import CompileCounter
from torch.fx.experimental.symbolic_shapes import ConstraintViolationError

from graphmend import GraphMendWarning
from graphmend.runtime import fallbacks, marked_sizes
from helpers.modules import import_both

SOURCE = """
import torch


def split_in_untaken_arm(x):
    if x.sum() > 0:
        y = torch.cat(x.split(2), 0) * 2
    else:
        y = x - 1
    return y + 1


def split_after_mask_or_none(x):
    if x.sum() > 0:
        mask = None
    else:
        mask = x > 0
    y = x * 2
    if mask is None:
        y = torch.cat(y.split(2), 0)
    return y + 1


def print_a_float(x, t):
    print(f"t={t}")
    return x * 2


def merged_with_symbolic_sizes(x):
    if x.sum() > 0:
        y = x * x.shape[0]
    else:
        y = x - 1
    return y + 1


def sizes_equal_for_some_rows(x):
    x = x.clone()
    z = x[: x.shape[0] // 2 + 1]
    if x.sum() > 0:
        y = x[1:] * 2
    else:
        y = z * 3
    return y * 2


def two_rows_or_all_but_one(x):
    x = x.clone()
    if x.sum() > 0:
        y = x[:2]
    else:
        y = x[1:] * 2
    return y * 2


def a_size_or_a_number(x):
    x = x.clone()
    if x.sum() > 0:
        k = x.shape[0]
    else:
        k = 2
    return x * k


def shapes_of_both_arms(x):
    if x.sum() > 0:
        shape = x.shape
    else:
        shape = (x * 2).shape
    return x.reshape(shape) * 2
"""

#: Row counts past TorchDynamo's recompile limit (8); the sum is negative.
ROWS = range(2, 14)


@pytest.fixture(scope="module")
def modules(tmp_path_factory: pytest.TempPathFactory):
    directory: Path = tmp_path_factory.mktemp("dynamic")
    return import_both(directory, "dynamic", SOURCE)


def _graphs(
    function, dynamic: bool | None, rows: Sequence[int] = ROWS, *, grad: bool = False
) -> tuple[int, list[torch.Tensor]]:
    torch._dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(function, backend=counter, dynamic=dynamic)
    with torch.set_grad_enabled(grad):
        results = [compiled(-torch.ones(count, 4)) for count in rows]
    return counter.frame_count, results


@pytest.mark.parametrize("dynamic", [None, True])
@pytest.mark.parametrize("name", ["split_in_untaken_arm", "split_after_mask_or_none"])
def test_code_that_pins_a_size_keeps_the_break(modules, name: str, dynamic) -> None:
    plain_module, mended_module = modules
    plain, plain_results = _graphs(getattr(plain_module, name), dynamic)
    fallbacks.clear()
    mended, mended_results = _graphs(getattr(mended_module, name), dynamic)
    assert mended <= plain, (plain, mended)
    for got, want in zip(mended_results, plain_results, strict=True):
        assert torch.equal(got, want)
    assert any("one size" in record.reason for record in fallbacks.records())


@pytest.mark.parametrize("dynamic", [None, True])
@pytest.mark.parametrize(
    ("name", "rows"),
    [
        ("sizes_equal_for_some_rows", (3, 4, 5, 6)),
        ("two_rows_or_all_but_one", (3, 4, 5, 6)),
        ("a_size_or_a_number", (2, 3, 4, 5)),
        ("shapes_of_both_arms", (3, 4, 5, 6)),
    ],
)
def test_deciding_whether_arms_merge_guards_on_no_size(
    modules, name: str, rows: tuple[int, ...], dynamic
) -> None:
    """T1 compares the arms' results (their shapes, numbers) to decide whether they
    merge, which the original never does.  The comparison guarded on the sizes: arms of
    ``s0 - 1`` and ``s0 // 2 + 1`` rows merged where those are equal, pinning the frame to
    those sizes (one more compile for each other size), and a size compared with a number
    pinned it to that number.  Two ``torch.Size`` were compared by identity, which
    TorchDynamo cannot trace: a graph break inside GraphMend's runtime.  (While autograd
    records: in inference continuation merges these sites after T1 declines.)"""
    plain_module, mended_module = modules
    plain, plain_results = _graphs(getattr(plain_module, name), dynamic, rows, grad=True)
    mended, mended_results = _graphs(getattr(mended_module, name), dynamic, rows, grad=True)
    assert mended <= plain, (plain, mended)
    for got, want in zip(mended_results, plain_results, strict=True):
        assert torch.equal(got, want)


def test_under_fullgraph_a_pinned_size_keeps_the_merge(modules) -> None:
    """With ``fullgraph=True`` the kept break would fail the call: the frame is compiled
    for each size instead, as before the check."""
    plain_module, mended_module = modules
    torch._dynamo.reset()
    compiled = torch.compile(mended_module.split_in_untaken_arm, backend="eager", fullgraph=True)
    with torch.no_grad():
        for rows in (4, 5, 6):
            x = -torch.ones(rows, 4)
            assert torch.equal(compiled(x), plain_module.split_in_untaken_arm(x))


def test_a_size_marked_dynamic_is_not_pinned(modules) -> None:
    """``torch._dynamo.mark_dynamic`` makes the size symbolic from the first call: the
    attempt that pins it keeps the break, and each new size reuses the graphs."""
    plain_module, _ = modules
    counts = []
    for module in modules:
        torch._dynamo.reset()
        counter = CompileCounter()
        compiled = torch.compile(module.split_in_untaken_arm, backend=counter)
        for rows in (4, 5, 6, 7):
            x = -torch.ones(rows, 4)
            torch._dynamo.mark_dynamic(x, 0)
            with torch.no_grad():
                assert torch.equal(compiled(x), plain_module.split_in_untaken_arm(x))
        counts.append(counter.frame_count)
    plain, mended = counts
    assert mended <= plain, counts


@pytest.mark.parametrize("name", ["merged_with_symbolic_sizes", "shapes_of_both_arms"])
def test_symbolic_sizes_that_stay_symbolic_still_merge(modules, name: str) -> None:
    """An arm that computes with a size without pinning it merges, and so do arms whose
    results are sizes known equal for every size: one graph, no break."""
    plain_module, mended_module = modules
    mended, results = _graphs(getattr(mended_module, name), True)
    assert mended == 1
    for rows, result in zip(ROWS, results, strict=True):
        assert torch.equal(result, getattr(plain_module, name)(-torch.ones(rows, 4)))


def test_formatting_a_symbolic_float_after_the_graph_makes_no_graph(modules, capsys) -> None:
    """Under ``dynamic=True`` a float argument is symbolic: the deferred print formats it
    after the graph, and GraphMend's formatting helpers are not compiled on their own."""
    _, mended_module = modules
    torch._dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(mended_module.print_a_float, backend=counter, dynamic=True)
    for rows in (2, 3):  # one value of t: torch 2.5 compiles again for a new float
        assert torch.equal(compiled(torch.ones(rows, 4), 3.5), torch.full((rows, 4), 2.0))
    assert capsys.readouterr().out == "t=3.5\nt=3.5\n"
    assert counter.frame_count == 1


def test_a_tensor_method_taken_for_a_submodule_declines_without_failing(modules) -> None:
    """``x.split`` may be a submodule's call as far as the source shows; at trace time it
    is not a module, and the site declines (TorchDynamo 2.5 failed the whole compile
    formatting the reason with the method's type name)."""
    plain_module, mended_module = modules
    x = -torch.ones(3, 4)
    torch._dynamo.reset()
    compiled = torch.compile(mended_module.split_in_untaken_arm, backend="eager")
    assert torch.equal(compiled(x), plain_module.split_in_untaken_arm(x))


PINNED_AFTER_A_SITE = """
import torch


def deferred_print(x, m):
    y = x + 1
    print("scaling")
    return y * m


def merged_if(x, m):
    y = x + 1
    if y.sum() > 0:
        y = y * 2
    return y * m


def lowered_guard(x, m):
    y = x + 1
    if (y > 100).any():
        raise ValueError("big")
    return y * m
"""


@pytest.mark.parametrize("name", ["deferred_print", "merged_if", "lowered_guard"])
def test_code_after_a_site_pinning_a_size_marked_dynamic_compiles(load_both, name) -> None:
    """``mark_dynamic(x, 0)``, then a site, then ``y * m`` with ``m`` of static rows: the
    code after the site pins ``x``'s rows; plain compile's break hands ``y`` to a frame of
    its own, while without it the compile failed with ``ConstraintViolationError`` (found
    by helper hmode).  The site keeps its break."""
    outcomes = []
    generator = torch.Generator().manual_seed(0)
    given = torch.randn(2, 4, generator=generator), torch.randn(2, 4, generator=generator)
    for module in load_both(PINNED_AFTER_A_SITE):
        torch._dynamo.reset()
        counter = CompileCounter()
        x, m = (tensor.clone() for tensor in given)
        torch._dynamo.mark_dynamic(x, 0)
        with torch.no_grad():
            result = torch.compile(getattr(module, name), backend=counter)(x, m)
        outcomes.append((result, counter.frame_count))
    (expected, plain_graphs), (result, graphs) = outcomes
    assert torch.equal(result, expected)
    assert graphs <= plain_graphs


#: A frame whose traced path depends on state that tracing sets (transformers' output
#: capturing, once a frame recording outputs was traced): plain compile gives
#: ``record`` up at the branch in its loop and runs it in Python; GraphMend merges the
#: branch, and ``gated``, taking the traced path, multiplies a marked size by a static
#: one in its own frame, where plain compile gives it up too.
PINNED_AFTER_A_MERGE_ELSEWHERE = """
import torch


class State:
    traced = False


STATE = State()


def record(x):
    steps = x * 0
    for _ in range(2):
        if x.sum() > 0:
            steps = steps + 1
        if torch.compiler.is_compiling():
            STATE.traced = True
    return steps


def gated(x, m):
    for _ in range(1):
        if not STATE.traced:
            torch._dynamo.graph_break()
        y = scale(x + 0, m)
    return y


def scale(a, m):
    return a * m


def pins(x, m):
    return x * m


def keeps(x, m):
    return x + 1


def apply(function, x, m):
    return function(x, m) + 0
"""


def _marked_and_static() -> tuple[torch.Tensor, torch.Tensor]:
    x, m = torch.arange(12.0).reshape(3, 4), torch.ones(3, 4)
    torch._dynamo.mark_dynamic(x, 0)
    return x, m


def test_a_frame_pinning_a_marked_size_after_a_merge_elsewhere_runs_in_python(
    load_both, monkeypatch
) -> None:
    """The BART reproduction (float16, ``output_attentions=True``, the mask marked dynamic;
    found by helper audit_dyn): the compile failed with ``ConstraintViolationError``,
    where plain compile succeeds.  The frame with no site that pins the size runs in
    Python, with a warning; its callee compiles as under plain compile."""
    plain, mended = load_both(PINNED_AFTER_A_MERGE_ELSEWHERE)
    monkeypatch.setattr(marked_sizes, "_removed_a_break", False)  # record's merge sets it
    counts = []
    for module in (plain, mended):
        torch._dynamo.reset()
        counter = CompileCounter()
        x, m = _marked_and_static()
        torch.compile(module.record, backend=counter)(torch.ones(3, 4))
        gated = torch.compile(module.gated, backend=counter)
        if module is mended:
            with pytest.warns(GraphMendWarning, match=r"gated .* marks dynamic"):
                result = gated(x, m)
        else:
            result = gated(x, m)
        assert torch.equal(result, x * m)
        counts.append(counter.frame_count)
    assert (plain.STATE.traced, mended.STATE.traced) == (False, True)
    assert counts == [1, 2]  # plain: scale; GraphMend: record, merged, and scale


@pytest.mark.parametrize("merged_before", [False, True])
def test_a_frame_pinning_a_marked_size_fails_as_plain_where_nothing_merged(
    load_both, monkeypatch, merged_before: bool
) -> None:
    """Where no graph with a site open was compiled, the compile fails as plain compile's
    does; after one, the frame runs in Python (plain compile may fail there too: the
    warning says so).  Under ``fullgraph=True`` it fails either way."""
    plain, mended = load_both(PINNED_AFTER_A_MERGE_ELSEWHERE)
    monkeypatch.setattr(marked_sizes, "_removed_a_break", False)  # (it counts plain code too)
    torch._dynamo.reset()
    with pytest.raises(ConstraintViolationError):
        torch.compile(plain.pins, backend="eager")(*_marked_and_static())
    monkeypatch.setattr(marked_sizes, "_removed_a_break", merged_before)
    torch._dynamo.reset()
    with pytest.raises(ConstraintViolationError):
        torch.compile(mended.pins, backend="eager", fullgraph=True)(*_marked_and_static())
    torch._dynamo.reset()
    compiled = torch.compile(mended.pins, backend="eager")
    if merged_before:
        with pytest.warns(GraphMendWarning, match="plain compile may"):
            x, m = _marked_and_static()
            assert torch.equal(compiled(x, m), x * m)
    else:
        with pytest.raises(ConstraintViolationError):
            compiled(*_marked_and_static())


def test_a_pinned_marked_size_torch_is_told_to_ignore_compiles_as_plain(
    load_both, monkeypatch
) -> None:
    """Under ``allow_ignore_mark_dynamic`` TorchDynamo compiles the pinned size: so does
    GraphMend, with no warning, after a merge too (found by helper-102)."""
    _, mended = load_both(PINNED_AFTER_A_MERGE_ELSEWHERE)
    monkeypatch.setattr(marked_sizes, "_removed_a_break", True)
    torch._dynamo.reset()
    counter = CompileCounter()
    x, m = _marked_and_static()
    with warnings.catch_warnings(), torch._dynamo.config.patch(allow_ignore_mark_dynamic=True):
        warnings.simplefilter("error", GraphMendWarning)
        assert torch.equal(torch.compile(mended.pins, backend=counter)(x, m), x * m)
    assert counter.frame_count == 1


def test_a_call_run_in_python_leaves_the_graphs_of_other_calls(load_both, monkeypatch) -> None:
    """The code of a frame that pins a marked size keeps the graphs it has for other
    calls: transformers' output-capturing wrapper resumes the encoder's and the
    decoder's ``forward`` in one code object, and giving that code up compiled the
    encoder's layers one by one at every later call (15 graphs where plain compile
    makes 11, a float16 BART; found by helper-102).  Where TorchDynamo has no such
    strategy (the torch 2.5 floor), the code is given up."""
    _, mended = load_both(PINNED_AFTER_A_MERGE_ELSEWHERE)
    monkeypatch.setattr(marked_sizes, "_removed_a_break", True)
    torch._dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(mended.apply, backend=counter)
    x, m = _marked_and_static()
    assert torch.equal(compiled(mended.keeps, x, m), x + 1)
    with pytest.warns(GraphMendWarning, match="marks dynamic"):
        assert torch.equal(compiled(mended.pins, x, m), x * m)
    graphs = counter.frame_count
    assert torch.equal(compiled(mended.keeps, x, m), x + 1)
    kept = hasattr(torch._dynamo.exc.TorchDynamoException(), "frame_exec_strategy")
    assert counter.frame_count == graphs + (0 if kept else 1)
