"""Runtime side of T3: a failing guard fails the compiled call, inside the graph.

``if <tensor condition>: raise E(message)`` is lowered, while tracing, to an
operation in the graph that raises when the condition holds:

* on CPU (and any device but CUDA) the custom operator
  ``graphmend::raise_if``, whose kernel raises ``E(message)`` itself, so the
  compiled call fails with the original exception type and message, under
  every backend (eager, aot_eager, inductor), from a frame at the original
  raise's line (the traceback ends at the user's source line);
* on CUDA ``torch._assert_async``, which never synchronises with the host and
  so keeps CUDA graphs possible: a failing guard becomes a device-side assert,
  reported at a later synchronisation as ``RuntimeError: CUDA error:
  device-side assert triggered``, after which the CUDA context is unusable.
  ``GRAPHMEND_CUDA_GUARDS=sync`` uses ``graphmend::raise_if`` on CUDA too: the
  original exception, at the price of a host synchronisation per guard (and no
  CUDA graphs);
* while ``torch.export`` traces, ``torch._assert_async`` on every device: an
  exported program then holds only standard operators and loads where
  GraphMend is not installed (a failing check raises ``RuntimeError``).

The message may only hold values known at trace time (shapes, dtypes, Python
values): text is formatted then, numbers travel into the graph and are
formatted by the kernel; module globals the message reads are read and formatted
by the kernel, when the guard fires.  A message that needs tensor data keeps the
original graph break.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from graphmend.config import ConfigError, cuda_guards
from graphmend.notices import warn
from graphmend.post_import import when_imported
from graphmend.runtime.asking import ask_tracer
from graphmend.runtime.attempts import (
    Site,
    check_before_compiling,
    first_line,
    guarded_sources,
    keep_numbers_unpinned,
    last_opened_site,
    local_guards,
    on_graph_break,
    on_trace_error,
    open_site,
)
from graphmend.runtime.catching import caught_by_caller, innermost_translator
from graphmend.runtime.conditions import is_scalar_tensor, truth, without_data
from graphmend.runtime.fallbacks import declined, resumes_after_break
from graphmend.runtime.formatting import (
    assume_constant_result,
    format_now,
    formattable_now,
    symbolic_while_tracing,
)
from graphmend.runtime.pending_effects import changed_sources, effects_pending
from graphmend.runtime.tracing import tracing
from graphmend.torch_releases import torch_release


def _sync_on_cuda() -> bool:
    try:
        return cuda_guards() == "sync"
    except ConfigError:  # reported when the hook was installed; the default then
        return False


_SYNC_ON_CUDA = _sync_on_cuda()
_operator_ready = False


Piece = str | tuple[str, list[Any]]
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def text(value: Any, conversion: int, spec: str) -> Piece | None:
    """A field of a guard's message: text now, or numbers to format when the guard fires.

    Numbers (ints, floats, bools) and shapes travel into the graph as numbers:
    under TorchDynamo they may be symbolic (a size, or a Python float made
    dynamic after it changed), so only the kernel can format them.  Other values
    whose text is fixed are formatted now.  ``None``: the field needs tensor
    data, or an object whose text could change, and the guard keeps its break.
    """
    if _is_number(value):
        return f"number:{_code(value)}:{conversion}:{spec}", [value]
    if type(value) in (tuple, list, torch.Size) and all(_is_number(item) for item in value):
        codes = "".join([_code(item) for item in value])
        return f"{_container(value)}:{codes}:{conversion}:{spec}", list(value)
    if not formattable_now(value):
        return None
    return _template_safe(format_now(value, conversion, spec))


def global_text(path: str, conversion: int, spec: str) -> Piece | None:
    """A field of a guard's message that reads a module global (``{STEP}``, ``{math.pi}``:
    ``path`` is the name and the attributes read of it): read and formatted by the kernel
    when the guard fires, as the original reads it only when it raises.  Read while
    tracing, TorchDynamo would guard on its value, and the frame compile again for every
    value it takes.  What the graph changes before the guard fires cannot have changed it:
    while Python state changes or inputs updated in place wait for the end of the graph,
    the guard keeps its break (:func:`lower_guard`).  ``None`` where the calling function's
    globals cannot be found.
    """
    key = ask_tracer(_register_caller_globals, None)
    if key is None:
        return None
    return f"global:{key}:{path}:{conversion}:{spec}", []


#: The globals of the functions whose guards' messages read them (:func:`global_text`),
#: by ``id``; held so that the key stays theirs.
_NAMESPACES: dict[int, dict[str, Any]] = {}


def _register_caller_globals(tracer: Any) -> int | None:
    """Asked while TorchDynamo traces :func:`global_text`: the key of the globals of the
    function that called it, registered in :data:`_NAMESPACES`."""
    namespace = getattr(getattr(tracer, "parent", None), "f_globals", None)
    if type(namespace) is not dict:
        return None
    _NAMESPACES[id(namespace)] = namespace
    return id(namespace)


def _read_global(key: int, path: str) -> Any:
    """The value ``path`` names in the registered globals ``key``, read as the original
    reads it: Python looks the name up itself (the module's globals, then its builtins),
    so that an unbound one raises the original's ``NameError``, with its ``name`` and the
    suggestion a traceback prints (``Did you mean: 'LIMIT'?``) taken from that module."""
    name, *attributes = path.split(".")
    # a name the rewrite wrote (an identifier), evaluated in the function's globals
    value = eval(name, _NAMESPACES[key])
    for attribute in attributes:
        value = getattr(value, attribute)
    return value


def _template_safe(piece: str) -> str | None:
    """``piece``, unless it holds the separator of :func:`_encode`'s template (text
    known only while tracing: the rewrite declines literal text that holds it)."""
    return None if _SEPARATOR in piece else piece


def _is_number(value: Any) -> bool:
    # type() rather than isinstance(): an IntEnum must keep its own text; under
    # TorchDynamo the type of a symbolic int, float or bool is int, float, bool.
    # An int beyond int64 cannot be an operator's argument (nor symbolic): it is
    # formatted now.  A symbolic int is not compared: one captured from .item()
    # would guard on data.
    if type(value) is int:
        return symbolic_while_tracing(value) or _INT64_MIN <= value <= _INT64_MAX
    return type(value) in (float, bool)


def _container(value: Any) -> str:
    # Not type(value).__name__: TorchDynamo 2.5 cannot make a constant of it.
    if type(value) is torch.Size:
        return "size"
    return "tuple" if type(value) is tuple else "list"


def _code(number: Any) -> str:
    """The letter that says which list of the operator carries ``number``."""
    if type(number) is int:
        return "i"
    return "f" if type(number) is float else "b"


_SEPARATOR = "\x1f"  # ASCII unit separator
_CONTAINERS: dict[str, Callable[[list[Any]], Any]] = {
    "number": lambda values: values[0],
    "size": torch.Size,
    "tuple": tuple,
    "list": list,
}


def _encode(pieces: list[Piece]) -> tuple[str, list[int], list[float], list[bool]]:
    """Pieces as one template string plus the numbers, by type (ints may be symbolic sizes).

    Built with f-strings and ``join`` only: TorchDynamo 2.13 traces neither
    ``str + str``, ``len(str)`` nor ``in`` on formatted text.  The rewrite
    declines messages whose literal text holds the separator.
    """
    template: list[str] = []
    numbers: dict[str, list[Any]] = {"i": [], "f": [], "b": []}
    for piece in pieces:
        if isinstance(piece, str):
            template.append(f"s{piece}")
            continue
        template.append(f"v{piece[0]}")
        for number in piece[1]:
            numbers[_code(number)].append(number)
    return _SEPARATOR.join(template), numbers["i"], numbers["f"], numbers["b"]


#: The conversion of a :func:`global_text` field that is the whole message
#: (``raise E(MESSAGE)``): the exception is given the global's value itself, as the original.
AS_GIVEN = 0


def _argument(template: str, ints: list[int], floats: list[float], bools: list[bool]) -> Any:
    """The exception's argument: the message :func:`_decode` builds, or the value of the
    global that is the whole message (``raise E(MESSAGE)``), whatever its type."""
    if template.startswith("vglobal:") and _SEPARATOR not in template:
        key, path, conversion, _ = template.removeprefix("vglobal:").split(":", 3)
        if int(conversion) == AS_GIVEN:
            return _read_global(int(key), path)
    return _decode(template, ints, floats, bools)


def _decode(template: str, ints: list[int], floats: list[float], bools: list[bool]) -> str:
    """The message :func:`_encode` describes, with the numbers' run-time values."""
    remaining = {"i": iter(ints), "f": iter(floats), "b": iter(bools)}
    parts: list[str] = []
    for encoded in template.split(_SEPARATOR) if template else []:
        if encoded[0] == "s":
            parts.append(encoded[1:])
            continue
        if encoded.startswith("vglobal:"):
            key, path, conversion, spec = encoded.removeprefix("vglobal:").split(":", 3)
            parts.append(format_now(_read_global(int(key), path), int(conversion), spec))
            continue
        kind, codes, conversion, spec = encoded[1:].split(":", 3)
        values = [next(remaining[code]) for code in codes]
        parts.append(format_now(_CONTAINERS[kind](values), int(conversion), spec))
    return "".join(parts)


