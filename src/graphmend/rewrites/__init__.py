"""The rewrites, one module each; the pipeline applies them in :data:`REWRITES` order."""

from __future__ import annotations

from graphmend.rewrites.common import FunctionStatementRewriter
from graphmend.rewrites.defer import DeferRewrite
from graphmend.rewrites.predicate import PredicateRewrite
from graphmend.rewrites.trap import TrapRewrite

# Predication first: its branches are side-effect free, so it never hides a
# guard or an output call from the rewrites after it.
REWRITES: dict[str, type[FunctionStatementRewriter]] = {
    PredicateRewrite.name: PredicateRewrite,
    TrapRewrite.name: TrapRewrite,
    DeferRewrite.name: DeferRewrite,
}
