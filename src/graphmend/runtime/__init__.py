"""The helpers rewritten code calls; a rewritten module holds this module as ``_@gm_rt``.

Only modules that import torch themselves are rewritten, so importing torch
here adds nothing to their import time.  Everything here runs either eagerly at
a rewritten site (:func:`tracing`, a cheap check) or while TorchDynamo traces.
"""

from __future__ import annotations

from graphmend.runtime.conditions import (
    allclose,
    compare,
    contains,
    equal,
    host_value,
    is_scalar_tensor,
    logical_and,
    logical_or,
    not_,
)
from graphmend.runtime.continuation import continuation
from graphmend.runtime.deferral import (
    capture,
    carriable,
    deferred,
    rebuild,
    render,
    tensor_free,
    warnings_may_raise,
)
from graphmend.runtime.reading import attribute, callee, metadata, sequence, type_name
from graphmend.runtime.searches import as_written, search_site
from graphmend.runtime.selection import assign_item, branch
from graphmend.runtime.tracing import tracing
from graphmend.runtime.traps import (
    exact_text,
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
    "branch",
    "callee",
    "capture",
    "carriable",
    "compare",
    "contains",
    "continuation",
    "deferred",
    "equal",
    "exact_text",
    "host_value",
    "is_scalar_tensor",
    "logical_and",
    "logical_or",
    "lower_guard",
    "lowerable",
    "metadata",
    "names_formattable",
    "not_",
    "rebuild",
    "render",
    "search_site",
    "sequence",
    "tensor_free",
    "text",
    "tracing",
    "type_name",
    "warnings_may_raise",
]
