"""Run a generated program plain and through GraphMend, eagerly and compiled, and record
everything a caller can observe; compare two such records."""

from __future__ import annotations

import contextlib
import io
import itertools
import logging
import re
import sys
import types
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch._dynamo
from torch import nn
from torch._dynamo import convert_frame
from torch._dynamo.resume_execution import ContinueExecutionCache
from torch._dynamo.testing import CompileCounter
from torch._dynamo.utils import counters

from graphmend.config import DEFAULT_REWRITES
from graphmend.pipeline import compile_module, rewrite
from helpers.programs import Call, Program

FILENAME = "<program>"

_names = itertools.count()

Event = tuple[str, ...]


@dataclass
class Observed:
    """What one call showed the caller."""

    result: Any  # cloned output, or None when the call raised
    error: tuple[str, str] | None  # exception type and message
    input_after: torch.Tensor  # the caller's tensor after the call
    state: dict[str, torch.Tensor]  # the module's buffers after the call
    events: list[Event]  # printed text, log records and warnings, in order
    # per tensor of the output: which tensor it shares memory with, if any (0: the
    # caller's; then the module's buffers; then the output's earlier tensors), which the
    # caller would see updated by updating it
    shares_memory: tuple[int | None, ...]


@dataclass
class Run:
    """The calls of one program in one configuration; graph counts when compiled."""

    calls: list[Observed]
    graphs: int | None = None
    breaks: int | None = None
    abandoned: int | None = None  # compiles TorchDynamo gave up: the frame ran eagerly
    # whether the frame of ``forward`` itself (not only a resume function) kept compiled
    # code: given up whole, it ran in Python, its code before the first break too (a
    # frame without tensor operations keeps none either)
    forward_compiled: bool | None = None
    # the names of the frames (``forward``, resume functions named by the line they
    # resume at) a compile gave up and ran in Python, and of those holding compiled code
    given_up: frozenset[str] = frozenset()
    compiled_frames: frozenset[str] = frozenset()


def load(program: Program, name: str, *, mended: bool) -> tuple[nn.Module, logging.Logger]:
    """The program's module ``M`` (built from a fixed seed) and its logger, from the
    original source or rewritten by the default rewrites, executed as module ``name``
    in ``sys.modules`` (GraphMend's runtime finds exception classes there)."""
    module = types.ModuleType(name)
    sys.modules[name] = module
    if mended:
        result = rewrite(program.source, FILENAME, DEFAULT_REWRITES)
        code = compile_module(result.tree, FILENAME)
    else:
        code = compile(program.source, FILENAME, "exec", dont_inherit=True)
    exec(code, module.__dict__)
    torch.manual_seed(0)
    return module.M(), module.logger


def run(
    program: Program,
    *,
    mended: bool,
    compiled: bool,
    fullgraph: bool = False,
    dynamic: bool | None = None,
) -> Run:
    """Call the program's module with each of the program's calls, in order; compiled
    (``dynamic`` as ``torch.compile`` takes it), a failure to compile is the call's
    exception."""
    name = f"gm_property_{next(_names)}"
    try:
        module, logger = load(program, name, mended=mended)
        if not compiled:
            return Run(
                [_call(module, module, logger, call, program.grad) for call in program.calls]
            )
        torch._dynamo.reset()
        counters.clear()
        counter = CompileCounter()
        function = torch.compile(module, backend=counter, fullgraph=fullgraph, dynamic=dynamic)
        observed: list[Observed] = []
        compiled_frames: set[str] = set()
        with _frames_given_up() as given_up:
            for call in program.calls:
                observed.append(_call(module, function, logger, call, program.grad))
                # after each call: torch 2.5 drops the code of a frame it gives up later
                compiled_frames |= _frames_compiled(module)
        frames = counters["frames"]
        skipped = [name for name, error in given_up if _skipped_at_a_loop(error)]
        return Run(
            observed,
            counter.frame_count,
            _breaks() + len(skipped),
            frames["total"] - frames["ok"] + len(skipped),
            _compiled(module),
            frozenset(name for name, error in given_up if _ran_in_python(error)),
            frozenset(compiled_frames),
        )
    finally:
        del sys.modules[name]


