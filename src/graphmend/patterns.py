"""Module-name patterns: which dotted module names GraphMend claims.

A pattern is either a dotted name (``mypkg.models``), which matches that module
and everything below it, or a glob (``transformers.models.*``,
``*.modeling_*``) matched against the whole dotted name, where ``*`` also
crosses dots.  Names are rejected on their first component before any regular
expression runs, because the import hook asks about every import in the process.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable

_GLOB_CHARS = frozenset("*?[")
_VALID_PATTERN = re.compile(r"[A-Za-z0-9_.*?\[\]!-]+")


class PatternError(ValueError):
    """A module pattern that cannot be a dotted module name or a glob over one."""


def is_glob(pattern: str) -> bool:
    """Whether ``pattern`` uses glob characters (``*``, ``?``, ``[``)."""
    return any(char in _GLOB_CHARS for char in pattern)


def _check(pattern: str) -> str:
    cleaned = pattern.strip()
    if not cleaned:
        raise PatternError("empty module pattern")
    if not _VALID_PATTERN.fullmatch(cleaned) or ".." in cleaned or cleaned.startswith("."):
        raise PatternError(
            f"invalid module pattern {pattern!r}: use a dotted module name such as "
            "'mypkg.models' or a glob such as 'transformers.models.*'"
        )
    return cleaned


def _regex_for(pattern: str) -> str:
    if is_glob(pattern):
        return fnmatch.translate(pattern)
    return re.escape(pattern) + r"(?:\..+)?\Z"


class ModuleMatcher:
    """Decides quickly whether a dotted module name is claimed by a set of patterns."""

    def __init__(self, patterns: Iterable[str]) -> None:
        self.patterns: tuple[str, ...] = tuple(dict.fromkeys(_check(p) for p in patterns))
        roots = {pattern.split(".", 1)[0] for pattern in self.patterns}
        # Only when every pattern starts with a literal package can names be
        # rejected by their first component alone.
        self._roots: frozenset[str] | None = (
            None if any(is_glob(root) for root in roots) else frozenset(roots)
        )
        joined = "|".join(f"(?:{_regex_for(pattern)})" for pattern in self.patterns)
        self._regex = re.compile(joined) if joined else None

    def matches(self, name: str) -> bool:
        """Whether ``name`` is claimed."""
        if self._regex is None:
            return False
        if self._roots is not None and name.partition(".")[0] not in self._roots:
            return False
        return self._regex.match(name) is not None

    def roots(self) -> tuple[str, ...]:
        """Top-level packages named literally by the patterns (glob roots excluded)."""
        return tuple(
            dict.fromkeys(
                pattern.split(".", 1)[0]
                for pattern in self.patterns
                if not is_glob(pattern.split(".", 1)[0])
            )
        )

    def __repr__(self) -> str:
        return f"ModuleMatcher({list(self.patterns)!r})"
