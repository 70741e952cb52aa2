"""Every torch release the package declares: import, compile, and what an old torch lacks."""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch._dynamo.testing import CompileCounter

from graphmend import runtime, torch_releases
from graphmend.config import ALL_REWRITES
from graphmend.notices import GraphMendWarning
from graphmend.runtime import dynamo_support, traps
from graphmend.runtime.asking import ask_tracer
from graphmend.torch_releases import torch_release
from helpers.processes import python_path, run_python

ROOT = Path(__file__).resolve().parents[1]
HAS_IS_EXPORTING = hasattr(torch.compiler, "is_exporting")


def _declared_floor() -> tuple[int, int]:
    text = (ROOT / "pyproject.toml").read_text()
    start = text.index('"torch>=') + len('"torch>=')
    release = torch_release(text[start : text.index('"', start)])
    assert release is not None
    return release


def test_the_declared_floor_is_the_oldest_release_tested():
    assert _declared_floor() == torch_releases.TESTED[0]
    assert (
        f"torch=={'.'.join(map(str, torch_releases.TESTED[0]))}." in (ROOT / "Makefile").read_text()
    )


def test_model_code_imports_through_the_hook(tmp_path):
    # Every process of a serving container imports model code; on torch 2.5 and
    # 2.6 defining the guard operator made that import fail.  The operator is
    # defined once TorchDynamo is imported: by the model import on transformers
    # 4.51 and later, by the compile that follows it on older releases.
    result = run_python(
        "-c",
        "import sys, transformers.models.llama.modeling_llama, torch._dynamo,"
        " graphmend.runtime.traps as t;"
        "print(sum('_@gm_rt' in getattr(m, '__dict__', ()) for m in list(sys.modules.values())),"
        " t._operator_ready)",
        env={"GRAPHMEND": "1", "GRAPHMEND_CACHE_DIR": str(tmp_path)},
    )
    assert result.returncode == 0, result.stderr
    rewritten, operator_ready = result.stdout.split()
    assert int(rewritten) > 0
    assert operator_ready == "True"


@pytest.mark.parametrize("version", ["2.13.0+cpu", "2.5.1+cu124", "2.14.1+cu130", "2.15.0+cu132"])
def test_tested_releases_keep_inlined_deferred_calls(version):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert dynamo_support.keep_inlined_deferred_calls(version)


@pytest.mark.parametrize("version", ["2.16.0", "3.0.0a0+git1234", "2.4.1", "nightly"])
def test_untested_releases_keep_the_breaks_with_one_warning(version, monkeypatch):
    monkeypatch.setattr(torch_releases, "_warned", set())
    with pytest.warns(GraphMendWarning, match="keep their graph breaks") as caught:
        assert not dynamo_support.keep_inlined_deferred_calls(version)
    assert len(caught) == 1
    assert f"torch {version} " in str(caught[0].message)


