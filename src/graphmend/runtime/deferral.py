"""Runtime side of T2: capture values at the call point, make the call after the graph.

TorchDynamo runs calls to functions in ``config.reorderable_logging_functions``
after the graph, with arguments that are tensors or constants: not a tuple, a
``torch.Size`` or a size that has become symbolic.  Rewritten code therefore
calls one generated function per site (decorated with :func:`deferred`) with
each value flattened by :func:`capture` into such tokens (``*`` unpacked into
the call), and the generated function puts the values together again with
:func:`rebuild` before it makes the original call::

    _@gm_defer3(*_@gm_rt.capture(h.shape))      # "S", 2, tensor(2), tensor(8)
    def _@gm_defer3(*gm_tokens_):
        (gm_p4_,) = _@gm_rt.rebuild(gm_tokens_)  # torch.Size([2, 8])
        logger.debug("shape %s", gm_p4_)

Tensors are copied (later in-place updates do not show; a parameter is made one
again after the graph), integers and floats
TorchDynamo holds as constants travel as they are, symbolic ones as 0-d
int64/float64 tensors (exact: graph outputs instead of a graph break), and
tuples, lists and
sizes are rebuilt from their items.  Anything else is passed as it is:
TorchDynamo refuses to carry it, and the original call runs where it was,
with its graph break.  Registration waits until TorchDynamo is imported, so
that importing a rewritten module never imports it.
"""

from __future__ import annotations

import functools
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch

from graphmend.post_import import when_imported
from graphmend.runtime import dynamo_support, formatting
from graphmend.runtime.asking import ask_tracer
from graphmend.runtime.attempts import check_before_compiling, open_site, opened_site
from graphmend.runtime.formatting import format_now, held_while_tracing
from graphmend.runtime.marked_sizes import run_in_python_where_pinned
from graphmend.runtime.skipped_frames import keep_first_break_if_frame_lost
from graphmend.runtime.tracing import dynamo_traces
from graphmend.runtime.transforms import inside_a_transform

F = TypeVar("F", bound=Callable[..., None])

_deferred_functions: list[Callable[..., None]] = []
_enabled = False

_INT64 = (-(2**63), 2**63)
_SEQUENCES: dict[type, str] = {tuple: "tuple", list: "list", torch.Size: "size"}
#: Filled from TorchDynamo's own list once it is imported (see _learn_constant_types).
_CONSTANT_TYPES: dict[type, None] = dict.fromkeys((int, float, bool, str, type(None)))
_REBUILD: dict[str, Callable[[list[Any]], Any]] = {"tuple": tuple, "list": list, "size": torch.Size}


def capture(value: Any, carried: bool = True) -> tuple[Any, ...]:
    """``value`` as it is now, as tokens TorchDynamo can carry out of a graph.

    ``carried`` False (:func:`carriable` said no for the call): ``value`` as it
    is, wrapped so that TorchDynamo refuses it too, with no copy made (a copy
    would be an operation in a graph the original, breaking at the call, does
    not have).  Outside TorchDynamo, where ``torch.compiler.is_compiling()`` is
    true as well (``torch.export``'s non-strict mode runs the code in Python),
    nothing defers the call: it is made at once, with ``value`` as it is.
    """
    if not carried or not dynamo_traces():
        return ("opaque", (value,))
    if type(value) is torch.nn.Parameter:
        # copied like any tensor (a later in-place update must not show), and made a
        # parameter again after the graph, so that it prints as one
        return ("parameter", value.detach().clone(), value.requires_grad)
    if isinstance(value, torch.nn.Parameter):
        # a subclass cannot be rebuilt: a tuple TorchDynamo refuses, so the original
        # call runs where it stands
        return ("opaque", (value,))
    if isinstance(value, torch.Tensor):
        return ("tensor", value.clone())
    kind = type(value)
    if kind in (int, float):
        return _capture_number(value)
    if kind in _SEQUENCES:
        tokens: tuple[Any, ...] = (_SEQUENCES[kind], len(value))
        for item in value:
            tokens += capture(item)
        return tokens
    return ("value", value)


def _capture_number(value: int | float) -> tuple[Any, ...]:
    """:func:`capture` of an ``int`` or a ``float`` (its type, even when symbolic)."""
    held = held_while_tracing(value)
    if held == "constant":
        # a constant travels as it is: no tensor made for it, no graph where
        # the original, breaking at the call, had none
        return ("value", value)
    if type(value) is float:
        return ("float", torch.scalar_tensor(value, dtype=torch.float64))
    # A symbolic int is an int64 in the graph; one captured from .item() must not be
    # compared (a guard on data: a graph break inside GraphMend, where the original
    # had one at the call).
    if held == "symbolic" or _INT64[0] <= value < _INT64[1]:
        return ("int", torch.scalar_tensor(value, dtype=torch.int64))
    return ("value", value)