def lowerable(condition: Any, *earlier: Any) -> bool:
    """Whether :func:`lower_guard` can put this guard into the graph (message not built
    yet).  Opens the guard's site (``attempts.open_site``): building the message may
    guard on a number argument's value, which :func:`lower_guard` takes back."""
    return (
        tracing()
        and _lowerable(condition, *earlier)
        and open_site("trap") is None
        and _lowering_allowed()
    )


def _lowering_allowed() -> bool:
    """Whether what lowering needs, apart from the message, holds here: checked before
    the message is built, whose numbers a float argument reads with an operation, left
    in a graph of its own where the guard then stays in Python (fuzz seed 3744)."""
    if not _operator_ready:
        declined("trap", "GraphMend's guard operator is not defined (see its warning)")
        return False
    if effects_pending():
        declined("trap", "output or Python state changes wait for the end of the graph")
        return False
    if caught_by_caller():
        declined(
            "trap",
            "a calling function may catch the exception or needs a with block's exit "
            "(the call is inside its try, except or with)",
        )
        return False
    if not _operator_kept():
        declined(
            "trap",
            f"on torch {torch.__version__}, TorchInductor drops an operator with no outputs "
            "(GraphMend's guard), and this backend may be TorchInductor",
        )
        return False
    return True


def _lowerable(condition: Any, *earlier: Any) -> bool:
    if without_data(condition, *earlier):
        return False
    if is_scalar_tensor(condition):
        return True
    # a Python condition, after tensor ones: its truth is read only then (a symbolic
    # one, a number read from a tensor, is read where the original reads it)
    return any(is_scalar_tensor(value) for value in earlier) and bool(condition)


