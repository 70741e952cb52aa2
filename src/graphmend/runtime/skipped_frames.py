"""Keeping the first break of a frame whose tracing ends where plain compile's would not.

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
that way, the analysis restarts with the first site opened keeping its break
(:meth:`attempts.Site.keep_break`): the frame breaks where plain compile breaks, and
the rest of it is traced as plain compile traces it.  Unless that site stands in a
loop: there plain compile gives the whole frame up too, and so does GraphMend (a
later site keeping its break would add a graph and a break).  torch 2.13 gives
a frame up in the same way for a break inside a generator it inlines (``next(gen)``).

The same holds where the tracing fails (a shape mismatch found on fake tensors, an
index out of range): plain compile, breaking at the first site, ran the graph before
it (its in-place updates of the caller's tensors, its output) before the tracing of
the rest failed, or, the site in a loop, gave the frame up and raised the eager error;
GraphMend's one trace failed before anything ran.  There the first site opened keeps
its break, in a loop or not.  Where the tracing fails before any site (a later call
compiling the frame again) inside a frame where an earlier compile merged a site in a
loop, plain compile gave that frame up at that compile: run in Python since, its code
may go another way than traced code (transformers' LongT5 builds its default mask
only when not compiling, and the traced path fails).  Where that frame was the one
compiled, plain compile never traces it again; where it was inlined, plain compile
inlines it again when it compiles the caller again, and fails the same way, unless its
own break comes before the failing code (LongT5).  GraphMend gives the frame compiled
up in both cases, and the call runs in Python: it gives what eager gives, where plain
compile may raise.
"""

from __future__ import annotations

import weakref
from types import CodeType
from typing import Any

#: The code of frames where a site stood in a loop: plain compile, breaking there,
#: gives the whole frame up and runs it in Python from then on.
_GIVEN_UP_PLAINLY: weakref.WeakSet[CodeType] = weakref.WeakSet()

#: The attribute of the ``OutputGraph`` being traced that lists the sites opened, in
#: the order they were opened, each with whether it stands outside any loop.
_OPENED_SITES = "graphmend_opened_sites"


def note_opened(tracer: Any, site: Any) -> None:
    """Record ``site``, opened now where ``tracer`` stands, on the graph it traces, with
    whether a loop around it would make a break there give the whole frame up all the
    same; and the frame plain compile gives up there (:data:`_GIVEN_UP_PLAINLY`)."""
    output = tracer.output
    sites = getattr(output, _OPENED_SITES, None)
    if sites is None:
        sites = []
        setattr(output, _OPENED_SITES, sites)
    sites.append((site, not in_a_loop(output)))
    code = _frame_given_up(tracer)
    if code is not None:
        _GIVEN_UP_PLAINLY.add(code)


def _frame_given_up(tracer: Any) -> CodeType | None:
    """The code of the frame plain compile gives up for a break where ``tracer`` stands:
    the outermost of the frames being traced there (the frame compiled, the functions
    it inlines) that stands in a loop.  A break in an inlined function breaks the graph
    at the call in each frame above, which runs on; the first frame in a loop is given
    up whole.  (TorchDynamo's own test, ``maybe_has_backedge``, also looks at the frames
    above.)"""
    chain = []
    while tracer is not None:
        chain.append(tracer)
        tracer = getattr(tracer, "parent", None)
    for translator in reversed(chain):
        try:
            if _breaks_back_at_a_comprehension(translator):
                return None
            if translator.maybe_has_backedge():
                return translator.f_code
        except (AttributeError, AssertionError, TypeError):
            return None
    return None


def in_a_loop(output: Any) -> bool:
    """Whether a break where the frame ``output`` traces stands now would give the whole
    frame up all the same.  A break in a function TorchDynamo inlines breaks the graph
    at the call of it in the frame being compiled, whose loops alone count
    (TorchDynamo's own test, made on that frame): a loop of the inlined function only
    makes its own frame, compiled after the break, given up."""
    root = output.root_tx
    try:
        return not _breaks_back_at_a_comprehension(root) and bool(root.maybe_has_backedge())
    except (AttributeError, AssertionError, TypeError):
        return True  # not known: a break there might give the frame up anyway


