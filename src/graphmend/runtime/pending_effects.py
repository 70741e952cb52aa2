"""What waits for the end of the graph being traced: output calls deferred in it,
Python side effects TorchDynamo applies after it (an attribute stored, a list appended
to), and inputs it updates in place (written back by AOTAutograd at its end).

An operation raising inside the graph drops all of it, where the original, breaking
the graph earlier, had made the calls and the changes before the exception.  So a
guard keeps its break while anything waits (:mod:`graphmend.runtime.traps`), and a site
keeps its break where an assert TorchDynamo traces into the graph follows it
(:func:`graphmend.runtime.attempts.watch_for_asserts_after`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from graphmend.post_import import when_imported
from graphmend.runtime.formatting import assume_constant_result
from graphmend.runtime.in_place import updated_uncounted


def effects_pending() -> bool:
    """Whether effects of the graph being traced wait for its end (asked while tracing):
    calls deferred in it, Python side effects (an attribute stored, a list appended
    to) that TorchDynamo applies after the graph, or inputs the graph updates in place.

    A guard lowered into the graph raises from inside it, and what waits would never
    happen: while anything waits (inputs updated in place included), a guard keeps its
    graph break, so that the output appears and the state changes before the exception,
    as they do eagerly.
    """
    from torch._dynamo.symbolic_convert import InstructionTranslator

    try:
        translator = InstructionTranslator.current_tx()
    except AttributeError:  # not TorchDynamo (non-strict export): nothing is deferred
        return False
    return pending_in(translator)


def pending_in(translator: Any) -> bool:
    """:func:`effects_pending`, for the graph ``translator`` (a frame's TorchDynamo
    translator, inlined or not) adds to."""
    if getattr(translator, "debug_locals", True):
        return True
    output = getattr(translator, "output", None)
    side_effects = getattr(output, "side_effects", None)
    if side_effects is None or _changes_existing_objects(side_effects):
        return True
    graph = getattr(output, "graph", None)
    return graph is None or _inputs_updated(graph)


def _inputs_updated(graph: Any) -> bool:
    """Whether the graph so far updates one of its inputs in place (a parameter, a
    buffer, an argument, through a view or not): AOTAutograd writes such updates back
    at the end of the graph, after an operation in it has raised.  Each input's fake
    tensor is made afresh, at version 0, for the trace; an in-place update bumps it,
    but for those :func:`in_place.updated_uncounted` finds (``x.data.add_(1)``)."""
    inputs = [
        value
        for node in graph.nodes
        if node.op in ("placeholder", "get_attr")
        and isinstance(value := node.meta.get("example_value"), torch.Tensor)
    ]
    return any(value._version > 0 for value in inputs) or updated_uncounted(graph.nodes, inputs)


def _changes_existing_objects(side_effects: Any) -> bool:
    """Whether TorchDynamo will change an object that existed before the trace (objects
    made while tracing, such as a guard message's list, are no one else's to see)."""
    return any(True for _ in _existing_objects_changed(side_effects))


def _existing_objects_changed(side_effects: Any) -> Iterator[tuple[Any, Any]]:
    """Each object that existed before the trace and that TorchDynamo will change, as its
    variable and its mutation (``mutation_type`` on torch 2.13, ``mutable_local`` on 2.5)."""
    for item in side_effects.id_to_variable.values():
        mutation = getattr(item, "mutation_type", None) or getattr(item, "mutable_local", None)
        if "New" not in type(mutation).__name__ and side_effects.is_modified(item):
            yield item, mutation


def changed_sources(output: Any) -> set[str]:
    """What the graph ``output`` traces will change of the objects that existed before
    it, by source name (asked while tracing): each object changed (``G['ITEMS']``, appended
    to), and each attribute or global stored (``L['self'].calls``, ``G['STEP']``)."""
    from torch._dynamo.source import AttrSource

    side_effects = output.side_effects
    stores = side_effects.store_attr_mutations  # by variable on 2.13, by mutation on 2.5
    names = set()
    for item, mutation in _existing_objects_changed(side_effects):
        source = getattr(item, "source", None) or getattr(mutation, "source", None)
        if source is None:
            continue
        names.add(_name_of(source))
        stored = stores.get(item) or stores.get(mutation) or {}
        names.update(_name_of(AttrSource(source, attribute)) for attribute in stored)
    return names


def _name_of(source: Any) -> str:
    """A TorchDynamo source's name (``L['self'].calls``): a method on torch 2.5, a
    property on 2.13; its ``repr`` for a source without one (torch 2.13's
    ``LocalCellSource``, a cell the frame binds, raises ``NotImplementedError``)."""
    try:
        name = source.name
        return name() if callable(name) else name
    except NotImplementedError:
        return repr(source)


def _mark_constant(dynamo: Any) -> None:
    # Called by TorchDynamo while it traces, with its answer baked into the trace.
    assume_constant_result(dynamo, effects_pending)


when_imported("torch._dynamo", _mark_constant)
