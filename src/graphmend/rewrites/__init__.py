"""The rewrites, one module each; the pipeline applies them in :data:`REWRITES` order."""

from __future__ import annotations

from graphmend.rewrites.common import FunctionStatementRewriter
from graphmend.rewrites.defer import DeferRewrite

REWRITES: dict[str, type[FunctionStatementRewriter]] = {
    DeferRewrite.name: DeferRewrite,
}
