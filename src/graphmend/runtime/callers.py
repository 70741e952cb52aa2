"""What the callers of a site's function can reach, in the graph being traced.

A merge gives a name a new tensor where the original gives it a branch's own,
often one that existed before the ``if`` (``def clamp(x): if x.sum() > 0: x =
x.abs(); return x`` returns the caller's ``x`` itself when the branch does not
run).  When the site's function is inlined into a caller traced in the same
graph, the caller may compare what it gets back by identity with a tensor it
holds: ``y is x``, ``{x: 1}.get(y)``, ``a is b`` of two calls.  TorchDynamo
decides such a comparison while tracing, as a constant, so nothing of it is left
in the graph to check when the graph ends (:mod:`graphmend.runtime.aliasing`),
and the static analysis (``identity_used_after``) sees the site's function and
its callees, never its callers, which may live in any module.

So a merge is declined, the site keeping its break, when a caller in the graph could
reach a tensor a branch gives (:func:`reachable`): one held by a caller's frame (its
locals, the values on its stack, its closure cells, and what they hold: a list, a
dict's keys and values, an object's attributes stored in the graph), one stored in
the graph into an object that existed before it (``self.last = x``, a global), or
one the graph takes as an input (the caller may read it again from wherever it came
from: ``self.buffer``), or one the site's own function keeps past the site under
another name, which it may return to the caller later (``kept = h`` before ``if c: h
= h.abs()``, then ``return h, kept``; the rewrite names the locals live after the
site, :func:`_kept_locals`, by the items it reads where it reads only constant
subscripts of a tuple or a list: ``outputs[2:]``). That is more than identity needs
(the caller may never compare), but it keeps the fixes where they matter: the
branches of the sites found in real models give tensors the site's function computed
itself (``hidden_states = self.norm(...)`` then ``if ...: hidden_states =
hidden_states.clamp(...)``), which no caller holds (the census of bart, t5, longt5,
whisper, nllb-moe, marian, mvp, plbart, led and gemma2, float32 and float16, fixes
the same breaks with it).

Weighed and not taken: hooking TorchDynamo's own identity comparisons
(``BuiltinVariable``'s handlers of ``is``, ``id()``, dict keys) would decline only
where a comparison happens, but there are many such paths, their handlers are
cached per release, and they differ between 2.5 and 2.13; a static rule (decline
where the merged name may hold an object from outside the function) cannot see
that ``self.dropout(x)`` in eval mode gives back ``x`` itself.

The translators and variables read here are TorchDynamo internals (2.5, 2.13).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from graphmend.generated import PREFIX

#: The folder of GraphMend's runtime: a frame whose code is here is not the user's.
_RUNTIME = Path(__file__).resolve().parent


def callers(tracer: Any) -> list[Any]:
    """The translators of the frames that called the site's function in the graph being
    traced, where ``tracer`` is a site's runtime function's (or one it calls).

    A caller is a user's frame (not GraphMend's runtime) that called another user's
    frame: the site's function returns its results to it.  A user's frame that called
    GraphMend's runtime (the function of an enclosing site, whose branches the site is
    in) gets the site's results only through that runtime, merged again."""
    found = []
    child, frame = tracer, tracer.parent
    while frame is not None:
        if _is_users(frame) and _is_users(child):
            found.append(frame)
        child, frame = frame, getattr(frame, "parent", None)  # 2.5's root has none
    return found


def _is_users(tracer: Any) -> bool:
    """Whether ``tracer`` traces code that is not GraphMend's runtime."""
    return not Path(tracer.f_code.co_filename).resolve().is_relative_to(_RUNTIME)


def reachable(tracer: Any, kept: Sequence[Any] | None = ()) -> list[torch.Tensor] | None:
    """The tensors (fake) a caller of the site's function could reach after it returns
    (see the module's docstring); ``None`` where the function has no caller in the
    graph (its results leave the graph, which :mod:`aliasing` checks).  ``kept``: the
    site's function's locals that may be read after it, but those it binds to its
    results (``None``: unknown, all but GraphMend's own; :func:`_kept_locals`).
    Raises ``AttributeError`` where this torch's internals differ."""
    frames = callers(tracer)
    if not frames:
        return None
    side_effects = tracer.output.side_effects
    roots: list[Any] = _kept_locals(tracer, kept)
    for frame in frames:
        roots += [*frame.symbolic_locals.values(), *frame.stack]
        roots += list(getattr(frame, "closure_cells", {}).values())  # 2.5
    # what existed before the graph (an object, a module's globals, a list) and what the
    # graph stored into it (``self.last = x``); new objects are reached from the frames
    roots += [
        variable
        for variable in (*side_effects.id_to_variable.values(), *side_effects.store_attr_mutations)
        if getattr(variable, "source", None) is not None
    ]
    return [*_tensors_in(roots, side_effects.store_attr_mutations), *_inputs(tracer.output)]


