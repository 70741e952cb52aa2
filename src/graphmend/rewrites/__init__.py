"""The rewrites, one module each; the pipeline applies them in :data:`REWRITES` order."""

from __future__ import annotations

from graphmend.rewrites.common import FunctionStatementRewriter
from graphmend.rewrites.defer import DeferRewrite
from graphmend.rewrites.trap import TrapRewrite

REWRITES: dict[str, type[FunctionStatementRewriter]] = {
    TrapRewrite.name: TrapRewrite,
    DeferRewrite.name: DeferRewrite,
}