def names_formattable() -> bool:
    """Whether a message that formats a name's value (``{t}``) may be built while tracing.

    Not where TorchDynamo pins Python floats to their values (``specialize_float``,
    torch 2.5's default): reading a float the caller passes would recompile the
    graph for every new value, where the original guard leaves it out of the graph.
    """
    if _floats_pinned():
        declined("trap", "the message formats a value TorchDynamo would pin (specialize_float)")
        return False
    return True


def _floats_pinned() -> bool:
    """``torch._dynamo.config.specialize_float``, read while tracing (marked as a
    constant-result function)."""
    return bool(torch._dynamo.config.specialize_float)


def exact_text(value: Any) -> str | None:
    """A message given as a name: usable only if it is a string at trace time."""
    return _template_safe(value) if type(value) is str else None


def lower_guard(
    condition: Any,
    exception: type[BaseException],
    message: list[Piece | None],
    has_message: bool,
    where: str,
    *earlier: Any,
    negated: bool = False,
) -> bool:
    """Put ``if condition: raise exception(message)`` into the graph; False if it cannot.

    ``where`` is the original raise's ``line:qualname:file``, where the exception is
    raised from.  ``earlier`` are the conditions of the preceding guards of an
    ``if/elif`` chain: this guard fires only where none of them did.  ``negated``: the
    guard fires where ``condition`` is false (an assert's test), its negation computed
    only here, where the guard is lowered: computed before, and the guard kept in
    Python, it was a graph of its own where plain compile's frame had none (fuzz seed
    3744).  When False is returned the caller decides in Python, exactly as the original
    code.
    """
    if not _lowerable(condition, *earlier):
        return False
    # a message reading a number argument (f"at step {n}") guarded on its value, where
    # the original reads it only when the guard fires: the site keeps its break
    keep_numbers_unpinned()
    # an instance, or a function that makes one: checked before _exception_path is
    # given it (TorchDynamo 2.5 refuses such arguments to a constant-result function)
    is_class = isinstance(exception, type) and issubclass(exception, BaseException)
    path = _exception_path(exception) if is_class else None
    if path is None:
        declined("trap", "the exception's class cannot be found again by its name")
        return False
    if any(piece is None for piece in message):
        declined("trap", "the message needs tensor data, or text that may change")
        return False
    earlier_tensors = [value for value in earlier if is_scalar_tensor(value)]
    if is_scalar_tensor(condition):
        fires = torch.logical_not(truth(condition)) if negated else truth(condition)
    else:  # a true Python condition that fires where no earlier guard did
        fires = torch.ones((), dtype=torch.bool, device=earlier_tensors[0].device)
    for value in earlier_tensors:
        fires = torch.logical_and(fires, torch.logical_not(truth(value)))
    if _asserts_on(fires.device.type):
        static = "".join(piece if isinstance(piece, str) else "?" for piece in message)  # type: ignore[misc]
        torch._assert_async(torch.logical_not(fires), static)
    else:
        template, ints, floats, bools = _encode(message)  # type: ignore[arg-type]
        # floats travel as a float64 tensor: a float[] argument would pin a float
        # TorchDynamo made symbolic to its value, and recompile for every new one
        carried = torch.tensor(floats, dtype=torch.float64)
        torch.ops.graphmend.raise_if(
            fires, path, template, ints, carried, bools, has_message, where
        )
    ask_tracer(_watch_code_after, None)
    return True