@pytest.mark.parametrize(
    ("version", "deferred"),
    [("2.13.0+cpu", True), ("2.5.1+cu124", True), ("2.16.0", False), ("nightly", False)],
)
def test_the_hook_defers_output_only_on_a_release_tested(version, deferred, monkeypatch):
    monkeypatch.setattr(torch_releases, "_warned", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            chosen = torch_releases.runnable_rewrites(ALL_REWRITES, version)
    assert ("defer" in chosen) is deferred
    assert chosen | {"defer"} == set(ALL_REWRITES)
    said = [str(warning.message) for warning in caught]
    assert said == ([] if deferred else [said[0]])
    assert deferred or f"torch {version} is not among the releases" in said[0]


#: Output calls a rewrite of deferred output would put into a function of GraphMend's:
#: unregistered with TorchDynamo (an untested torch), such a function broke the graph
#: inside itself, then was compiled on its own and broke again (found by helper-103).
_OUTPUT_CALLS = """
import torch

def between_breaks(x):
    torch._dynamo.graph_break()
    y = x.cos()
    print("y", y)
    return y.sin()

def f_string(x, w):
    print(f"w={w}", w * 2)
    return x + 1
"""

_COUNT_GRAPHS = """
import sys
from graphmend import torch_releases
torch_releases.TESTED = ((1, 0), (1, 0))  # no torch 2 release is tested: the one installed is not
if sys.argv[1] == "graphmend":
    import graphmend
    graphmend.install(["printing"], cache_dir=sys.argv[2])
import torch
import printing
from helpers.graphs import compile_and_run
calls = [
    (printing.between_breaks, torch.zeros(2)),
    (printing.f_string, torch.ones(2), torch.ones(2, requires_grad=True)),
]
for function, *args in calls:
    compiled = compile_and_run(function, *args)
    print("counts", function.__name__, compiled.graphs, compiled.breaks)
"""


def test_on_an_untested_torch_output_calls_break_where_plain_compiles_do(tmp_path):
    (tmp_path / "printing.py").write_text(_OUTPUT_CALLS)
    (tmp_path / "count_graphs.py").write_text(_COUNT_GRAPHS)
    runs = {
        arm: run_python(
            "count_graphs.py",
            arm,
            str(tmp_path / "cache"),
            cwd=tmp_path,
            env={"PYTHONPATH": python_path(tmp_path, ROOT / "tests")},
        )
        for arm in ("plain", "graphmend")
    }
    for result in runs.values():
        assert result.returncode == 0, result.stderr
    assert runs["graphmend"].stderr.count("keep their graph breaks") == 1
    assert runs["graphmend"].stdout == runs["plain"].stdout
    assert runs["plain"].stdout.count("counts") == 2


def test_dynamo_source_is_never_read():
    # Reading Dynamo's source (tokenising a file of thousands of lines) was most
    # of GraphMend's share of a warm import.
    script = (
        "import inspect\n"
        "import torch._dynamo\n"
        "read, getsource = [], inspect.getsource\n"
        "inspect.getsource = lambda *a, **k: read.append(a) or getsource(*a, **k)\n"
        "import graphmend.runtime\n"
        "from torch._dynamo.symbolic_convert import InliningInstructionTranslator as T\n"
        "print(read, getattr(T.__init__, '_graphmend_shares_debug_locals', False))\n"
    )
    result = run_python("-c", script)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["[]", "True"]


EXPORTED = """
import torch

class Guarded(torch.nn.Module):
    def forward(self, x):
        if (x > 10).any():
            raise ValueError(f"too large in {x.shape}")
        return x + 1
"""

LOAD = """
import sys, torch
program = torch.export.load(sys.argv[1]).module()
print(program(torch.ones(3)).tolist())
try:
    program(torch.full((3,), 20.0))
except RuntimeError as error:
    print(error)
print(any(name.startswith("graphmend") for name in sys.modules))
"""


@pytest.mark.skipif(not HAS_IS_EXPORTING, reason="no torch.compiler.is_exporting (2.5, 2.6)")
@pytest.mark.parametrize("strict", [True, False])
def test_exported_program_loads_and_checks_without_graphmend(load_rewritten, tmp_path, strict):
    module = load_rewritten(EXPORTED)
    program = torch.export.export(module.Guarded(), (torch.ones(3),), strict=strict)
    targets = {str(node.target) for node in program.graph.nodes}
    assert "aten._assert_async.msg" in targets
    assert not any("graphmend" in target for target in targets)
    torch.export.save(program, tmp_path / "guarded.pt2")
    (tmp_path / "load.py").write_text(LOAD)
    result = run_python(str(tmp_path / "load.py"), str(tmp_path / "guarded.pt2"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["[2.0, 2.0, 2.0]", "too large in ?", "False"]


CAUGHT_BY_A_CALLER = """
import torch

def check(x):
    if (x < 0).any():
        raise ValueError("negative input")
    return x

class Recovers(torch.nn.Module):
    def forward(self, x):
        try:
            x = check(x)
        except ValueError:
            x = x.abs()
        return x.sqrt()

class NoGrad(torch.nn.Module):
    def forward(self, x):
        with torch.no_grad():
            y = check(x) * 2
        return y + x

class Checked(torch.nn.Module):
    def forward(self, x):
        return check(x) + 1

class Outer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Checked()

    def forward(self, x):
        return self.inner(x) * 2
"""


def _export_error(module: torch.nn.Module) -> type[BaseException] | None:
    try:
        torch.export.export(module, (torch.ones(3),), strict=False)
    except Exception as error:
        return type(error)
    return None


@pytest.mark.parametrize("model", ["Recovers", "NoGrad"])
def test_non_strict_export_keeps_a_guard_a_caller_may_catch(load_both, model):
    # Non-strict export runs the code in Python, where no TorchDynamo translator tells
    # the callers: the guard was lowered, and the exported Recovers raised RuntimeError
    # on negative input where the module returns sqrt(|x|).  Plain export fails there.
    plain, rewritten = load_both(CAUGHT_BY_A_CALLER)
    expected = _export_error(getattr(plain, model)())
    assert expected is not None
    assert _export_error(getattr(rewritten, model)()) is expected


@pytest.mark.skipif(not HAS_IS_EXPORTING, reason="no torch.compiler.is_exporting (2.5, 2.6)")
def test_non_strict_export_lowers_a_guard_no_caller_catches(load_rewritten):
    module = load_rewritten(CAUGHT_BY_A_CALLER)
    program = torch.export.export(module.Outer(), (torch.ones(3),), strict=False)
    assert "aten._assert_async.msg" in {str(node.target) for node in program.graph.nodes}
    with pytest.raises(RuntimeError, match="negative input"):
        program.module()(-torch.ones(3))


@contextlib.contextmanager
def _another_thread_compiling() -> Iterator[None]:
    """Another thread stays inside a compile (its backend waits) while the block runs."""
    inside, release = threading.Event(), threading.Event()

    def waiting_backend(graph: torch.fx.GraphModule, _inputs: list) -> Callable[..., Any]:
        inside.set()
        release.wait(10)
        return graph.forward

    compiling = threading.Thread(
        target=lambda: torch.compile(torch.sin, backend=waiting_backend)(torch.ones(2))
    )
    compiling.start()
    try:
        assert inside.wait(30)
        if not torch.compiler.is_compiling():
            pytest.skip(f"torch {torch.__version__} sets is_compiling() only while tracing")
        yield
    finally:
        release.set()
        compiling.join()


# torch.compiler.is_compiling() is true in every thread while one compiles (torch 2.13).


def test_code_run_eagerly_while_another_thread_compiles_runs_as_written(load_rewritten):
    # The eager call took the tracing path and raised from GraphMend's operator.
    module = load_rewritten(CAUGHT_BY_A_CALLER)
    with _another_thread_compiling():
        assert not runtime.tracing()
        with pytest.raises(ValueError, match="negative input") as caught:
            module.check(-torch.ones(3))
    assert caught.traceback[-1].name == "check"
    assert "lower_guard" not in [entry.name for entry in caught.traceback]


def test_a_frame_run_in_python_while_another_thread_compiles_adds_no_graph(load_both):
    # A frame TorchDynamo runs in Python (skipped, or fallen back on) took the tracing
    # path, and the runtime's branch() was compiled as a frame of its own: one graph
    # more than plain compile (after waiting for the other thread's compile to end).
    source = """
    import torch
    def f(h):
        if h.abs().max() > 0.5:
            h = h / 2
        else:
            h = h * 3
        return h + 1
    """
    counts = []
    for module in load_both(source):
        torch._dynamo.eval_frame.skip_code(module.f.__code__)
        counter = CompileCounter()
        with _another_thread_compiling():
            assert torch.compile(module.f, backend=counter)(torch.ones(3)).tolist() == [1.5] * 3
        counts.append(counter.frame_count)
    assert counts == [0, 0]


@pytest.mark.skipif(HAS_IS_EXPORTING, reason="torch has torch.compiler.is_exporting")
def test_without_is_exporting_the_guard_operator_stays_with_one_warning(load_rewritten):
    module = load_rewritten(EXPORTED)
    traps._warn_export_needs_graphmend.cache_clear()
    with pytest.warns(GraphMendWarning, match=r"import graphmend\.runtime") as caught:
        for _ in range(2):
            torch._dynamo.reset()
            compiled = torch.compile(module.Guarded(), backend="eager", fullgraph=True)
            assert compiled(torch.ones(3)).tolist() == [2.0, 2.0, 2.0]
    assert len([w for w in caught if w.category is GraphMendWarning]) == 1
    with pytest.raises(ValueError, match=r"too large in torch\.Size\(\[3\]\)"):
        compiled(torch.full((3,), 20.0))


SHADOWING = """
import torch

def format_now():
    return "the module's own"

def f(x, n):
    print(f"n={n:>4}")
    if (x > 10).any():
        raise ValueError(f"bad n={n!r:>3}")
    return x + 1
"""


def test_text_baked_while_tracing_overwrites_no_global(load_rewritten, capsys):
    # TorchDynamo stores a constant result in the globals of the module it
    # compiles, under the function's name.
    module = load_rewritten(SHADOWING)
    torch._dynamo.reset()
    compiled = torch.compile(module.f, backend="eager")
    assert compiled(torch.ones(2), 3).tolist() == [2.0, 2.0]
    assert module.format_now() == "the module's own"
    with pytest.raises(ValueError, match=r"^bad n=  4$"):
        compiled(torch.full((2,), 20.0), 4)
    # n changed, so TorchDynamo made it symbolic: the print keeps its break and
    # runs before the guard, as eagerly (torch 2.5 failed to compile instead).
    assert capsys.readouterr().out == "n=   3\nn=   4\n"


SHAPES = """
import torch

def f(x):
    print("shape", x.shape)
    return x + 1
"""


def test_printing_a_size_that_turns_dynamic_compiles(load_rewritten, capsys):
    # The second call makes the size symbolic: torch 2.5 and 2.6 failed the
    # compile (InternalTorchDynamoError) where newer releases break the graph.
    module = load_rewritten(SHAPES)
    torch._dynamo.reset()
    compiled = torch.compile(module.f, backend="eager")
    for n in (2, 3, 4):
        assert compiled(torch.ones(n)).tolist() == [2.0] * n
    expected = "".join(f"shape torch.Size([{n}])\n" for n in (2, 3, 4))
    assert capsys.readouterr().out == expected


def test_an_old_dynamo_warns_once_that_sizes_in_output_keep_their_breaks():
    from torch._dynamo.variables import base

    old = not hasattr(base, "AsPythonConstantNotImplementedError")
    script = "import torch._dynamo, graphmend.runtime, graphmend.runtime.formatting"
    result = run_python("-W", "always", "-c", script)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("keep their graph breaks") == (1 if old else 0), result.stderr


def _describe(tracer: Any, *variables: Any) -> str:
    """A hook: the asking function's name and the values it passed, as TorchDynamo holds
    them."""
    return " ".join([tracer.f_code.co_name, *(str(v.as_python_constant()) for v in variables)])


def _no_answer(_tracer: Any) -> None:
    return None


def _asks(x: torch.Tensor) -> tuple[torch.Tensor, str, str]:
    return x + 1, ask_tracer(_describe, "eager", 3, "three"), ask_tracer(_no_answer, "default")


def test_the_tracer_answers_while_tracing_and_the_default_stands_otherwise():
    # The runtime's questions to TorchDynamo (runtime/asking.py): the hook gets the
    # asking function's translator and the values' variables; None leaves the default.
    assert _asks(torch.ones(1))[1:] == ("eager", "default")
    torch._dynamo.reset()
    counter = CompileCounter()
    result, answer, unanswered = torch.compile(_asks, backend=counter, fullgraph=True)(
        torch.ones(1)
    )
    assert (result.tolist(), answer, unanswered) == ([2.0], "_asks 3 three", "default")
    assert counter.frame_count == 1