def _breaks() -> int:
    """The places the compiles since ``counters.clear()`` broke the graph: each break
    makes a resume function named by its line (TorchDynamo 2.13 counts a break at a
    data-dependent branch in no ``graph_break`` counter, and makes a resume function
    again when it restarts an analysis, so the places are counted, not the resumes),
    and each compile TorchDynamo gave up (its frame ran eagerly: ``f"{t}"`` of a float
    made symbolic, a break it could not resume after)."""
    frames = counters["frames"]
    return len(_resume_functions()) + frames["total"] - frames["ok"]


@contextlib.contextmanager
def _frames_given_up() -> Iterator[list[tuple[str, Exception]]]:
    """Each frame a compile gave up (its name, and why), seen where the compile of the
    frame ends (the error leaving the tracing of its code), not where the tracer gives
    up: GraphMend may restart that analysis (``skipped_frames``), and then the frame is
    compiled.  (Not from ``convert_frame``'s debug log: with it enabled, torch 2.5
    prints to stdout.)"""
    given_up: list[tuple[str, Exception]] = []
    original = convert_frame.transform_code_object

    def transform_code_object(code: types.CodeType, *args: Any, **kwargs: Any) -> Any:
        try:
            return original(code, *args, **kwargs)
        except torch._dynamo.exc.RestartAnalysis:
            raise
        except Exception as error:
            given_up.append((code.co_name, error))
            raise

    convert_frame.transform_code_object = transform_code_object
    try:
        yield given_up
    finally:
        convert_frame.transform_code_object = original


def _ran_in_python(error: Exception) -> bool:
    """Whether TorchDynamo runs the frame in Python after ``error`` ended its compile (a
    break it cannot resume after), not gives ``error`` to the caller (a failure on fake
    tensors, a data-dependent guard: ``UserError``)."""
    failures = torch._dynamo.exc
    return isinstance(error, failures.SkipFrame | failures.Unsupported) and not isinstance(
        error, failures.UserError
    )


#: Why TorchDynamo 2.5 gives a frame up at a break inside a loop.
_SKIPPED_AT_A_LOOP = "Skipping frame because there is a graph break in a for/while loop"


def _skipped_at_a_loop(error: Exception) -> bool:
    """Whether TorchDynamo 2.5 gave the frame up at a break inside a loop: it counts the
    frame as compiled (``frames["ok"]``) and only logs it (2.13 counts it as failed)."""
    return isinstance(error, torch._dynamo.exc.SkipFrame) and str(error).startswith(
        _SKIPPED_AT_A_LOOP
    )


def _resume_functions() -> set[str]:
    """The names of the resume functions made since ``torch._dynamo.reset()``, one per
    place a compile broke: TorchDynamo 2.13 counts them (``counters["resumes"]``), 2.5
    does not, and only its cache of them holds them."""
    return {code.co_name for code in _resume_codes()} | set(counters["resumes"])


def _resume_codes() -> list[types.CodeType]:
    """The code of the resume functions TorchDynamo made (its cache of them, by the code
    they resume, then by the break's state; an ``ExactWeakKeyDictionary``, whose
    ``values`` is a dict)."""
    made = ContinueExecutionCache.cache.values
    return [code for by_state in made.values() for code in by_state.values()]


def _compiled(module: nn.Module) -> bool:
    """Whether TorchDynamo holds compiled code for the frame of ``module``'s ``forward``."""
    return _holds_compiled_code(type(module).forward.__code__)


def _holds_compiled_code(code: types.CodeType) -> bool:
    return bool(torch._C._dynamo.eval_frame._debug_get_cache_entry_list(code))


def _frames_compiled(module: nn.Module) -> set[str]:
    """The names of ``forward`` and the resume functions holding compiled code."""
    codes = [type(module).forward.__code__, *_resume_codes()]
    return {code.co_name for code in codes if _holds_compiled_code(code)}


