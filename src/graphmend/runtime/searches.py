"""A site whose condition searches a tensor for a number (``0 in mask``) and whose
branches do not merge runs as written, from the start of its statement.

Plain compile stops inside ``Tensor.__contains__``, where TorchDynamo cannot resume:
it keeps the graph traced up to there, or, where that graph is empty, runs the whole
frame eagerly.  By the time the branches are found not to merge, the site has put its
device version of the condition into the graph: breaking at the search then compiles
those operations, a graph plain compile does not make where its own was empty (the
flash-attention path of transformers 4.40's Mistral, Hunyuan-Large's remote code).

So the rewritten statement asks :func:`search_site` before it computes anything, and
its fallback calls :func:`as_written` before it searches again: that restarts the
frame's analysis with the site marked (:meth:`Site.keep_break`), and the next analysis
takes the original statement, whose graph is plain compile's.

Where the branches do merge, the search no longer stops the trace, and TorchDynamo
traces the rest of the frame, which plain compile runs eagerly: a break there
(``x / 2 if x.sum() > 1 else x.double()`` on a later line) would compile the rest in
graphs plain compile never makes.  So a graph break after the site in the same frame
restarts the analysis too, the site running as written (:func:`on_graph_break`).
"""

from __future__ import annotations

from typing import Any

from graphmend.runtime.asking import ask_tracer
from graphmend.runtime.attempts import Site, on_graph_break
from graphmend.runtime.fallbacks import record_at

#: The attribute of the ``OutputGraph`` being traced that lists its search sites.
_SEARCH_SITES = "graphmend_search_sites"


def search_site() -> int | None:
    """``None`` where an earlier analysis of this compile marked the site to run as
    written (:func:`as_written`); else the site's token for :func:`as_written`.  Outside
    TorchDynamo (non-strict ``torch.export``), ``-1``: the rewritten code runs."""
    return ask_tracer(_open_search, -1)


def _open_search(tracer: Any) -> Any:
    """Asked while TorchDynamo traces :func:`search_site`."""
    from torch._dynamo.variables import ConstantVariable

    try:
        site = Site(tracer)
    except AttributeError:
        return None  # an unknown tracer: the rewritten code runs, and searches again if it must
    kept = site.kept_break()
    if kept is not None:
        record_at(tracer, "predicate", kept)
        return ConstantVariable.create(None)  # a variable: None itself leaves the default
    sites = getattr(tracer.output, _SEARCH_SITES, None)
    if sites is None:
        sites = []
        setattr(tracer.output, _SEARCH_SITES, sites)
    sites.append(site)
    try:
        on_graph_break(tracer.output, lambda: site.keep_break(_BROKEN_AFTER))
    except AttributeError:  # an output graph of another shape: the site runs as written
        return ConstantVariable.create(None)
    return len(sites) - 1


_BROKEN_AFTER = (
    "the condition searches a tensor for a number, which plain compile cannot resume "
    "after, and the frame breaks later: the statement runs as written, the rest eagerly"
)


def as_written(token: int) -> None:
    """Restart the frame's analysis, the site of ``token`` marked to run as written;
    returns ``None`` (the fallback then searches again, as the original) outside
    TorchDynamo, and where this compile has restarted too often already."""
    ask_tracer(_restart_as_written, None, token)


def _restart_as_written(tracer: Any, token_variable: Any) -> None:
    """Asked while TorchDynamo traces :func:`as_written`."""
    try:
        token = token_variable.as_python_constant()
        site = getattr(tracer.output, _SEARCH_SITES)[token] if token >= 0 else None
    except (AttributeError, IndexError, KeyError, TypeError):
        return
    if site is None:
        return
    site.keep_break(
        "the branches do not merge, and the condition searches a tensor for a number, "
        "which plain compile cannot resume after: the statement runs as written"
    )
