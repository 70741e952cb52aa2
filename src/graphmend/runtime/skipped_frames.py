"""Keeping the first break of a frame that TorchDynamo would skip for a later break.

TorchDynamo cannot resume a frame after a graph break inside a ``for`` or ``while``
loop: it gives the whole frame up ("graph break in a for/while loop"), the frame runs
in Python, and each function it calls is compiled as a frame of its own.  Where the
frame's first break comes before the loop, TorchDynamo compiles what precedes it as
one graph and resumes after it, and only the rest of the frame is given up.

A site that removes that first break (a deferred ``logger.warning_once`` before the
decoder's layer loop, whose layer drop reads ``torch.rand([])``) leaves the break in
the loop first: the whole frame is given up, and what plain compile held in one graph
becomes graphs of the functions it calls (NLLB-MoE's decoder with gradient
checkpointing: 6 graphs where plain compiles 5).  So when the tracing of a frame ends
that way, the analysis restarts with the first site opened outside any loop keeping
its break (:meth:`attempts.Site.keep_break`): the frame breaks where plain compile
breaks, and the rest of it is traced as plain compile traces it.  torch 2.13 gives
a frame up in the same way for a break inside a generator it inlines (``next(gen)``).
"""

from __future__ import annotations

from typing import Any

#: The attribute of the ``OutputGraph`` being traced that lists the sites opened
#: outside any loop, in the order they were opened.
_OPENED_OUTSIDE_LOOPS = "graphmend_sites_outside_loops"


def note_opened(output: Any, user_frame: Any, site: Any) -> None:
    """Record ``site``, opened in ``user_frame`` (the user's function's translator), on
    the graph ``output`` traces, unless a loop around it would make a break there give
    the whole frame up all the same."""
    if _in_a_loop(user_frame):
        return
    sites = getattr(output, _OPENED_OUTSIDE_LOOPS, None)
    if sites is None:
        sites = []
        setattr(output, _OPENED_OUTSIDE_LOOPS, sites)
    sites.append(site)


def _in_a_loop(frame: Any) -> bool:
    """Whether a break at the instruction ``frame`` (a translator) stands at would give
    the whole frame up all the same.  A break in a function TorchDynamo inlines breaks
    the graph at the call of it in the frame being compiled, whose loops alone count
    (TorchDynamo's own test, made on that frame): a loop of the inlined function only
    makes its own frame, compiled after the break, given up."""
    while getattr(frame, "parent", None) is not None:
        frame = frame.parent
    if frame is None:
        return False
    try:
        return bool(frame.maybe_has_backedge())
    except (AttributeError, AssertionError, TypeError):
        return True  # not known: a break there might give the frame up anyway


def keep_first_break_if_frame_given_up(root: Any, error: BaseException) -> None:
    """Called with the error that ends the tracing of the frame ``root``: where it is
    TorchDynamo giving the whole frame up, restart the analysis, the first site opened
    outside loops keeping its break (not under ``fullgraph=True``, where the break
    fails the compile either way)."""
    if not _gives_frame_up(error):
        return
    for site in getattr(getattr(root, "output", None), _OPENED_OUTSIDE_LOOPS, ()):
        if not site.one_graph and site.kept_break() is None:
            site.keep_break(
                "a graph break later in the frame gives the frame up, where plain "
                "compile, breaking here first, compiles the code before it"
            )
            return


def _gives_frame_up(error: BaseException) -> bool:
    """Whether ``error`` is TorchDynamo skipping the whole frame for a graph break it
    cannot resume after (torch 2.13: an ``Unsupported`` marked ``skip_frame``, for a
    break in a loop or in a generator's ``next()``; torch 2.5: ``SkipFrame`` for a
    break in a loop)."""
    if getattr(error, "skip_frame", False):
        return True
    return type(error).__name__ == "SkipFrame" and "graph break in a for/while loop" in str(error)
