"""Trying something while TorchDynamo traces, and taking it back if it fails.

Code traced by TorchDynamo cannot catch what fails while it is traced: an error
raised making a fake-tensor call (``x.reshape(3, -1)`` of a tensor of 8 elements,
``torch.cat`` of mismatched shapes) stops the whole compilation and reaches the
caller.  The rewrites evaluate code the original may not have run (both branches
of an ``if``, under T1), so they make such calls from a ``comptime`` hook, in
Python while tracing, where the error can be caught: :class:`Attempt` saves what
the call may change in the tracer (the graph's nodes, the side effects that wait
for the end of the graph, the calls deferred after it) and :meth:`Attempt.undo`
puts it back, so that the original code then runs as if nothing had been tried.
The tracer's internals are not public API: they have this shape on the torch
releases GraphMend is tested with (2.5 and 2.13).

What an undo cannot take back are the guards the attempt made TorchDynamo
install (on an attribute it read, such as a cache length; on a size it used) and
the graph inputs it added.  A failed attempt that left any restarts the frame's
analysis instead (:meth:`Site.keep_break`), the site marked to run its original
code: otherwise the frame would recompile whenever such an attribute changes, where
the original ``if`` never traced that code (phi-1.5's rotary cache length in
``generate``: 22 graphs against plain's 18).  A successful attempt that pins a
symbolic size to one value (``x.split(2)`` of ``s0`` rows guards ``(s0 + 1) // 2 ==
3``; by default a size is symbolic once it has changed between calls) does the
same, since the frame would compile again for every new size until the recompile
limit sent it to eager.  The decision is kept, for this compile only, in the
speculation log TorchDynamo keeps across restarts for its own.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from graphmend.runtime.asking import ask_tracer
from graphmend.runtime.branch_effects import acting_operation, asserts, leaves_grad_mode
from graphmend.runtime.cond_layout import tensor_versions
from graphmend.runtime.fallbacks import ON_DECLINE, record_at
from graphmend.runtime.marked_sizes import pinned_marked_size
from graphmend.runtime.object_changes import changes_so_far
from graphmend.runtime.pending_effects import changed_sources, pending_in
from graphmend.runtime.run_time_errors import raising_operation
from graphmend.runtime.skipped_frames import in_a_loop, note_opened
from graphmend.runtime.transforms import transform_active


class Attempt:
    """The tracer's state before something is tried, to take the attempt back: nothing
    of it may stay when the original code runs instead (a node left in the graph fails
    the backend or runs for nothing, an attribute stored or an output call deferred
    would happen again)."""

    def __init__(self, tracer: Any, *, guards_kept: bool = False) -> None:
        """``guards_kept``: keep the guards TorchDynamo holds before the attempt, for
        :meth:`guarded_what_may_change` (a speculation's; a copy every attempt need not
        make)."""
        self.tracer = tracer
        self.graph = tracer.output.graph
        self.nodes = set(self.graph.nodes)
        self.side_effects = tracer.output.side_effects.clone()
        self.changed = changed_sources(tracer.output)
        self.changes = changes_so_far()
        self.deferred = len(tracer.debug_locals)
        self.shape_env = tracer.output.shape_env
        self.guards = len(self.shape_env.guards) if self.shape_env is not None else 0
        self.installed = self._installed()
        self.guards_before = frozenset(tracer.output.guards) if guards_kept else frozenset()
        self.valued = self._valued_sources()
        self.checks = len(getattr(tracer.output, _CHECKS, ()))
        self.on_break = len(getattr(tracer.output, _ON_BREAK, ()))
        self.on_error = len(getattr(tracer.output, _ON_ERROR, ()))
        self.grad_enabled = torch.is_grad_enabled()  # as TorchDynamo traces it

    def _installed(self) -> tuple[int, int, int]:
        """How many guards and size guards TorchDynamo holds, and how many graph inputs."""
        placeholders = sum(1 for node in self.graph.nodes if node.op == "placeholder")
        sizes = len(self.shape_env.guards) if self.shape_env is not None else 0
        return len(self.tracer.output.guards), sizes, placeholders

    def left_guards(self) -> bool:
        """Whether the attempt installed guards or added graph inputs, which
        :meth:`undo` cannot take back."""
        return self._installed() != self.installed

    def guarded_what_may_change(self) -> bool:
        """Whether the attempt installed a guard that may fail at a later call, a size
        guard, or added a graph input: not the guards on which function or module a
        global names (``torch.all`` is the builtin), which hold whatever the call.  For
        an attempt made with ``guards_kept``."""
        if self._installed()[1:] != self.installed[1:]:
            return True
        return any(
            _from_the_frame(guard.originating_source)
            or guard.inner_create_fn().__name__ not in _IDENTITY_GUARDS
            for guard in set(self.tracer.output.guards) - self.guards_before
        )

    def added(self, target: Any = None) -> list[Any]:
        """The nodes the attempt added, in graph order (those calling ``target``)."""
        return [
            node
            for node in self.graph.nodes
            if node not in self.nodes and (target is None or node.target is target)
        ]

    def updated_in_place(self, versions: dict[Any, int]) -> str | None:
        """The first tensor the attempt updated in place that it did not make (one the
        graph computed before it, or an input or buffer it brought in: a new one's fake
        tensor starts at version 0), by its node's name; ``None`` if none.  ``versions``:
        :func:`tensor_versions` taken when the attempt began.  A view shares its base's
        version counter: updating ``x[0]`` updates ``x``."""
        for node in self.graph.nodes:
            before = versions.get(node, 0 if node.op in _INPUTS else None)
            value = node.meta.get("example_value")
            if before is not None and isinstance(value, torch.Tensor) and value._version != before:
                return node.name
        return None

    def changed_object(self) -> str | None:
        """What the attempt changed of the objects that existed before the trace (a list
        appended to, an attribute stored), by source name where it is the first change to
        that object (:mod:`graphmend.runtime.object_changes`), or ``None``: TorchDynamo
        applies it after the graph, and :meth:`undo` cannot take it back (the change is
        recorded on the object's variable itself)."""
        if changes_so_far() == self.changes:
            return None
        first = sorted(changed_sources(self.tracer.output) - self.changed)
        return first[0] if first else "an object the frame changed before"

    def changed_grad_mode(self, added: list[Any] | None = None) -> bool:
        """Whether the attempt left autograd's grad mode otherwise than it found it, in the
        nodes it added (``added``, where the caller has them) or in a branch of a
        ``torch.cond`` it added (each branch is traced in the mode the one before left,
        :func:`branch_effects.leaves_grad_mode`).  TorchDynamo applied the change while
        tracing: :meth:`undo` cannot take it back."""
        if torch.is_grad_enabled() != self.grad_enabled:
            return True
        added = self.added() if added is None else added
        branches = [
            self.tracer.output.nn_modules[branch.target].graph.nodes
            for cond in added
            if cond.target is torch.ops.higher_order.cond
            for branch in cond.args[1:3]
        ]
        return any(leaves_grad_mode(nodes, self.grad_enabled) for nodes in [added, *branches])

    def deferred_output(self) -> bool:
        """Whether the attempt deferred an output call to after the graph."""
        return len(self.tracer.debug_locals) > self.deferred

    def undo(self) -> None:
        for node in reversed(self.added()):
            if node.op != "placeholder":
                self.tracer.output.remove_node(node)
        self.tracer.output.side_effects = self.side_effects
        del self.tracer.debug_locals[self.deferred :]
        del getattr(self.tracer.output, _CHECKS, [])[self.checks :]
        del getattr(self.tracer.output, _ON_BREAK, [])[self.on_break :]
        del getattr(self.tracer.output, _ON_ERROR, [])[self.on_error :]

    def _valued_sources(self) -> dict[str, Any]:
        """The sources (by name) whose values TorchDynamo guards on."""
        return {
            guard.name: guard.originating_source
            for guard in self.tracer.output.guards
            if guard.inner_create_fn().__name__ in _VALUE_GUARDS
        }

    def pinned_number(self) -> str | None:
        """An ``int`` or ``float`` the frame was given (an argument, an attribute or item
        of one: ``self.scale``, ``sizes[0]``), or a ``str`` given as an argument or an
        item of one (``act``, not ``self.config.hidden_act``: a model's configuration
        does not change between calls), whose value the attempt made TorchDynamo guard
        on, first, or ``None``: the frame would compile again when it changes, where
        the original, not running this code, guards nothing of it.  Globals are not
        followed: a module's constants (``math.pi``) do not change between calls."""
        arguments = self.tracer.output.root_tx.f_locals
        valued = self._valued_sources()
        for name in sorted(valued.keys() - self.valued.keys()):
            source = valued[name]
            value = _value_of(source, arguments)
            if type(value) in (int, float) or (type(value) is str and _no_attribute(source)):
                return f"{name}={value!r}"
        return None

    def pinned_size(self) -> str | None:
        """A guard the attempt installed that holds for one value of a symbolic size
        (``Eq(<size expression>, <number>)``), or ``None``.  By default a size is
        symbolic once it has changed between calls; under ``dynamic=True`` every size
        is, and a pin there may be one the original makes too (a branch calling
        ``nn.Linear`` pins the hidden size): the break is kept all the same, which
        gives plain's graphs (see DESIGN.md §10)."""
        if self.shape_env is None:
            return None
        return pinned_size(self.shape_env.guards[self.guards :])


def must_be_one_graph(tracer: Any) -> bool:
    """Whether the frame ``tracer`` traces must be one graph (``fullgraph=True``, or
    ``error_on_graph_break``): a break there fails the compile."""
    return bool(tracer.one_graph or getattr(tracer, "error_on_graph_break", False))


def pinned_around_a_loop(tracer: Any) -> str | None:
    """Why code ``tracer`` stands at, in a loop of the frame being compiled, keeps its
    break where the trace so far pins a symbolic size to one value (``for i in
    range(x.shape[0])``), or ``None``: plain compile, breaking there, gives the whole
    frame up and compiles nothing, where the frame without the break would compile
    again for every size.  Not where the frame must be one graph: there a break fails
    the call, and recompiling for each size is the lesser cost."""
    shape_env = tracer.output.shape_env
    if shape_env is None or must_be_one_graph(tracer):
        return None
    guard = pinned_size(shape_env.guards)
    if guard is None or not in_a_loop(tracer.output):
        return None
    return (
        f"in a loop of a frame whose trace pins a dynamic size to one size ({guard}): "
        "plain compile gives the frame up at this break, where merged it would compile "
        "again for every size"
    )


def pinned_size(guards: Sequence[Any]) -> str | None:
    """The first of ``guards`` (a shape environment's) that holds for one value of a
    symbolic size (``Eq(<size expression>, <number>)``), or ``None``.  Called only while
    tracing, when TorchDynamo has imported sympy: importing it with the runtime cost every
    program a quarter of a second, and imported a module of the user's named as one of
    sympy's own imports (``fractions.py``) in its place (found by helper audit_cli)."""
    import sympy

    for guard in guards:
        expr = guard.expr
        if (
            isinstance(expr, sympy.Eq)
            and any(side.is_number for side in expr.args)
            and expr.free_symbols
        ):
            return str(expr)
    return None


def _value_of(source: Any, arguments: dict[str, Any]) -> Any:
    """What ``source`` names, if it is one of the frame's ``arguments``, or an attribute
    (read without running a property) or an item of a tuple, list or dict reached from
    one, else ``None``."""
    from torch._dynamo import source as sources

    if isinstance(source, sources.LocalSource):
        return arguments.get(source.local_name)
    if isinstance(source, sources.AttrSource):
        base = _value_of(source.base, arguments)
        return None if base is None else inspect.getattr_static(base, source.member, None)
    if type(source).__name__ in ("GetItemSource", "DictGetItemSource"):
        registry = _unmarked(source.base)
        if isinstance(registry, sources.AttrSource) and registry.member in _REGISTRIES:
            return None  # a submodule (self.drop.p): see _REGISTRIES
        return _item(_value_of(source.base, arguments), source.index)
    if _marks_a_module(source):
        return _value_of(source.base, arguments)
    return None


def _marks_a_module(source: Any) -> bool:
    """Whether ``source`` is TorchDynamo's mark that its base is a module
    (``NNModuleSource``, ``UnspecializedNNModuleSource``, ...)."""
    return type(source).__name__.endswith("NNModuleSource")


def _unmarked(source: Any) -> Any:
    """``source`` without the marks that it names a module (:func:`_marks_a_module`):
    torch 2.5 marks ``self._modules`` before taking an item of it."""
    while _marks_a_module(source):
        source = source.base
    return source


def _from_the_frame(source: Any) -> bool:
    """Whether ``source`` reaches a value from a local of the frame (an argument)."""
    from torch._dynamo import source as sources

    while not isinstance(source, sources.LocalSource) and hasattr(source, "base"):
        source = source.base
    return isinstance(source, sources.LocalSource)


def _no_attribute(source: Any) -> bool:
    """Whether ``source`` reaches a value from an argument of the frame through items
    alone (``L['act']``, ``L['opts']['mode']``), no attribute."""
    from torch._dynamo import source as sources

    while not isinstance(source, sources.LocalSource):
        if isinstance(source, sources.AttrSource) or not hasattr(source, "base"):
            return False
        source = source.base
    return True


#: Where a module keeps its submodules, parameters and buffers: numbers reached through
#: them are not followed.  A continuation traces the rest of the function for both
#: outcomes, and the first reads a submodule's number (phi-1.5's ``self.drop.p``) that
#: the original reads whichever branch it takes; followed, that kept its break.
_REGISTRIES = frozenset({"_modules", "_parameters", "_buffers"})


def _item(container: Any, index: Any) -> Any:
    """``container[index]`` for a tuple, list or dict and a constant index, else ``None``
    (a slice, an index TorchDynamo names by another source, or any other container,
    whose ``__getitem__`` could run code)."""
    if type(container) in (tuple, list) and type(index) is int:
        return container[index] if -len(container) <= index < len(container) else None
    if type(container) is dict and isinstance(index, (str, int)):
        return container.get(index)
    return None


#: The graph nodes that bring in a tensor the frame is given: inputs, buffers.
_INPUTS = ("placeholder", "get_attr")
#: TorchDynamo's guards that hold for one value of what they guard.
_VALUE_GUARDS = frozenset({"CONSTANT_MATCH", "EQUALS_MATCH"})
#: The guards on which object a name is (TorchDynamo's; ``DUPLICATE_INPUT``: that two
#: names are one object): of a global function, class or module, they hold at every call.
_IDENTITY_GUARDS = frozenset(
    {
        "BUILTIN_MATCH",
        "CLOSURE_MATCH",
        "DUPLICATE_INPUT",
        "FUNCTION_MATCH",
        "ID_MATCH",
        "MODULE_MATCH",
        "TYPE_MATCH",
    }
)
#: The attribute of a speculation log entry that marks a site to keep its break.
_KEPT = "graphmend_keeps_break"
#: The attribute of the ``OutputGraph`` being traced that lists the checks to make before
#: it is compiled (:func:`check_before_compiling`).
_CHECKS = "graphmend_checks_before_compiling"
#: The attribute of the ``OutputGraph`` being traced that lists what to call when it
#: breaks (:func:`on_graph_break`).
_ON_BREAK = "graphmend_on_graph_break"
#: The attribute of the ``OutputGraph`` being traced that lists what to call when tracing
#: fails (:func:`on_trace_error`).
_ON_ERROR = "graphmend_on_trace_error"
#: The attribute of the ``OutputGraph`` being traced that holds the marked-size check
#: registered for it (:func:`keep_marked_sizes_dynamic`).
_WATCHES_MARKED_SIZES = "graphmend_watches_marked_sizes"
#: The attribute of a site's runtime function's tracer that holds its :class:`Site`.
_OPENED = "graphmend_opened_site"
#: The attribute of the ``OutputGraph`` being traced that holds the site opened last.
_LAST_OPENED = "graphmend_last_opened_site"
#: The attribute of the ``OutputGraph`` being traced that counts the attempts under way.
_UNDER_WAY = "graphmend_attempts_under_way"
#: Why a site traced inside a ``torch.func`` transform keeps its break (see
#: :mod:`graphmend.runtime.transforms`).
_INSIDE_A_TRANSFORM = "inside a torch.func transform (vmap, grad...), whose tensors are wrapped"
#: open_site compiled as a frame of its own: the site's runtime function runs in Python
#: (its caller's frame resumed eagerly after a graph break), and nothing is traced.
_RUNS_IN_PYTHON = "its runtime function runs in Python, after a graph break"
#: Restarts GraphMend asks for in one compile of a frame, at most: TorchDynamo gives up
#: the frame after 100 restarts (its own, one per graph break, count too).
_MOST_RESTARTS = 16


class Site:
    """The current site's entry in TorchDynamo's speculation log: the same object after
    each restart of the frame's analysis, a new one for the next compile."""

    def __init__(self, tracer: Any) -> None:
        self.log = tracer.speculation_log
        self.entry = tracer.speculate()
        self.position = self.log.index  # the entries after the site's own
        # what the tracer held when the site was opened (open_site), for a site whose
        # runtime function inspects its arguments before its attempt: their guards count
        self.opened: Attempt | None = None
        # fullgraph=True (or error_on_graph_break): a break would fail the compile
        self.one_graph = must_be_one_graph(tracer)

    def kept_break(self) -> str | None:
        """Why an earlier analysis of this compile restarted for the site to keep its
        break (:meth:`keep_break`), or ``None``."""
        return getattr(self.entry, _KEPT, None)

    def keep_sizes_dynamic(self, attempt: Attempt) -> None:
        """Keep the break (:meth:`keep_break`) if the attempt pinned a symbolic size to
        one value.  Not where the frame must be one graph: there a break fails the call,
        and recompiling for each size is the lesser cost."""
        guard = attempt.pinned_size()
        if guard is not None and not self.one_graph:
            self.keep_break(f"tracing it pins a dynamic size to one size ({guard})")

    def keep_numbers_unpinned(self, attempt: Attempt) -> None:
        """Keep the break (:meth:`keep_break`) if tracing a branch made TorchDynamo guard
        on the value of a number the frame is given first (:meth:`Attempt.pinned_number`): the
        frame would compile again when it changes (and fail under ``error_on_recompile``),
        where the original, taking the other branch, never traced that read.  Not where
        the frame must be one graph."""
        number = (self.opened or attempt).pinned_number()
        if number is not None and not self.one_graph:
            self.keep_break(f"tracing it guards on the value of a number it is given ({number})")

    def abandon(self, tracer: Any, rewrite: str, attempt: Attempt, reason: str) -> None:
        """Give up ``attempt``: restart the analysis if it left guards or graph inputs
        (:meth:`keep_break_if_guarded`), else undo it; ``reason`` is recorded for
        ``rewrite`` at the user's line ``tracer`` (a site's runtime function) stands at,
        and the original code runs."""
        if attempt.changed_object() is not None or attempt.changed_grad_mode():
            self.keep_break(reason)
        self.keep_break_if_guarded(attempt, reason)
        attempt.undo()
        record_at(tracer, rewrite, reason)

    def keep_break_if_guarded(self, attempt: Attempt, reason: str) -> None:
        """Keep the break (:meth:`keep_break`) if the failed attempt left guards or graph
        inputs behind; otherwise the caller undoes it."""
        if (self.opened or attempt).left_guards():
            self.keep_break(reason)

    def keep_break(self, reason: str) -> None:
        """Restart the frame's analysis, the site marked to run its original code, so that
        nothing of the attempt stays; unless this compile has restarted for GraphMend
        :data:`_MOST_RESTARTS` times already.

        The entries the attempt's tracing added to the log are dropped: the next
        analysis does not trace it, and TorchDynamo checks that each restart follows
        the log."""
        if sum(1 for entry in self.log.entries if hasattr(entry, _KEPT)) >= _MOST_RESTARTS:
            return
        from torch._dynamo import exc

        setattr(self.entry, _KEPT, reason)
        del self.log.entries[self.position :]
        raise exc.SpeculationRestartAnalysis(restart_reason=f"GraphMend: {reason}")


def open_site(rewrite: str) -> str | None:
    """Called by a site's runtime function before it traces code the original may not
    run: why an earlier analysis of this compile restarted for the site to keep its
    break (recorded for ``rewrite``; the caller then runs the original code), or
    ``None``.  A decline the caller records later (``fallbacks.declined``) restarts the
    analysis if what was traced left guards or graph inputs behind
    (:meth:`Site.keep_break_if_guarded`).  Called only while tracing."""
    return ask_tracer(_open, None, rewrite)


def _open(tracer: Any, rewrite_variable: Any) -> str | None:
    """Asked while TorchDynamo traces :func:`open_site`."""
    try:
        rewrite = rewrite_variable.as_python_constant()
        site = Site(tracer)
        attempt = Attempt(tracer)
    except (AttributeError, ImportError, KeyError, TypeError):
        return None  # the attempts say so (call_or_none)
    kept = site.kept_break() or _kept_anyway(tracer) or pinned_around_a_loop(tracer)
    if kept is not None:
        record_at(tracer, rewrite, kept)
        return kept
    caller = tracer.parent  # the site's runtime function, whose declines are recorded
    setattr(caller, ON_DECLINE, lambda reason: site.keep_break_if_guarded(attempt, reason))
    note_opened(tracer, site)
    site.opened = attempt
    setattr(caller, _OPENED, site)
    setattr(tracer.output, _LAST_OPENED, site)
    if rewrite == "defer" or (rewrite != "trap" and pending_in(tracer)):
        watch_for_asserts_after(site, tracer)
    keep_marked_sizes_dynamic(tracer)
    return None


def watch_for_asserts_after(site: Site, tracer: Any) -> None:
    """Check before the graph ``tracer`` traces is compiled that no assert on tensor data
    follows ``site`` in it, else restart with the site keeping its break.  For a site
    whose removed break would have let what waits for the graph's end happen first (a
    call it defers, or effects pending when it opened: :mod:`graphmend.runtime.pending_effects`).
    TorchDynamo puts an ``assert`` it can trace into the graph itself
    (``torch._assert_async``), in the function or one it calls; failing, it raises from
    inside the graph, and what waits never happens, where the original, breaking at the
    site, had it happen before.  Not where the frame must be one graph: there the
    site's break fails the compile.  (A guard GraphMend lowers keeps its break while
    anything waits: :mod:`graphmend.runtime.traps`.)"""
    if must_be_one_graph(tracer):
        return
    output = tracer.output
    before = set(asserts(output.graph.nodes))

    def keep_break_if_asserted_after(_results: list[Any]) -> None:
        if any(node not in before for node in asserts(output.graph.nodes)):
            site.keep_break(
                "an assert on tensor data follows it in the graph: failing, it would raise "
                "before what waits for the graph's end (output, Python state) happened"
            )

    check_before_compiling(output, keep_break_if_asserted_after)


def keep_marked_sizes_dynamic(tracer: Any) -> None:
    """Before the graph ``tracer`` traces is compiled, restart with the site opened last
    there keeping its break if the graph pins a size the program marked dynamic
    (:mod:`graphmend.runtime.marked_sizes`): the compile would fail, where plain
    compile's break left that code to a frame of its own.  Registered once per graph.
    Not where the frame must be one graph: there the break fails the compile in any
    case."""
    output = tracer.output
    registered = getattr(output, _WATCHES_MARKED_SIZES, None)
    if must_be_one_graph(tracer) or registered in checks_before_compiling(output):
        return  # (an attempt's undo drops what it registered: then it is registered again)

    def keep_break_if_pinned(_results: list[Any]) -> None:
        site = last_opened_site(output)
        pinned = None if site is None else pinned_marked_size(output)
        if site is not None and pinned is not None:
            site.keep_break(
                f"the code after it pins {pinned}, a size the program marks dynamic "
                "(torch._dynamo.mark_dynamic): the compile would fail"
            )

    check_before_compiling(output, keep_break_if_pinned)
    setattr(output, _WATCHES_MARKED_SIZES, keep_break_if_pinned)


def _kept_anyway(tracer: Any) -> str | None:
    """Why a site keeps its break whatever an attempt would find, or ``None``."""
    if tracer.parent is None:
        return _RUNS_IN_PYTHON
    return _INSIDE_A_TRANSFORM if transform_active() else None


def keep_numbers_unpinned() -> None:
    """Restart the analysis, the site opened last (:func:`open_site`) keeping its break,
    if what was traced since made TorchDynamo guard first on the value of a number the
    frame is given (:meth:`Site.keep_numbers_unpinned`).  Called only while tracing."""
    ask_tracer(_keep_numbers_unpinned, None)


def _keep_numbers_unpinned(tracer: Any) -> None:
    """Asked while TorchDynamo traces :func:`keep_numbers_unpinned`."""
    site = getattr(tracer.output, _LAST_OPENED, None)
    if site is not None and site.opened is not None:
        site.keep_numbers_unpinned(site.opened)


def last_opened_site(output: Any) -> Site | None:
    """The site opened last (:func:`open_site`) in the graph ``output`` traces."""
    return getattr(output, _LAST_OPENED, None)


def guarded_sources(output: Any) -> set[str]:
    """What TorchDynamo guards on so far, by source name (``G['STEP']``, ``L['x']``)."""
    return {guard.name for guard in output.guards}


def local_guards(output: Any) -> set[str]:
    """What of the frame's locals TorchDynamo guards on so far: each local guarded on, or
    on a part of, by name (``cfg``), and each guard on the value of a part of one, by its
    source and kind (``L['cfg'].mode CONSTANT_MATCH``): a part's value read for the first
    time is a new guard, whose value may change between calls, where a submodule's
    (``self.lin``) identity does not."""
    from torch._dynamo.source import LocalSource

    guards = set()
    for guard in output.guards:
        source = guard.originating_source
        while getattr(source, "base", None) is not None:
            source = source.base
        if not isinstance(source, LocalSource):
            continue
        guards.add(source.local_name)
        kind = guard.inner_create_fn().__name__
        if kind in _VALUE_GUARDS:
            guards.add(f"{guard.name} {kind}")
    return guards


def opened_site(caller: Any) -> Site | None:
    """The site the runtime function ``caller`` (its tracer) opened with :func:`open_site`."""
    return getattr(caller, _OPENED, None)


def check_before_compiling(output: Any, check: Callable[[list[Any]], None]) -> None:
    """Call ``check`` with the graph's results (TorchDynamo's variables) when ``output``,
    the graph being traced, is about to be compiled; the check may restart the analysis
    (:meth:`Site.keep_break`).  An attempt's undo drops the checks it added.

    The one ``OutputGraph``'s ``compile_and_call_fx_graph`` is wrapped, not its class's
    (an internal of the releases GraphMend is tested with, as ``tracer.output`` is);
    raises ``AttributeError`` where it is missing."""
    checks = getattr(output, _CHECKS, None)
    if checks is None:
        compile_graph = output.compile_and_call_fx_graph
        checks = []

        def compile_and_call_fx_graph(tx: Any, rv: list[Any], root: Any) -> Any:
            for each in checks:
                each(rv)
            return compile_graph(tx, rv, root)

        output.compile_and_call_fx_graph = compile_and_call_fx_graph
        setattr(output, _CHECKS, checks)
    checks.append(check)


def on_graph_break(output: Any, callback: Callable[[], None]) -> None:
    """Call ``callback`` when the graph ``output`` traces breaks (TorchDynamo compiles the
    graph so far, to resume after the break), before it is compiled; not at the frame's
    return.  The callback may restart the analysis (:meth:`Site.keep_break`).  An
    attempt's undo drops the callbacks it added.

    The one ``OutputGraph``'s ``compile_subgraph`` is wrapped (an internal of the
    releases GraphMend is tested with); raises ``AttributeError`` where it is missing."""
    callbacks = getattr(output, _ON_BREAK, None)
    if callbacks is None:
        compile_subgraph = output.compile_subgraph
        callbacks = []

        def compile_subgraph_after_callbacks(*args: Any, **kwargs: Any) -> Any:
            reason = kwargs.get("reason") or next(
                (a for a in args if type(a).__name__ == "GraphCompileReason"), None
            )
            if getattr(reason, "graph_break", False):
                for each in list(callbacks):
                    each()
            return compile_subgraph(*args, **kwargs)

        output.compile_subgraph = compile_subgraph_after_callbacks
        setattr(output, _ON_BREAK, callbacks)
    callbacks.append(callback)


def on_trace_error(output: Any, callback: Callable[[BaseException], None]) -> None:
    """Call ``callback`` with the error when tracing the frame ``output`` belongs to fails
    with one that fails its compile (not TorchDynamo's own control flow, nor a graph break
    it handles: a fake tensor call that fails, ``TorchRuntimeError``); callbacks added
    later are called first, and one may restart the analysis (:meth:`Site.keep_break`).
    An attempt's undo drops the callbacks it added.

    The root translator's ``step`` is wrapped, on the one translator (an internal of the
    releases GraphMend is tested with); raises ``AttributeError`` where it is missing."""
    callbacks = getattr(output, _ON_ERROR, None)
    if callbacks is None:
        from torch._dynamo import exc

        root = output.root_tx
        step = root.step
        callbacks = []

        def step_or_callbacks() -> Any:
            try:
                return step()
            except (*tracer_control(), exc.Unsupported):
                raise
            except Exception as error:
                for each in reversed(callbacks):
                    each(error)
                raise

        root.step = step_or_callbacks
        setattr(output, _ON_ERROR, callbacks)
    callbacks.append(callback)


def checks_before_compiling(output: Any) -> list[Callable[[list[Any]], None]]:
    """The checks :func:`check_before_compiling` holds for ``output``, in order."""
    return list(getattr(output, _CHECKS, ()))


def tracer_control() -> tuple[type[BaseException], ...]:
    """TorchDynamo's own control flow (restart the analysis, skip the frame): it must
    pass through an attempt, whatever else the attempt catches."""
    from torch._dynamo import exc

    return (exc.RestartAnalysis, exc.SkipFrame)


def first_line(error: BaseException) -> str:
    """The first useful line of what an attempt raised, for the fallback's reason."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    useful = [line for line in lines if "doesn't work unless it is captured" not in line]
    return (useful or lines or [type(error).__name__])[0][:300]


def call_or_none(
    rewrite: str, function: Callable[..., Any], arguments: Sequence[Any]
) -> Any | None:
    """``function(*arguments)``, traced; ``None`` (the attempt undone, the reason
    recorded for ``rewrite``) where tracing it fails.  Called only while tracing."""
    return ask_tracer(_call, None, rewrite, function, arguments)


def _call(tracer: Any, rewrite_variable: Any, function: Any, arguments_variable: Any) -> Any:
    """Asked while TorchDynamo traces :func:`call_or_none`: the result's variable."""
    return traced_attempt(tracer, rewrite_variable, function, arguments_variable).result


@dataclass(frozen=True)
class Traced:
    """What :func:`traced_attempt` traced: the result's variable (``None`` where the attempt
    failed, undone and recorded), and the site's log entry and the attempt (``None`` on
    a torch release whose tracer lacks what they read)."""

    result: Any
    site: Site | None = None
    attempt: Attempt | None = None


def traced_attempt(
    tracer: Any,
    rewrite_variable: Any,
    function: Any,
    arguments_variable: Any,
    *,
    guards_kept: bool = False,
) -> Traced:
    """``function(*arguments)`` traced as an attempt (``guards_kept``: see
    :class:`Attempt`)."""
    rewrite = "predicate"  # until asked of TorchDynamo, in the try below
    try:
        rewrite = rewrite_variable.as_python_constant()
        arguments = arguments_variable.items
        attempt = Attempt(tracer, guards_kept=guards_kept)
        versions = tensor_versions(attempt.graph)  # before the branch is traced
        site = Site(tracer)
    except (AttributeError, ImportError, KeyError, TypeError) as error:
        record_at(tracer, rewrite, f"this torch release is not supported ({error})")
        return Traced(None)
    kept = site.kept_break()
    if kept is not None:
        record_at(tracer, rewrite, kept)
        return Traced(None, site, attempt)
    try:
        with _under_way(tracer.output):
            result = tracer.inline_user_function_return(function, list(arguments), {})
    except tracer_control():
        raise
    except Exception as error:
        reason = f"a branch cannot be traced: {first_line(error)}"
        site.abandon(tracer, rewrite, attempt, reason)
        return Traced(None, site, attempt)
    reason = _why_branch_acts(attempt, versions)
    if reason is not None:
        site.abandon(tracer, rewrite, attempt, reason)
        return Traced(None, site, attempt)
    site.keep_sizes_dynamic(attempt)
    site.keep_numbers_unpinned(attempt)
    return Traced(result, site, attempt)


@contextmanager
def _under_way(output: Any) -> Iterator[None]:
    """An attempt is traced in ``output`` in this block (:func:`in_an_attempt`)."""
    setattr(output, _UNDER_WAY, getattr(output, _UNDER_WAY, 0) + 1)
    try:
        yield
    finally:
        setattr(output, _UNDER_WAY, getattr(output, _UNDER_WAY) - 1)


def in_an_attempt(output: Any) -> bool:
    """Whether what ``output`` traces now is traced as an attempt (:func:`traced_attempt`),
    or into a higher-order operator's body (a continuation's ``torch.cond``): code the
    original may not run there, whatever is noted of it may be taken back."""
    return getattr(output, _UNDER_WAY, 0) > 0 or output.current_tracer is not output.root_tracer


def _why_branch_acts(attempt: Attempt, versions: dict[Any, int]) -> str | None:
    """Why the branch the attempt traced cannot run where it is not taken, as a merge
    runs it (or, planning a ``torch.cond``, puts its trace in the graph): an operation
    that raises whatever the data, updates a tensor it did not make, draws random
    numbers or asserts (:mod:`graphmend.runtime.branch_effects`), an output call it
    defers, or an object it changes; ``None`` when it only computes."""
    added = attempt.added()
    raising = raising_operation(added)
    if raising is not None:
        return f"a branch {raising}, which raises"
    updated = attempt.updated_in_place(versions)
    if updated is not None:
        return f"a branch updates {updated} in place, where the other branch may not"
    acting = acting_operation(added)
    if acting is not None:
        return f"a branch {acting}"
    if attempt.deferred_output():
        return "a branch makes an output call, which would run untaken"
    if attempt.changed_grad_mode(added):
        return "a branch changes autograd's grad mode (set_grad_enabled), which would hold untaken"
    changed = attempt.changed_object()
    if changed is not None:
        return f"a branch changes {changed}, which would change untaken"
    return None
