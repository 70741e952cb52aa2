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
"""

from __future__ import annotations

from typing import Any

import torch


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