def carriable(*values: Any) -> bool:
    """Whether TorchDynamo may carry every one of ``values`` out of the graph (False:
    one is surely refused, a dict or an object, say, and the call keeps its break)."""
    return all(_carriable(value) for value in values)


def keyable(*values: Any) -> bool:
    """Whether a callee that remembers its arguments (``warning_once``, keyed on them by
    an ``lru_cache``) may be given ``values`` after the graph: none is or holds a tensor
    (it must see the original, not a copy) or a list (unhashable: the call raises
    ``TypeError`` where it stands)."""
    for value in values:
        if isinstance(value, torch.Tensor) or type(value) is list:
            return False
        if type(value) in _SEQUENCES and not keyable(*value):
            return False
    return True


def _carriable(value: Any) -> bool:
    if isinstance(value, torch.nn.Parameter):
        return type(value) is torch.nn.Parameter  # a subclass cannot be rebuilt
    if isinstance(value, torch.Tensor):
        # a copy of a tensor that requires grad prints its own grad_fn (CloneBackward0);
        # one of a torch.func transform prints its level, gone after the graph
        return not value.requires_grad and not inside_a_transform()
    if type(value) in _CONSTANT_TYPES:
        return True
    if type(value) in _SEQUENCES:
        return all(_carriable(item) for item in value)
    return False


def _learn_constant_types(dynamo: Any) -> None:
    """The types TorchDynamo holds as constants, and so carries (once it is imported)."""
    utils = getattr(dynamo, "utils", None)
    _CONSTANT_TYPES.update(dict.fromkeys(getattr(utils, "common_constant_types", ())))


def rebuild(tokens: tuple[Any, ...]) -> tuple[Any, ...]:
    """The values :func:`capture` made ``tokens`` of, in order."""
    remaining = iter(tokens)
    values = []
    for kind in remaining:
        values.append(_rebuild_one(kind, remaining))
    return tuple(values)


def _rebuild_one(kind: str, remaining: Iterator[Any]) -> Any:
    payload = next(remaining)
    if kind == "int":
        return int(payload)
    if kind == "float":
        return float(payload)
    if kind == "parameter":
        return torch.nn.Parameter(payload, requires_grad=next(remaining))
    if kind == "opaque":
        return payload[0]
    if kind in _REBUILD:
        items = []
        for _ in range(payload):
            items.append(_rebuild_one(next(remaining), remaining))
        return _REBUILD[kind](items)
    return payload


def defers_here(*values: Any) -> bool:
    """Whether a call of ``values`` may wait for the end of the graph being traced
    (asked while tracing; False: the call keeps its break, as without GraphMend).

    The original call breaks the graph: what was traced before it is one graph, what
    follows another, and either is none when it holds no operation.  Deferred, the call
    joins the two into one, which holds the copies of its tensors (and the tensors of
    its symbolic numbers): a graph where plain compile had none when nothing before the
    call and nothing after it, up to the next break (a ``graph_break()``, a callee that
    breaks, the end of the frame), is an operation.  Where the graph holds no operation
    yet (and a break can split it: not under ``fullgraph=True``), it is checked before
    it is compiled: if it holds nothing but copies, the analysis restarts with the call
    keeping its break.  See also :mod:`graphmend.runtime.skipped_frames`."""
    return _may_defer(any(_copied_in_the_graph(value) for value in values))


def graph_started() -> bool:
    """:func:`defers_here` of values not known yet (a call whose values are captured one
    by one, where the original evaluates them): taken to be copied in the graph."""
    return _may_defer(copies=True)


def _may_defer(copies: bool) -> bool:
    if open_site("defer") is not None:
        return False  # an earlier analysis of this compile found that it must not wait
    if ask_tracer(_exports, False):
        # strict torch.export drops output calls from the program it exports: the copies
        # would be operations of the exported graph that plain export does not have
        return False
    if copies:
        ask_tracer(_check_more_than_copies, None)
    return True


def _exports(tracer: Any) -> bool:
    """Asked while TorchDynamo traces :func:`_may_defer`: whether it traces for strict
    ``torch.export``."""
    return bool(getattr(getattr(tracer, "output", None), "export", False))


