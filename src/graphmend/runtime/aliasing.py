"""A merged tensor must not be told apart from the branch's own: checked when the graph ends.

T1 gives a name the tensor ``torch.where`` (or ``torch.cond``) makes, where the
original gives it the branch's own tensor, often one that existed before the
``if`` (``else: y = x``, ``y = x[0]``).  The values are equal; the tensors are
not the same.  A program can tell only by updating one of them in place and
reading the other, or by getting both:

* an update after the ``if``, anywhere in the graph (``g(y)`` whose callee does
  ``t.add_(1)``, a caller's ``f(x).add_(1)``), of the merged tensor, of a
  branch's tensor, or of a view or base of either (they share a version
  counter, which a traced in-place update bumps in the fake tensor too; ``t.data``
  has its own, also bumped, and shares the memory);
* the merged tensor leaving the graph while a branch's tensor, or one sharing
  its memory, is a graph input or leaves it too: the caller holds two tensors
  where the original holds one, and may update either after the call (a
  branch's tensor that another site merged stands for what that site's branches
  give);
* two merged tensors leaving the graph whose branches may give tensors sharing an
  element (``a = t; b = t``, in one site or two): the original returns one tensor
  twice, and the caller's update of one shows in the other.

A fourth way is decided while tracing, not at the end: a caller inlined in the same
graph comparing what the site's function returns by identity with a tensor it holds
(``y = clamp(x); y is x``); :func:`record` declines where a caller could reach a
branch's tensor at all (:mod:`graphmend.runtime.callers`).

The first three cannot be seen at the site, so :func:`watch` records what it merged, and
when TorchDynamo is about to compile the graph each record is checked.  A merge
the program could tell apart restarts the frame's analysis with the site running
its original code (:meth:`attempts.Site.keep_break`), and its graph break.  The
check wraps the ``compile_and_call_fx_graph`` method of the one ``OutputGraph``
being traced, not the class; the method and its ``(tx, rv, root)`` arguments are
TorchDynamo internals, looked up on the releases GraphMend is tested with (2.5
and 2.13): where they are missing, nothing is merged.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from graphmend.runtime import attempts, attribute_stores, callers, cond_results
from graphmend.runtime.asking import ask_tracer
from graphmend.runtime.in_place import example_of, storages_of, updated_uncounted


@dataclass
class _Merge:
    """A merge in the graph being traced: the fake tensors the original could have
    aliased, with their versions and whether they required grad when the merge was
    made, and the graph's nodes then."""

    site: attempts.Site
    merged: list[torch.Tensor]
    branches: list[torch.Tensor]
    versions: list[int]
    requires_grad: list[bool]
    nodes: set[torch.fx.Node]
    output: Any  # the OutputGraph being traced
    paired: bool  # branches holds each merged tensor's two branch tensors, in order

    def __call__(self, results: list[Any]) -> None:
        """Restart the analysis, the site keeping its break, if the program could tell
        the merged tensors from the branches' by the end of the graph."""
        reason = self.why_seen(results)
        if reason is not None:
            self.site.keep_break(reason)
            # past GraphMend's restarts for this compile: the frame runs as it is
            from torch._dynamo import exc

            raise exc.SkipFrame(f"GraphMend: {reason}")

    def why_seen(self, results: list[Any]) -> str | None:
        """How the program could tell the merged tensors from the branches', or ``None``."""
        watched = self.merged + self.branches
        added = [node for node in self.output.graph.nodes if node not in self.nodes]
        if any(t._version != v for t, v in zip(watched, self.versions, strict=True)) or (
            updated_uncounted(added, watched)
        ):
            return (
                "a merged tensor, or a tensor a branch gives, is updated in place after the "
                "if: the original updates one tensor, the merge holds two"
            )
        if attribute_stores.stored_on(self.output, watched):
            return (
                "an attribute is stored on a merged tensor, or on a tensor a branch gives, "
                "after the if (`t.tag = v`, `t.grad = g`): the original stores it on one "
                "tensor, the merge holds two"
            )
        if [t.requires_grad for t in watched] != self.requires_grad:
            return (
                "a merged tensor, or a tensor a branch gives, is made to require grad after "
                "the if (`t.requires_grad_()`): the original changes one tensor, the merge "
                "holds two"
            )
        outputs = storages_of(_example(proxy) for proxy in _proxies(results))
        leaving = self.leaving(outputs)
        if not leaving:
            return None
        inputs = storages_of(
            node.meta.get("example_value")
            for node in self.output.graph.nodes
            if node.op in ("placeholder", "get_attr")
        )
        branches = storages_of(t for _, tensors in leaving for t in tensors)
        if branches & (inputs | outputs):
            return (
                "a merged tensor leaves the graph, and a tensor a branch gives is the "
                "caller's or leaves it too: the caller would hold two tensors where the "
                "original holds one"
            )
        for merged, tensors in leaving:
            others = [
                other
                for peer in _merges(self.output)
                for merged_elsewhere, other in peer.leaving(outputs)
                if merged_elsewhere is not merged
            ]
            if any(_may_share_an_element(tensors, other) for other in others):
                return (
                    "two merged tensors leave the graph, and their branches may give "
                    "tensors that share memory: the caller's update of one would not "
                    "show in the other"
                )
        return None

    def leaving(
        self, outputs: set[StorageWeakRef]
    ) -> list[tuple[torch.Tensor, list[torch.Tensor]]]:
        """The merged tensors among ``outputs`` (the storages that leave the graph), each
        with the tensors the original could give in its place: the branches', and where
        a branch gives a tensor another site merged (or a view of one), what that site's
        branches give in its place, and so on (``if c: x = lin(x)`` then ``if d: x =
        x.abs()``: the original may return the caller's ``x``)."""
        groups = [(m, self._branches_of(m)) for m in self.merged]
        peers = [peer for peer in _merges(self.output) if peer is not self]
        return [
            (m, _standing_for(tensors, peers))
            for m, tensors in groups
            if storages_of([m]) & outputs
        ]

    def _branches_of(self, merged: torch.Tensor) -> list[torch.Tensor]:
        """The branch tensors the original could give in place of ``merged``."""
        if not self.paired:
            return self.branches
        index = next(i for i, m in enumerate(self.merged) if m is merged)
        return self.branches[2 * index : 2 * index + 2]