def _without_symbol_names(message: str) -> str:
    """``message`` with TorchDynamo's names of symbolic sizes (``s77``, ``u0``) made one:
    it numbers them in the order a trace makes them, so a trace that made other symbols
    first names the same size otherwise."""
    return re.sub(r"\b[su]\d+\b", "s?", message)


#: What stays of TorchDynamo's report of an operation that failed on fake tensors (torch
#: 2.13: "failed to run FX node with fake tensors: call_method reshape(...)", 2.5:
#: "Failed running call_method reshape(...)"): the operation and the program's line.
_FAKE_TRACE_FAILURE = re.compile(
    r"(?:fake tensors: |Failed running )(?P<operation>call_\w+ [\w.]+)\(.*"
    r"(?P<line>line \d+), in ",
    re.DOTALL,
)


def _error_message(exception: Exception) -> str:
    """The message of ``exception`` as compared between runs.

    An operation that fails while TorchDynamo traces it on fake tensors (the program
    fails eagerly too) is reported with the fake tensors' sizes, static or symbolic
    depending on which sizes the frame traced before (automatic dynamic shapes): a
    frame whose break GraphMend removed traces fewer calls, so the same failure shows
    ``size=(3, 4)`` where plain's shows ``size=(s?, 4)``.  Only the operation and the
    line are compared there.
    """
    message = str(exception)
    failure = _FAKE_TRACE_FAILURE.search(message)
    if isinstance(exception, torch._dynamo.exc.TorchRuntimeError) and failure:
        return "{operation} failed on fake tensors at {line}".format(**failure.groupdict())
    return _without_symbol_names(message)


def _call(
    module: nn.Module, function: Any, logger: logging.Logger, call: Call, grad: bool
) -> Observed:
    x = call.tensor()
    events: list[Event] = []
    result, error, shares = None, None, ()
    with _capture(logger, events), torch.set_grad_enabled(grad):
        try:
            output = function(x, call.t)
            buffers = [buffer for _, buffer in module.named_buffers()]
            result, shares = _clone(output), _sharing(_tensors(output), [x, *buffers])
        except Exception as exception:
            error = (type(exception).__name__, _error_message(exception))
    state = {name: value.detach().clone() for name, value in module.named_buffers()}
    return Observed(result, error, x.clone(), state, _merge_prints(events), shares)


@contextlib.contextmanager
def _capture(logger: logging.Logger, events: list[Event]) -> Iterator[None]:
    """Record the program's printed text, log records and warnings into ``events``."""

    class Handler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            events.append(("log", record.levelname, record.getMessage()))

    class Stdout(io.TextIOBase):
        def write(self, text: str) -> int:
            events.append(("print", text))
            return len(text)

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        if filename == FILENAME:  # not Dynamo's own warnings
            events.append(("warning", category.__name__, str(message)))

    handler = Handler(logging.DEBUG)
    level, propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(Stdout()):
            warnings.simplefilter("always")
            warnings.showwarning = show
            yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


def _merge_prints(events: list[Event]) -> list[Event]:
    """One ``print`` event per run of consecutive writes (``print`` writes in pieces)."""
    merged: list[Event] = []
    for event in events:
        if event[0] == "print" and merged and merged[-1][0] == "print":
            merged[-1] = ("print", merged[-1][1] + event[1])
        else:
            merged.append(event)
    return merged