def _check_more_than_copies(tracer: Any) -> None:
    """Asked while TorchDynamo traces :func:`_may_defer`: where the graph holds no
    operation yet, check before it is compiled that it holds more than copies."""
    site = opened_site(tracer)
    if site is None or _graph_holds_an_operation(tracer):
        return
    output = tracer.output
    check_before_compiling(output, functools.partial(_keep_break_if_only_copies, site, output))


def _keep_break_if_only_copies(site: Any, output: Any, _results: list[Any]) -> None:
    """Restart the analysis, the site keeping its break, if the graph about to be compiled
    holds nothing but copies (the only operations :func:`capture` makes)."""
    if all(_is_copy(node) for node in output.graph.nodes if _operates_on_tensors(node)):
        site.keep_break(
            "its copies would be the only operations of the graph, where plain compile, "
            "breaking at the call, has none"
        )


def _is_copy(node: Any) -> bool:
    if node.op == "call_method":
        return node.target in ("clone", "detach")
    return node.op == "call_function" and node.target is torch.scalar_tensor


def _copied_in_the_graph(value: Any) -> bool:
    """Whether :func:`capture` of ``value`` puts an operation into the graph."""
    if isinstance(value, torch.Tensor):
        return True
    if type(value) in (int, float):
        return held_while_tracing(value) != "constant"
    if type(value) in _SEQUENCES:
        return any(_copied_in_the_graph(item) for item in value)
    return False


def _graph_holds_an_operation(tracer: Any) -> bool:
    """Whether the graph ``tracer`` adds to holds an operation, or cannot be split by a
    break (then one graph either way)."""
    if getattr(tracer, "one_graph", False) or getattr(tracer, "error_on_graph_break", False):
        return True  # no break can split the graph: one graph either way
    output = tracer.output
    if getattr(output, "current_tracer", None) is not getattr(output, "root_tracer", None):
        return True  # inside a higher-order operator's body (torch.cond), which never breaks
    return any(_operates_on_tensors(node) for node in output.graph.nodes)


def _operates_on_tensors(node: Any) -> bool:
    """Whether ``node`` is an operation of the graph: a call, except one whose value is
    a number or a size (``x.size()``, ``s0 * 2``, traced when a symbolic size is read):
    TorchDynamo drops those from a graph where nothing but a copy uses them, and plain
    compile, breaking at the call, has no graph for them."""
    if not node.op.startswith("call"):
        return False
    value = node.meta.get("example_value")
    return not isinstance(value, int | float | bool | torch.Size | torch.SymInt | torch.SymFloat)


def warnings_may_raise(*categories: Any) -> bool:
    """Whether a warning filter turns some warnings into exceptions (read while tracing:
    TorchDynamo guards on the filters, and compiles again when they change), or one of
    ``categories`` (those the source cannot prove, a module's own class) is not a class
    of warnings, which ``warn()`` refuses with a ``TypeError``.  Such a call raises
    where it stands, before what follows it, so it is not deferred."""
    if not all(_warning_class(category) for category in categories):
        return True
    return any(entry[0] == "error" for entry in warnings.filters)


def _warning_class(category: Any) -> bool:
    """Whether ``warn()`` takes ``category``: None or a subclass of ``Warning``."""
    return category is None or (isinstance(category, type) and issubclass(category, Warning))


def formattable(template: str, kind: str, names: tuple[str, ...], *values: Any) -> bool:
    """Whether formatting ``values`` with ``template`` cannot raise after the graph where
    it did not at the call (asked while tracing; False: the call keeps its break, and
    raises where it stands).  ``kind``: ``"field"``, one f-string field
    (``template.format(value)``, ``"{:.3f}"``); ``"format"``, ``template.format(...)``
    with the values, the last ``len(names)`` of them by those keywords; ``"%"`` and
    ``"%tuple"``, ``template % value`` and ``template % (values...)``.

    Formatted after the graph, a value that cannot take its format (``f"{y:.3f}"`` of a
    tensor of three elements, ``"%x" % t`` of a float tensor) raised there, once the
    graph had updated its inputs in place.  The check formats stand-ins with the values'
    behaviour: a constant itself, a number of the item's type for a tensor that formats
    as its item, an object that refuses any format spec and any conversion to a number
    otherwise."""
    return bool(ask_tracer(_formats_alike, True, template, kind, names, *values))


