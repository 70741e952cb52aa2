"""Sizes the program marks dynamic, pinned by code a removed graph break brought in.

``torch._dynamo.mark_dynamic(x, 0)`` asks that the frame ``x`` is given compile for
any size of that dimension, and TorchDynamo fails the compile
(``ConstraintViolationError``) where the traced code pins it to one value.  A break
GraphMend removes can bring such code into the frame: ``y = x + 1``, a site, then
``y * m`` with ``m`` of a static size pins ``x``'s rows, where plain compile's break
handed ``y`` to a frame of its own, whose inputs nobody marked.  So when a graph a site
was opened in pins a marked size, the site opened last keeps its break, and again for
the one before it, until the graph pins none (or no site is left: the original code
pins it, and the compile fails as plain compile's does): see
:func:`graphmend.runtime.attempts.keep_marked_sizes_dynamic`.

A removed break can also bring such code into a frame where no site stands.  Model
code keeps state that tracing sets: transformers' output capturing takes its
compiling path once a frame that records outputs was traced, where plain compile,
giving that frame up at a break in its loop, ran it in Python.  A later frame then
takes the other path, and where plain compile gave up the decoder at a break inside it,
GraphMend's trace holds the whole decoder, whose cross-attention pins the marked
length of the encoder's mask (a float16 BART with ``output_attentions=True``).  So once
a graph with a site open has been compiled in the process, a graph with no site that
pins a marked size runs its frame in Python, with a warning
(:func:`run_in_python_where_pinned`), where the compile would fail: plain compile
compiled that code otherwise, or failed the same way.  Later calls of that code run
the graphs compiled for it before, where they fit, and never compile it again.
"""

from __future__ import annotations

from typing import Any

import torch

from graphmend.notices import warn

#: Whether a graph with a site open, which pins no marked size, was compiled in this
#: process: GraphMend removed a break, and what runs later may differ from plain compile.
_removed_a_break = False


def pinned_marked_size(output: Any) -> str | None:
    """A dimension of a graph input marked dynamic whose size the trace pinned to one
    value (``x.size()[0] == 2``), or ``None``."""
    for node in output.graph.nodes:
        if node.op != "placeholder":
            continue
        example = getattr(node.meta.get("grapharg"), "example", None)
        marked = getattr(example, "_dynamo_dynamic_indices", None)
        fake = node.meta.get("example_value")
        if not marked or not isinstance(fake, torch.Tensor):
            continue
        for dimension in sorted(marked):
            size = fake.size(dimension) if dimension < fake.dim() else None
            if isinstance(size, torch.SymInt) and size.node.expr.is_number:
                return f"{node.name}.size({dimension}) == {size.node.expr}"
    return None


def run_in_python_where_pinned(root: Any) -> None:
    """As the tracing of the frame ``root`` begins: before each graph of it is compiled,
    run the frame in Python (:func:`_run_this_call_in_python`) where no site is
    open in the graph, the graph pins a marked size, and a graph with a site open was
    compiled earlier in the process.  Not where the frame must be one graph."""
    from graphmend.runtime.attempts import (  # attempts imports this module
        check_before_compiling,
        last_opened_site,
        must_be_one_graph,
    )

    output = root.output

    def run_in_python_if_pinned(_results: list[Any]) -> None:
        global _removed_a_break
        if last_opened_site(output) is not None:
            # a pinned size here is the site's to answer for (keep_marked_sizes_dynamic)
            _removed_a_break = _removed_a_break or _pinned_if_known(output) is None
            return
        if not _removed_a_break or must_be_one_graph(root) or _marks_may_be_ignored():
            return
        pinned = _pinned_if_known(output)
        if pinned is None:
            return
        code = root.f_code
        warn(
            f"GraphMend: {code.co_name} ({code.co_filename}:{code.co_firstlineno}) pins "
            f"{pinned}, a size the program marks dynamic (torch._dynamo.mark_dynamic), "
            "after a graph break GraphMend removed earlier: it runs in Python, where the "
            "compile would fail (plain compile may trace other code there)"
        )
        raise _run_this_call_in_python(f"GraphMend: the graph pins {pinned}, a size marked dynamic")

    check_before_compiling(output, run_in_python_if_pinned)


def _run_this_call_in_python(reason: str) -> Exception:
    """What makes TorchDynamo run the frame being compiled in Python, and later calls of
    its code by the graphs compiled for it so far, or in Python where none fits (its
    ``RUN_ONLY``, as at its recompile limit; the functions it calls are compiled as
    ever).  Its ``SkipFrame`` would give the code up for every later call: transformers'
    output-capturing wrapper resumes the encoder's and the decoder's ``forward`` in one
    code object, and the encoder, given up, compiled as layers one by one.  Where
    TorchDynamo has no such strategy (torch 2.5), ``SkipFrame``."""
    from torch._dynamo import exc, types

    strategy = getattr(types, "FrameExecStrategy", None)
    error = exc.Unsupported(reason) if strategy is not None else None
    if error is None or not hasattr(error, "frame_exec_strategy"):
        return exc.SkipFrame(reason)
    error.frame_exec_strategy = strategy(types.FrameAction.RUN_ONLY, types.FrameAction.DEFAULT)
    return error


def _pinned_if_known(output: Any) -> str | None:
    """:func:`pinned_marked_size`, or ``None`` where this release's graph lacks what it
    reads: this check runs on any torch release, inside the compile."""
    try:
        return pinned_marked_size(output)
    except (AttributeError, KeyError, TypeError):
        return None


def _marks_may_be_ignored() -> bool:
    """Whether TorchDynamo compiles a graph that pins a marked size without failing
    (``torch._dynamo.config.allow_ignore_mark_dynamic``)."""
    from torch._dynamo import config

    return bool(getattr(config, "allow_ignore_mark_dynamic", False))