def _watch_code_after(tracer: Any) -> None:
    """Asked while TorchDynamo traces :func:`lower_guard`, once the guard is in the graph.

    The code after the guard is traced into the same graph, for every call, those whose
    guard fails included, where the original raises before that code: the site keeps its
    break (:meth:`attempts.Site.keep_break`) where

    * tracing that code fails (``x.view(2, -1)`` of 5 elements, when the guard fails for
      odd sizes): the compile failed with ``TorchRuntimeError`` where plain compile raises
      the guard's exception;
    * in the rest of a function resumed after a graph break, that code guards on a local,
      or a part of one (``cfg.mode``), nothing before the guard did: there the function's
      own values are the frame's locals, whose types and sizes follow the data it branched
      on (a local that is a tensor or ``None`` after an ``if`` on a tensor), as the guard's
      condition does, and a call the guard fails would compile the frame again, where
      plain compile raises;
    * that code, holding no tensor operation, guards on what it changes itself
      (``global STEP; STEP += 1``, ``self.calls += 1``): the graph would be compiled
      again on every call, where plain compile leaves that code to the frame resumed
      after the guard's break, which makes no graph;
    * the graph breaks again after the guard, with no operation between, and that code
      guarded on something new (a value read before a store TorchDynamo breaks at).
    """
    output = tracer.output
    site = last_opened_site(output)
    if site is None or site.one_graph:
        return
    on_trace_error(output, lambda error: _keep_break_after_error(site, error))
    guarded, nodes = guarded_sources(output), set(output.graph.nodes)
    check_before_compiling(
        output, lambda _: _keep_changed_state_unguarded(site, output, guarded, nodes)
    )
    on_graph_break(output, lambda: _keep_guards_before_a_break(site, output, guarded, nodes))
    if resumes_after_break(output.root_tx.f_code.co_name):
        before = local_guards(output)
        check_before_compiling(output, lambda _: _keep_locals_unguarded(site, output, before))


def _keep_break_after_error(site: Site, error: BaseException) -> None:
    site.keep_break(
        f"the code after it cannot be traced for these inputs ({first_line(error)}), "
        "where the original runs it only when the guard passes"
    )