def _merges(output: Any) -> list[_Merge]:
    """The merges recorded for ``output``, the graph being traced (those made inside a
    ``torch.cond`` branch's subgraph included)."""
    return [
        check for check in attempts.checks_before_compiling(output) if isinstance(check, _Merge)
    ]


def _standing_for(tensors: list[torch.Tensor], peers: list[_Merge]) -> list[torch.Tensor]:
    """``tensors`` and, for each that shares memory with a tensor another merge made,
    the tensors that merge's branches give in its place, until none is added."""
    found = list(tensors)
    remaining = list(peers)
    while remaining:
        storages = storages_of(found)
        expanding = [
            (peer, merged)
            for peer in remaining
            for merged in peer.merged
            if storages_of([merged]) & storages
        ]
        if not expanding:
            break
        for peer, merged in expanding:
            found += peer._branches_of(merged)
        remaining = [peer for peer in remaining if all(peer is not p for p, _ in expanding)]
    return found


def watch(merged: Sequence[Any], branches: Sequence[Any], kept: Sequence[Any] | None) -> bool:
    """Record ``merged`` (the tensors a site's runtime function made) and ``branches``
    (the branches' own tensors in those places) for the check before the graph is
    compiled; ``kept``: the locals of the site's function that may be read after it,
    but those it binds to ``merged`` (``None``: unknown, all).  False (nothing
    recorded) where this torch's tracer does not have the internals it needs, and the
    caller runs the original code.  Called only while tracing, after
    :func:`attempts.open_site`."""
    return ask_tracer(_watch, False, merged, branches, kept)


def _watch(
    tracer: Any, merged_variable: Any, branches_variable: Any, kept_variable: Any
) -> bool | None:
    """Asked while TorchDynamo traces :func:`watch`."""
    try:
        site = attempts.opened_site(tracer.parent)
        merged = fakes(merged_variable)
        branches = fakes(branches_variable)
        kept = kept_variable.as_python_constant()
    except (AttributeError, KeyError, TypeError, NotImplementedError):
        return None  # a release without these internals
    paired = len(branches) == 2 * len(merged)
    return site is not None and record(tracer, site, merged, branches, paired=paired, kept=kept)


def stored_alias(
    targets: Sequence[Any], then_arguments: Sequence[Any], else_arguments: Sequence[Any]
) -> bool:
    """Whether a tensor a site stores into by index may share an element with another
    of ``targets``, or with a second tensor given to a branch (a view of it, another name
    for it, a list holding it).  A branch stores into a copy: through that other tensor
    it would read the values from before the store, and the write-backs of two targets
    would undo each other.  True where that cannot be checked.  Called only while
    tracing."""
    return ask_tracer(_stored_alias, True, targets, then_arguments, else_arguments)


