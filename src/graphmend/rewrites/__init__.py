"""The rewrites, one module each; the pipeline applies them in :data:`REWRITES` order."""

from __future__ import annotations

import ast
from typing import ClassVar, Protocol

from graphmend.rewrites.common import ModuleContext
from graphmend.rewrites.continuation import ContinuationRewrite
from graphmend.rewrites.defer import DeferRewrite
from graphmend.rewrites.from_python import FromPythonRewrite
from graphmend.rewrites.predicate import PredicateRewrite
from graphmend.rewrites.trap import TrapRewrite


class Rewrite(Protocol):
    """A rewrite: made for one module, run once over its tree (in place)."""

    name: ClassVar[str]

    def __init__(self, module: ModuleContext) -> None: ...

    def run(self, tree: ast.Module) -> None: ...


# Tests decided from Python values first: a test it settles is no site for the others.
# Predication next: its branches are side-effect free, so it never hides a
# guard or an output call from the rewrites after it.  Continuation last: it
# copies the rest of a function as the others left it.
REWRITES: dict[str, type[Rewrite]] = {
    FromPythonRewrite.name: FromPythonRewrite,
    PredicateRewrite.name: PredicateRewrite,
    TrapRewrite.name: TrapRewrite,
    DeferRewrite.name: DeferRewrite,
    ContinuationRewrite.name: ContinuationRewrite,
}