def _keep_changed_state_unguarded(
    site: Site, output: Any, before: set[str], nodes: set[Any]
) -> None:
    """Keep the break where the code after the guard guards on what it changes, and holds
    no operation (``nodes``: the graph's when the guard was lowered): with one, plain
    compile's resumed frame makes a graph too, compiled again as often."""
    if _operations_since(output, nodes):
        return
    changed = sorted((guarded_sources(output) - before) & changed_sources(output))
    if changed:
        site.keep_break(
            f"the code after it guards on {changed[0]}, which it changes: each call would "
            "compile the graph again"
        )


def _keep_guards_before_a_break(site: Site, output: Any, before: set[str], nodes: set[Any]) -> None:
    """Keep the break where the graph breaks again after the guard with no operation
    between, and that code guarded on something nothing before the guard did
    (``STATE.epoch`` read before a store TorchDynamo breaks at): plain compile leaves that
    code to the frame resumed after the guard's break, which makes no graph, while here it
    joins the guard's graph, compiled again whenever that value changes.  Lowered, such a
    guard would save no graph."""
    if _operations_since(output, nodes):
        return
    new = sorted(guarded_sources(output) - before)
    if new:
        site.keep_break(
            f"the code after it guards on {new[0]} and breaks before any operation: the "
            "guard's graph would be compiled again whenever that value changes"
        )


def _operations_since(output: Any, nodes: set[Any]) -> bool:
    """Whether the graph ``output`` traces holds an operation not among ``nodes``."""
    return any(node.op.startswith("call") for node in output.graph.nodes if node not in nodes)


def _keep_locals_unguarded(site: Site, output: Any, before: set[str]) -> None:
    later = sorted(local_guards(output) - before)
    if later:
        site.keep_break(
            f"the code after it guards on {later[0]}, of what the function computed before "
            "a graph break: a call the guard fails would compile the frame again"
        )


#: From this torch release on, TorchInductor keeps an operator marked with
#: ``torch.fx.node.has_side_effect``; torch 2.5's scheduler dropped it, as it drops any
#: fallback operator whose outputs are unused and whose schema mutates nothing.
_INDUCTOR_KEEPS_GUARDS = (2, 13)
#: Backends that run the graph's operators as they are (``torch._dynamo.testing``'s
#: counters run it so too).
_OPERATOR_BACKENDS = ("eager", "aot_eager")


def _operator_kept() -> bool:
    """Whether the backend compiling the current graph keeps ``graphmend::raise_if``.

    Marked as a constant-result function: it reads the backend off TorchDynamo's
    translator while tracing.  On a torch release before :data:`_INDUCTOR_KEEPS_GUARDS`
    only backends known to run the graph as it is are trusted (any other may hand it to
    TorchInductor, and the guard would never fire)."""
    release = torch_release(torch.__version__)
    if release is not None and release >= _INDUCTOR_KEEPS_GUARDS:
        return True
    # TorchDynamo's wrapper (WrapBackendDebug): the backend's name, and the backend
    compiler = getattr(getattr(innermost_translator(), "output", None), "compiler_fn", None)
    from torch._dynamo.testing import CompileCounter

    if isinstance(getattr(compiler, "compiler_fn", None), CompileCounter):
        return True
    return getattr(compiler, "compiler_name", None) in _OPERATOR_BACKENDS


def _asserts_on(device_type: str) -> bool:
    """Whether a guard on this device becomes ``torch._assert_async`` (else ``raise_if``).

    Marked as a constant-result function, so that it runs in Python while
    TorchDynamo traces: ``torch.compiler.is_exporting()`` is then the truth.
    An exported program holds only standard operators, so that it loads and
    runs where GraphMend is not installed.
    """
    if device_type == "cuda" and not _SYNC_ON_CUDA:
        return True
    is_exporting = getattr(torch.compiler, "is_exporting", None)
    if is_exporting is None:
        _warn_export_needs_graphmend()
        return False
    return is_exporting()


@functools.cache
def _warn_export_needs_graphmend() -> None:
    warn(
        f"GraphMend: torch {torch.__version__} has no torch.compiler.is_exporting(), so "
        "programs exported with torch.export keep GraphMend's guard operator "
        "graphmend::raise_if: `import graphmend.runtime` before torch.export.load() "
        "where they are loaded"
    )