def _tensors(value: Any) -> list[torch.Tensor]:
    """The tensors in ``value`` (nested tuples and lists), in order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, tuple | list):
        return [tensor for item in value for tensor in _tensors(item)]
    return []


def _sharing(outputs: list[torch.Tensor], known: list[torch.Tensor]) -> tuple[int | None, ...]:
    """For each of ``outputs``, the index of the first tensor of ``known`` and then of
    the earlier outputs that shares its memory, or ``None``."""
    storages = [tensor.untyped_storage()._cdata for tensor in (*known, *outputs)]
    return tuple(
        storages.index(storages[len(known) + i])
        if storages.index(storages[len(known) + i]) < len(known) + i
        else None
        for i in range(len(outputs))
    )


def _clone(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, tuple | list):
        return type(value)(_clone(item) for item in value)
    return value


def same(left: Any, right: Any) -> bool:
    """Equal bit for bit (NaN equals NaN, -0.0 differs from 0.0), dtypes and shapes
    included; tuples, lists and dicts element by element."""
    if isinstance(left, torch.Tensor) or isinstance(right, torch.Tensor):
        if not (isinstance(left, torch.Tensor) and isinstance(right, torch.Tensor)):
            return False
        if left.dtype != right.dtype or left.shape != right.shape:
            return False
        if left.is_floating_point():
            bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[left.element_size()]
            return torch.equal(left.view(bits), right.view(bits))
        return torch.equal(left, right)
    if isinstance(left, tuple | list) and isinstance(right, tuple | list):
        return (
            type(left) is type(right)
            and len(left) == len(right)
            and all(same(a, b) for a, b in zip(left, right, strict=True))
        )
    if isinstance(left, dict) and isinstance(right, dict):
        return left.keys() == right.keys() and all(same(left[k], right[k]) for k in left)
    return bool(left == right)


def _short(value: Any, limit: int = 600) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + " ..."


def differences(references: Mapping[str, Run], actual: Run) -> list[str]:
    """Each thing ``actual`` (GraphMend) shows the caller that no reference run (by
    label: plain eager, plain compiled) shows, call by call."""
    found = []
    for index, observed in enumerate(actual.calls):
        for field in ("error", "result", "input_after", "state", "events", "shares_memory"):
            wanted = {label: getattr(run.calls[index], field) for label, run in references.items()}
            got = getattr(observed, field)
            if not any(same(want, got) for want in wanted.values()):
                shown = "".join(f"\n    {label}: {_short(want)}" for label, want in wanted.items())
                found.append(f"call {index}: {field} differs{shown}\n    graphmend: {_short(got)}")
    return found


def more_graphs(plain: Run, mended: Run) -> str | None:
    """Why GraphMend's compiled run is more fragmented than plain's, or ``None``.

    Never more graph breaks; never more graphs, except one per break GraphMend
    removed: plain compile makes no graph of a stretch of code without tensor
    operations between two breaks (``print(t)``), while the same stretch without its
    break is compiled into one.  Never ``forward``'s frame given up whole where plain
    compiled its code before the first break (a break in a loop gives the frame up).
    Graphs and breaks not compared where plain compile ran a frame in Python that
    GraphMend compiles, in part or whole.
    """
    assert plain.graphs is not None and mended.graphs is not None
    assert plain.breaks is not None and mended.breaks is not None
    if plain.forward_compiled and mended.abandoned and not mended.forward_compiled:
        return "forward's frame given up whole, where plain compiles it up to its first break"
    if _compiles_what_plain_gives_up(plain, mended):
        return None
    allowed = plain.graphs + max(0, plain.breaks - mended.breaks)
    if mended.breaks > plain.breaks or mended.graphs > allowed:
        return (
            f"more graphs or breaks: plain {plain.graphs} graphs, {plain.breaks} breaks; "
            f"graphmend {mended.graphs} graphs, {mended.breaks} breaks"
        )
    return None


def _compiles_what_plain_gives_up(plain: Run, mended: Run) -> bool:
    """Whether plain compile ran a frame in Python, to its end, that GraphMend compiles:
    there the code after what failed plain's frame makes neither graphs nor breaks in
    plain's run.  Either GraphMend gives up fewer frames (under ``dynamic=True``,
    ``f"{t}"`` of the symbolic float ``t`` fails plain's frame), or plain gives up
    ``forward`` whole, at a break in a loop that GraphMend removes, or for one call (a
    size that turns dynamic), and GraphMend compiles its code up to a break it keeps; or
    GraphMend compiles a frame plain gave up (a resume function given up at a break in a
    loop that GraphMend removes, compiled up to a break GraphMend keeps after the loop,
    which plain's run never reaches in a compile)."""
    if not plain.abandoned:
        return False
    assert mended.abandoned is not None
    return (
        mended.abandoned < plain.abandoned
        or not plain.forward_compiled
        or bool(plain.given_up & mended.compiled_frames - plain.compiled_frames)
    )
