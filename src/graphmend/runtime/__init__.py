"""The helpers rewritten code calls; a rewritten module holds this module as ``_@gm_rt``.

Only modules that import torch themselves are rewritten, so importing torch
here adds nothing to their import time.  Everything here runs either eagerly at
a rewritten site (:func:`tracing`, a cheap check) or while TorchDynamo traces.
"""

from __future__ import annotations

import sys
import types

from graphmend.post_import import when_imported
from graphmend.runtime.ahead_of_reads import before_host_choice, jumped_on, read_on_host
from graphmend.runtime.conditions import (
    allclose,
    compare,
    compared_on_device,
    contains,
    equal,
    host_value,
    is_scalar_tensor,
    logical_and,
    logical_or,
    not_,
    reads_a_tensor,
    speculated,
)
from graphmend.runtime.continuation import continuation
from graphmend.runtime.deferral import (
    capture,
    carriable,
    deferred,
    defers_here,
    formattable,
    graph_started,
    keyable,
    rebuild,
    render,
    warnings_may_raise,
)
from graphmend.runtime.from_python import item_from_python, mark_static_address
from graphmend.runtime.reading import attribute, callee, metadata, sequence, type_name
from graphmend.runtime.searches import as_written, search_site
from graphmend.runtime.selection import assign_item, branch
from graphmend.runtime.tracing import tracing
from graphmend.runtime.traps import (
    exact_text,
    global_text,
    lower_guard,
    lowerable,
    names_formattable,
    text,
)

__all__ = [
    "allclose",
    "as_written",
    "assign_item",
    "attribute",
    "before_host_choice",
    "branch",
    "callee",
    "capture",
    "carriable",
    "compare",
    "compared_on_device",
    "contains",
    "continuation",
    "deferred",
    "defers_here",
    "equal",
    "exact_text",
    "formattable",
    "global_text",
    "graph_started",
    "host_value",
    "is_scalar_tensor",
    "item_from_python",
    "jumped_on",
    "keyable",
    "logical_and",
    "logical_or",
    "lower_guard",
    "lowerable",
    "mark_static_address",
    "metadata",
    "names_formattable",
    "not_",
    "read_on_host",
    "reads_a_tensor",
    "rebuild",
    "render",
    "search_site",
    "sequence",
    "speculated",
    "text",
    "tracing",
    "type_name",
    "warnings_may_raise",
]


def _never_frames(_dynamo: object = None) -> None:
    """Mark every function of the runtime as one TorchDynamo never compiles as a frame.

    The runtime runs in Python where a rewritten frame resumed eagerly after a graph
    break inside a site (``torch.equal`` of sizes captured from ``nonzero``, a
    ``raise``); compiled as frames of their own, its helpers made graphs plain compile
    does not make, and a site opened outside any user frame failed the call
    (``InternalTorchDynamoError``).  Inlined into a traced frame, they are traced as
    before: the mark is on the frame, not on the code TorchDynamo inlines."""
    from graphmend.runtime.dynamo_support import never_compiled

    for name, module in list(sys.modules.items()):
        if module is None or not (name == __name__ or name.startswith(__name__ + ".")):
            continue
        for value in vars(module).values():
            if isinstance(value, types.FunctionType) and value.__module__ == name:
                never_compiled(value)


when_imported("torch._dynamo", _never_frames)