#: The exception classes of the guards lowered in this process, by the path given to the
#: operator: what it raises is the class traced, as the original ``raise`` raises the
#: class its name held then (TorchDynamo guards on that name), even after the module
#: defining it was reloaded or dropped from ``sys.modules``.
_TRACED_CLASSES: dict[str, type[BaseException]] = {}
#: The path of each class traced: its name, and how many classes of that name were
#: traced before it (``errors:ShapeError#0``, ``#1`` after a reload), the same in
#: every process that traces the same program, so that the graph, which holds the path,
#: finds TorchInductor's caches again.
_PATHS: dict[type[BaseException], str] = {}


def _exception_path(exception: type[BaseException]) -> str | None:
    """Where the kernel finds ``exception`` again: ``module:qualname#n``, a key of
    :data:`_TRACED_CLASSES` in this process and a name in another (a saved exported
    program); None for a local class, or one not found again by its name: the original
    ``raise`` then decides.

    Marked as a constant-result function: TorchDynamo 2.5 cannot trace string
    operations on a class's ``__qualname__``.
    """
    name = f"{exception.__module__}:{exception.__qualname__}"
    if _class_named(name) is not exception:
        return None
    path = _PATHS.get(exception)
    if path is None:
        earlier = sum(1 for each in _TRACED_CLASSES if each.partition("#")[0] == name)
        path = _PATHS[exception] = f"{name}#{earlier}"
        _TRACED_CLASSES[path] = exception
    return path


def _exception_class(path: str) -> type[BaseException] | None:
    """The class a lowered guard raises, by the path :func:`_exception_path` gave."""
    traced = _TRACED_CLASSES.get(path)
    return traced if traced is not None else _class_named(path.partition("#")[0])


def _class_named(name: str) -> type[BaseException] | None:
    module_name, _, qualname = name.partition(":")
    target: Any = sys.modules.get(module_name)
    for attribute in qualname.split("."):
        target = getattr(target, attribute, None)
    if isinstance(target, type) and issubclass(target, BaseException):
        return target
    return None


# Written out rather than inferred from annotations: inference differs between
# torch releases (2.5 and 2.6 refuse ``list[int]``).
_SCHEMA = (
    "(Tensor cond, str exception, str template, SymInt[] ints, Tensor floats, bool[] bools, "
    "bool has_message, str where) -> ()"
)


def _raise_if(
    cond: torch.Tensor,
    exception: str,
    template: str,
    ints: list[int],
    floats: torch.Tensor,
    bools: list[bool],
    has_message: bool,
    where: str,
) -> None:
    if not bool(cond):
        return
    exception_class = _exception_class(exception) or RuntimeError
    if has_message:
        _raise_at(exception_class(_argument(template, ints, floats.tolist(), bools)), where)
    _raise_at(exception_class(), where)


def _raise_at(error: BaseException, where: str) -> None:
    """Raise ``error`` from a frame at the original raise's line (``line:qualname:file``),
    so that the traceback ends at the user's source line, as the original raise's does."""
    line, qualname, filename = where.split(":", 2)
    code = compile("raise error", filename, "exec", dont_inherit=True)
    renamed: dict[str, Any] = {"co_firstlineno": int(line), "co_name": qualname.split(".")[-1]}
    if sys.version_info >= (3, 11):
        renamed["co_qualname"] = qualname
    exec(code.replace(**renamed), {"error": error})


def _no_output(*_args: Any) -> None:
    """The operator's meta kernel: it produces nothing."""


def _define_operator(dynamo: ModuleType) -> None:
    """Register ``graphmend::raise_if`` (once TorchDynamo is imported: tracing needs it)."""
    global _operator_ready
    if _operator_ready:
        return
    operator = torch.library.custom_op("graphmend::raise_if", mutates_args=(), schema=_SCHEMA)(
        _raise_if
    )
    operator.register_fake(_no_output)
    assume_constant_result(dynamo, _exception_path)
    assume_constant_result(dynamo, _asserts_on)
    assume_constant_result(dynamo, _operator_kept)
    assume_constant_result(dynamo, _floats_pinned)
    from torch.fx.node import has_side_effect

    has_side_effect(torch.ops.graphmend.raise_if.default)
    _operator_ready = True


when_imported("torch._dynamo", _define_operator)
