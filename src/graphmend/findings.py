"""Findings: one record per candidate site, rewritten or declined with a reason.

The same records feed the debug log, ``graphmend explain`` and the tests.
"""

from __future__ import annotations

import ast
from collections import Counter
from dataclasses import asdict, dataclass
from enum import Enum


class Decision(str, Enum):
    """What a rewrite did at a site."""

    REWRITTEN = "rewritten"
    DECLINED = "declined"


@dataclass(frozen=True)
class Finding:
    """A candidate site and what a rewrite decided there."""

    rewrite: str
    filename: str
    lineno: int
    col: int
    function: str
    decision: Decision
    reason: str
    source: str

    @property
    def rewritten(self) -> bool:
        """Whether the site was rewritten (else declined)."""
        return self.decision is Decision.REWRITTEN

    def location(self) -> str:
        """``file:line:column``, as compilers and editors print it."""
        return f"{self.filename}:{self.lineno}:{self.col + 1}"

    def to_json(self) -> dict[str, object]:
        """The finding as plain JSON values (``explain --json``)."""
        data = asdict(self)
        data["decision"] = self.decision.value
        return data


def site_source(lines: list[str], node: ast.AST) -> str:
    """The first source line of ``node``, stripped, for display."""
    lineno = getattr(node, "lineno", 0)
    return lines[lineno - 1].strip() if 0 < lineno <= len(lines) else ""


def summarize(findings: list[Finding] | tuple[Finding, ...]) -> dict[str, dict[str, int]]:
    """Counts per rewrite and decision: ``{"defer": {"rewritten": 2, "declined": 1}}``."""
    counts: Counter[tuple[str, str]] = Counter(
        (finding.rewrite, finding.decision.value) for finding in findings
    )
    summary: dict[str, dict[str, int]] = {}
    for (rewrite, decision), number in sorted(counts.items()):
        summary.setdefault(rewrite, {})[decision] = number
    return summary


def describe_summary(summary: dict[str, dict[str, int]]) -> str:
    """``defer 2 rewritten, 1 declined; trap 1 rewritten`` (or ``no candidate sites``)."""
    if not summary:
        return "no candidate sites"
    parts = []
    for rewrite, counts in summary.items():
        details = ", ".join(
            f"{counts[key]} {key}" for key in ("rewritten", "declined") if key in counts
        )
        parts.append(f"{rewrite} {details}")
    return "; ".join(parts)