def _stored_alias(_tracer: Any, targets_variable: Any, *arguments_variables: Any) -> bool | None:
    """Asked while TorchDynamo traces :func:`stored_alias`."""
    try:
        targets = fakes(targets_variable)
        arms = [fakes(variable) for variable in arguments_variables]
    except (AttributeError, KeyError, TypeError):
        return None  # a release without these internals
    # Each target is read by both branches (it is among their results): one argument
    # sharing its memory is itself, a second one is another way to its elements.
    return any(
        _may_share_an_element([target], targets[i + 1 :]) for i, target in enumerate(targets)
    ) or any(
        sum(_may_share_an_element([target], [argument]) for argument in arguments) > 1
        for target in targets
        for arguments in arms
    )


def lazy_views(values: Sequence[Any]) -> bool:
    """Whether a tensor among ``values`` is a conjugate or negative view (``c.mH``,
    ``c.mH.imag``), which a tensor ``torch.where`` makes is not.  TorchDynamo cannot
    ask (``is_conj()`` breaks the graph): their fake tensors are asked; True where they
    cannot be."""
    return ask_tracer(_find_lazy_views, True, values)


def _find_lazy_views(_tracer: Any, values: Any) -> bool | None:
    """Asked while TorchDynamo traces :func:`lazy_views`."""
    try:
        tensors = fakes(values)
    except (AttributeError, KeyError, TypeError):
        return None  # a release without these internals
    return any(tensor.is_conj() or tensor.is_neg() for tensor in tensors)


def record(
    tracer: Any,
    site: attempts.Site,
    merged: list[torch.Tensor],
    branches: list[torch.Tensor],
    *,
    paired: bool = False,
    kept: Sequence[Any] | None = (),
) -> bool:
    """From a ``comptime`` hook: check, before ``tracer``'s graph is compiled, that the
    program cannot tell ``merged`` from ``branches`` (fake tensors; with ``paired``,
    the two branch tensors of each merged one in turn, else any branch tensor may stand
    for any merged one); False where that cannot be checked (an inference tensor's
    version, an internal missing, or a caller in the graph that could compare a branch's
    tensor with a merged one by identity, :func:`_callers_may_compare`).  ``kept``:
    the locals of the site's function that may be read after it, but those it binds to
    ``merged``, which may reach a caller later (``None``: unknown, all;
    :func:`callers.reachable`)."""
    try:
        reachable = callers.reachable(tracer, kept)
    except AttributeError:
        return False
    if reachable is not None and _callers_may_compare(tracer, site, branches, reachable):
        return False
    try:
        watched = [*merged, *branches]
        versions = [tensor._version for tensor in watched]
        requires_grad = [tensor.requires_grad for tensor in watched]
        nodes = set(tracer.output.graph.nodes)
        merge = _Merge(
            site, merged, branches, versions, requires_grad, nodes, tracer.output, paired
        )
        attribute_stores.note_tensor_stores()
        attempts.check_before_compiling(tracer.output, merge)
    except (AttributeError, ImportError, RuntimeError):
        return False
    return True


def _callers_may_compare(
    tracer: Any, site: attempts.Site, branches: list[torch.Tensor], reachable: list[torch.Tensor]
) -> bool:
    """Restart the analysis, the site keeping its break (:meth:`attempts.Site.keep_break`),
    if a caller of the site's function, traced in the same graph, could reach a tensor a
    branch gives, or one sharing its memory (``reachable``, :func:`callers.reachable`; a
    merge made elsewhere stands for what its branches give): it could tell the merged
    tensor from it by identity, which TorchDynamo decides while tracing (``y = clamp(x);
    y is x``).  True where the restart is refused (too many restarts)."""
    peers = _merges(tracer.output)
    theirs = storages_of(_standing_for(reachable, peers))
    if not storages_of(_standing_for(branches, peers)) & theirs:
        return False
    site.keep_break(
        "a caller traced in the same graph holds, or can reach, a tensor a branch gives: it "
        "could tell the merged tensor from it by identity (`y is x`, a dict key)"
    )
    return True


def fakes(variable: Any) -> list[torch.Tensor]:
    """The fake tensors in a traced value (a tensor, or tuples, lists and dicts of values),
    from its TorchDynamo variable."""
    try:
        items = getattr(variable, "items", None)
    except NotImplementedError:  # a constant that is not a sequence (a float)
        items = None
    if isinstance(items, Mapping):  # a dict's values
        items = list(items.values())
    if isinstance(items, list):
        return [fake for item in items for fake in fakes(item)]
    try:
        kind = variable.python_type()
    except NotImplementedError:  # a value of no one type (a tensor has one)
        return []
    if isinstance(kind, type) and issubclass(kind, torch.Tensor):
        fake = _example(variable.as_proxy())
        return [] if fake is None else [fake]
    return []