def _kept_locals(tracer: Any, kept: Sequence[Any] | None) -> list[Any]:
    """The values of the ``kept`` locals (``None``: all but GraphMend's own; a name, or a
    name with the items it is read by after the site, :func:`_selected`) of the
    site's own function, the user's frame that called GraphMend's runtime: they survive
    the merge and may reach a caller later.  ``def f(x): h = x * 2; g = h; if c: h =
    h.abs(); return h, g`` returns ``g``, the tensor the else-branch gives, next to the
    merged ``h``: the original returns one tensor twice, and a caller may compare them
    (``y is g``).  Not its stack, which holds the branches' arguments.  A generator's
    values yielded before the site are its consumer's (``a, b = list(gen(x))``)."""
    frame = tracer
    while frame is not None and not _is_users(frame):
        frame = frame.parent
    if frame is None:
        return []
    cells = getattr(frame, "closure_cells", {})  # 2.5; 2.13 keeps them with the locals
    named = {**cells, **frame.symbolic_locals}
    yielded = list(getattr(frame, "generated_items", []))
    if kept is None:
        return yielded + [value for name, value in named.items() if not name.startswith(PREFIX)]
    found = yielded
    for entry in kept:
        name, selectors = (entry, None) if isinstance(entry, str) else (entry[0], entry[1:])
        if name in named:
            found += _selected(named[name], selectors)
    return found


def _selected(variable: Any, selectors: Sequence[Any] | None) -> list[Any]:
    """The items of a tuple's or list's ``variable`` that ``selectors`` pick (an int, or a
    slice's three parts); ``variable`` itself without selectors, or where it is not one
    (``kept`` of :func:`_kept_locals`)."""
    from torch._dynamo.variables import BaseListVariable

    if selectors is None or not isinstance(variable, BaseListVariable):
        return [variable]
    items = list(variable.items)
    picked: list[Any] = []
    for selector in selectors:
        if isinstance(selector, tuple):
            if selector[2] == 0:
                return [variable]  # the original raises there
            picked += items[slice(*selector)]
        elif -len(items) <= selector < len(items):
            picked.append(items[selector])
    return picked


def _inputs(output: Any) -> list[torch.Tensor]:
    """The fake tensors the graph ``output`` traces takes as inputs."""
    values = [
        node.meta.get("example_value")
        for node in output.graph.nodes
        if node.op in ("placeholder", "get_attr")
    ]
    return [value for value in values if isinstance(value, torch.Tensor)]


def _tensors_in(
    variables: Iterable[Any], stored: Mapping[Any, Mapping[str, Any]]
) -> list[torch.Tensor]:
    """The fake tensors of TorchDynamo's ``variables`` and of every variable they hold: a
    dict's keys, the attributes ``stored`` into an object (or a cell) in the graph; a
    variable not yet read (a lazy one) is left unread."""
    from torch._dynamo.variables import (
        ConstDictVariable,
        LazyVariableTracker,
        TensorVariable,
        VariableTracker,
    )

    found: list[torch.Tensor] = []
    seen: dict[int, Any] = {}

    def visit(variable: Any) -> None:
        if isinstance(variable, LazyVariableTracker):
            return  # not realized (visit unwraps a realized one): reading it adds guards
        if isinstance(variable, TensorVariable):
            fake = variable.as_proxy().node.meta.get("example_value")
            if isinstance(fake, torch.Tensor):
                found.append(fake)
        # 2.13 keys the stored attributes by the variable, 2.5 by its mutable_local
        keys = (variable, getattr(variable, "mutable_local", None))
        held: list[Any] = [value for key in keys for value in stored.get(key, {}).values()]
        if isinstance(variable, ConstDictVariable):  # a dict's or a set's keys
            held += [key.vt for key in variable.items if hasattr(key, "vt")]
        VariableTracker.visit(visit, held, seen)

    VariableTracker.visit(visit, list(variables), seen)
    return found