def _formats_alike(_tracer: Any, template: Any, kind: Any, names: Any, *values: Any) -> bool:
    """Asked while TorchDynamo traces :func:`formattable`."""
    try:
        template, kind, names = (v.as_python_constant() for v in (template, kind, names))
        numeric = kind.startswith("%")
        stand_ins = [_stand_in(value, numeric=numeric) for value in values]
    except (AttributeError, KeyError, NotImplementedError, TypeError):
        return False
    positional = stand_ins[: len(stand_ins) - len(names)]
    keywords = dict(zip(names, stand_ins[len(positional) :], strict=True))
    try:
        if kind == "%":
            template % stand_ins[0]
        elif kind == "%tuple":
            template % tuple(stand_ins)
        else:
            template.format(*positional, **keywords)
    except Exception:  # whatever formatting the values would raise
        return False
    return True


class _Unformattable:
    """A stand-in for a value that formats as text only: a format spec raises (as
    ``object.__format__`` does), and so does a conversion to a number (``%d``)."""

    def __repr__(self) -> str:
        return "tensor"


def _stand_in(variable: Any, *, numeric: bool) -> Any:
    """What formats as the value of ``variable`` does (a TorchDynamo variable): its
    constant, a number of its type, a tuple of its items' stand-ins, or for a tensor
    (``numeric``: by ``%``, which asks for a number; else by ``format``, which wants a
    0-d plain tensor) its item's type."""
    if variable.is_python_constant():
        try:
            return variable.as_python_constant()
        except NotImplementedError:
            pass
    kind = variable.python_type()
    if kind in (int, float, bool):
        return kind()  # a symbolic number
    if issubclass(kind, tuple):
        # a tuple (a symbolic size too) is the operands of ``%``, not one of them
        return tuple(_stand_in(item, numeric=numeric) for item in variable.items)
    if not issubclass(kind, torch.Tensor):
        return _Unformattable()
    fake = variable.as_proxy().node.meta.get("example_value")
    if not isinstance(fake, torch.Tensor):
        return _Unformattable()
    from torch.fx.experimental.symbolic_shapes import statically_known_true  # while tracing

    # a symbolic number of elements is not compared (a guard on the size): not known to
    # be one, the tensor formats as text only
    as_item = (
        statically_known_true(fake.numel() == 1)
        if numeric
        else (fake.dim() == 0 and kind is torch.Tensor)
    )
    if not as_item:
        return _Unformattable()
    if fake.is_complex():
        return 0j
    if fake.is_floating_point():
        return 0.0
    return False if fake.dtype == torch.bool else 0


def render(value: Any, conversion: int, spec: str) -> str:
    """A replacement field of an f-string, formatted after the graph."""
    return format_now(value, conversion, spec)


def deferred(qualname: str) -> Callable[[F], F]:
    """Register a generated per-site function with TorchDynamo's reorderable calls.

    Its code is renamed after the function holding the site, so that log
    records (``funcName``), warnings and tracebacks name the user's function.
    """

    def register(function: F) -> F:
        code = function.__code__
        renamed = {"co_name": qualname.rsplit(".", 1)[-1]}
        if sys.version_info >= (3, 11):
            renamed["co_qualname"] = qualname
        function.__code__ = code.replace(**renamed)
        _deferred_functions.append(function)
        if _enabled:
            _register_with_dynamo(function)
        return function

    return register


def reordering() -> bool:
    """Whether TorchDynamo runs the functions :func:`deferred` registered after the graph
    (False on an untested torch release, or before TorchDynamo is imported)."""
    return _enabled


def _register_with_dynamo(function: Callable[..., None]) -> None:
    from torch._dynamo import config

    config.reorderable_logging_functions.add(function)
    dynamo_support.never_compiled(function)


def _enable(_dynamo: object = None) -> None:
    global _enabled
    # what a frame's trace that ends or compiles otherwise than plain compile's needs,
    # for every rewrite: on any release (T1 and T3 stay on where deferring is off)
    dynamo_support.watch_frame_traces(run_in_python_where_pinned, keep_first_break_if_frame_lost)
    if _enabled or not dynamo_support.keep_inlined_deferred_calls():
        # Unregistered, a generated function is an ordinary function that makes
        # the original call: TorchDynamo breaks the graph there, as it did before.
        return
    _enabled = True
    # what the generated functions call, and what render calls (under dynamic=True a
    # float TorchDynamo made symbolic made a graph of a helper's own frame)
    called = (
        format_now,
        formatting._numbers_known,
        formatting.known_while_tracing,
        formatting.held_while_tracing,
        formatting.convert,
    )
    for helper in (rebuild, _rebuild_one, render, *called):
        dynamo_support.never_compiled(helper)
    for function in _deferred_functions:
        _register_with_dynamo(function)


when_imported("torch._dynamo", _enable)
when_imported("torch._dynamo", _learn_constant_types)