def returned_operands(output: Any, cond: torch.fx.Node) -> list[torch.Tensor]:
    """The tensors (fake) a branch of ``cond``, just traced, may return or return a view
    of: its operands, and what its subgraph reads as a constant (a parameter).  The
    branches return copies (``torch.cond`` refuses aliases); the original returns
    these, or a branch's merge (``if c: x = x.abs()`` in the branch) may give them.
    All the operands where a subgraph does not say.

    A subgraph's inputs are its operands in order; TorchDynamo 2.5 gives them no fake
    tensor of their own, and traces the branch on the operands' own."""
    operands = [example_of(node) for node in cond.args[-1]]
    returned: list[torch.Tensor] = []
    for branch in cond.args[1:3]:
        graph = output.nn_modules[branch.target].graph
        placeholders = [node for node in graph.nodes if node.op == "placeholder"]
        constants = [node for node in graph.nodes if node.op == "get_attr"]
        (results,) = next(node for node in graph.nodes if node.op == "output").args
        sources = [_copied(node) for node in results if isinstance(node, torch.fx.Node)]
        if len(placeholders) != len(operands) or any(
            "example_value" not in node.meta for node in (*constants, *sources)
        ):
            return [operand for operand in operands if operand is not None]
        # a result a merge made in the branch stands for what that merge's branches give
        aliased = storages_of(_standing_for(_examples(sources), _merges(output)))
        inputs = [(example_of(node), operands[i]) for i, node in enumerate(placeholders)]
        inputs += [(example_of(node), None) for node in constants]
        for own, operand in inputs:
            candidates = [tensor for tensor in (own, operand) if tensor is not None]
            if storages_of(candidates) & aliased:
                returned += candidates
    return returned


def results_share_memory(output: Any, cond: torch.fx.Node) -> bool:
    """Whether a branch of ``cond``, just traced, returns two results that may share an
    element (one tensor twice, a tensor and a view of it): the original returns them
    so, and the caller's update of one shows in the other; the branches return a copy
    of each.  Disjoint views of one tensor (``kv.split(1)``) share none."""
    for branch in cond.args[1:3]:
        graph = output.nn_modules[branch.target].graph
        (results,) = next(node for node in graph.nodes if node.op == "output").args
        sources = [_copied(node) for node in results if isinstance(node, torch.fx.Node)]
        if any("example_value" not in node.meta for node in sources):
            return True  # cannot tell
        tensors = [tensor for tensor in map(example_of, sources) if tensor is not None]
        if any(_may_share_an_element([t], tensors[i + 1 :]) for i, t in enumerate(tensors)):
            return True
    return False


def _may_share_an_element(firsts: list[torch.Tensor], seconds: list[torch.Tensor]) -> bool:
    """Whether a tensor of ``firsts`` and one of ``seconds`` may share an element."""
    return any(
        storages_of([first]) == storages_of([second]) and _may_overlap(first, second)
        for first in firsts
        for second in seconds
    )


def _may_overlap(first: torch.Tensor, second: torch.Tensor) -> bool:
    """Whether two tensors of one storage may share an element: their spans of memory
    intersect, or a size, stride or offset is symbolic."""
    spans = [_span(tensor) for tensor in (first, second)]
    if spans[0] is None or spans[1] is None:
        return True
    (first_start, first_end), (second_start, second_end) = spans
    return first_start < second_end and second_start < first_end


def _span(tensor: torch.Tensor) -> tuple[int, int] | None:
    """The storage positions from ``tensor``'s first element to past its last, or
    ``None`` where a size, stride or offset is symbolic."""
    numbers = [tensor.storage_offset(), *tensor.shape, *tensor.stride()]
    if not all(type(number) is int for number in numbers):
        return None
    if 0 in tensor.shape:
        return (0, 0)
    start = tensor.storage_offset()
    reach = sum(
        (size - 1) * abs(stride) for size, stride in zip(tensor.shape, tensor.stride(), strict=True)
    )
    return (start, start + reach + 1)


def _copied(node: Any) -> Any:
    """What ``node`` copies, if it is a ``clone``, else ``node``; for a view carried out
    of a branch as its base (``clone(view._base)``, :mod:`cond_results`), the view."""
    base = cond_results.base_of_view(node)
    if base is not None:
        return base.args[0]
    if getattr(node, "target", None) in (torch.clone, torch.Tensor.clone):
        return node.args[0]
    return node


def _proxies(variables: Iterable[Any]) -> list[Any]:
    return [
        leaf
        for variable in variables
        for leaf in torch.utils._pytree.tree_leaves(variable.as_proxy())
        if isinstance(leaf, torch.fx.Proxy)
    ]


def _examples(nodes: Iterable[Any]) -> list[torch.Tensor]:
    return [tensor for tensor in map(example_of, nodes) if tensor is not None]


def _example(proxy: Any) -> torch.Tensor | None:
    return example_of(proxy.node) if isinstance(proxy, torch.fx.Proxy) else None