def _breaks_back_at_a_comprehension(translator: Any) -> bool:
    """Whether a break where ``translator`` stands, inside a comprehension of its frame,
    goes back to the last point it can resume from instead of giving the frame up.  On
    Python 3.12 and later a comprehension is inlined into its frame, with an exception
    handler of its own, where TorchDynamo cannot resume: torch 2.13 breaks the graph at
    the start of the outermost one and runs it in Python (or, where it could not begin
    there, at the statement before), loops around it or not."""
    return (
        getattr(translator, "_comprehension_depth", 0) > 0
        and getattr(translator, "current_speculation", None) is not None
    )


def keep_first_break_if_frame_lost(root: Any, error: BaseException) -> None:
    """Called with the error that ends the tracing of the frame ``root``: where it is
    TorchDynamo giving the whole frame up, restart the analysis, the first site opened
    keeping its break unless it stands in a loop; where it fails the compile, the first
    site opened.
    Not under ``fullgraph=True``, where the break fails the compile either way."""
    if _gives_frame_up(error):
        reason = (
            "a graph break later in the frame gives the frame up, where plain compile, "
            "breaking here first, compiles the code before it"
        )
        sites = _opened_before_a_loop(root)
    elif _fails_the_compile(error):
        reason = (
            f"tracing failed after it ({type(error).__name__}), where plain compile, "
            "breaking here first, runs the code before it"
        )
        sites = [site for site, _ in _opened(root)]
    else:
        return
    for site in sites:
        if not site.one_graph and site.kept_break() is None:
            site.keep_break(reason)
            return
    if _fails_the_compile(error) and not sites and _failed_where_plain_gives_up(root, error):
        from torch._dynamo import exc

        raise exc.SkipFrame(
            "GraphMend: tracing failed in a frame plain compile gives up at a site in a "
            f"loop, and runs in Python ({type(error).__name__})"
        ) from error


def _failed_where_plain_gives_up(root: Any, error: BaseException) -> bool:
    """Whether ``error`` ended the tracing of the frame ``root`` inside a frame plain
    compile gives up (:data:`_GIVEN_UP_PLAINLY`), the frame itself or one it inlines;
    not where it must be one graph, whose compile fails either way."""
    from torch._dynamo.symbolic_convert import InstructionTranslatorBase

    from graphmend.runtime.attempts import must_be_one_graph  # attempts imports this module

    if must_be_one_graph(root):
        return False
    traceback = error.__traceback__
    while traceback is not None:
        # only a translator's: another ``self`` (a lazy variable) may run code when read
        translator = traceback.tb_frame.f_locals.get("self")
        if (
            isinstance(translator, InstructionTranslatorBase)
            and translator.f_code in _GIVEN_UP_PLAINLY
        ):
            return True
        traceback = traceback.tb_next
    return False


def _opened(root: Any) -> list[tuple[Any, bool]]:
    """The sites opened on the graph the frame ``root`` traces (:func:`note_opened`)."""
    return getattr(getattr(root, "output", None), _OPENED_SITES, [])


def _opened_before_a_loop(root: Any) -> list[Any]:
    """The sites opened on the graph the frame ``root`` traces before the first one in a
    loop: plain compile breaks first at the first site opened, and there, in a loop, it
    gives the whole frame up too (a later site keeping its break would add a graph and
    a break that plain compile does not make)."""
    sites = []
    for site, outside_loops in _opened(root):
        if not outside_loops:
            break
        sites.append(site)
    return sites


def _fails_the_compile(error: BaseException) -> bool:
    """Whether ``error`` fails the compile and reaches the caller: not TorchDynamo's own
    control flow, nor a graph break it handles."""
    from torch._dynamo import exc

    return not isinstance(error, exc.RestartAnalysis | exc.SkipFrame | exc.Unsupported)


def _gives_frame_up(error: BaseException) -> bool:
    """Whether ``error`` is TorchDynamo skipping the whole frame for a graph break it
    cannot resume after (torch 2.13: an ``Unsupported`` marked ``skip_frame``, for a
    break in a loop or in a generator's ``next()``; torch 2.5: ``SkipFrame`` for a
    break in a loop)."""
    if getattr(error, "skip_frame", False):
        return True
    return type(error).__name__ == "SkipFrame" and "graph break in a for/while loop" in str(error)
