"""Opting out in the source: a marker comment for a file, a decorator for a function or class.

* A comment ``# graphmend: skip-file`` anywhere in a module (as isort's
  ``# isort: skip_file``, pytest's ``PYTEST_DONT_REWRITE``): the import hook
  loads the module exactly as Python would, and ``explain``/``diff``/``cache
  warm`` report it as left alone.
* ``@graphmend.do_not_rewrite`` on a function or class (as AutoGraph's
  ``do_not_convert``): no rewrite touches it or anything nested in it.

Both are read from the source before any analysis, never at run time, so the
cache key (the source bytes) covers them.  The decorator is a no-op, recognised
statically by the name it resolves to through the module's imports (see
:mod:`graphmend.rewrites.left_alone`).  The comment is found here, without
parsing (:func:`skipped_module`): the import hook looks for it before the cache,
and this module imports nothing of GraphMend's analysis.
"""

from __future__ import annotations

import io
import re
import tokenize
from dataclasses import dataclass
from typing import TypeVar

from graphmend.compiling import source_text

SKIP_FILE = "# graphmend: skip-file"
_MARKER = SKIP_FILE.removeprefix("# ")
_COMMENT = re.compile(rf"#\s*{re.escape(_MARKER)}\s*")

_Target = TypeVar("_Target")


def do_not_rewrite(target: _Target) -> _Target:
    """Leave a function or class, and everything nested in it, as written (returns it as is)."""
    if not callable(target):
        raise TypeError(
            "graphmend.do_not_rewrite decorates a function or class, as "
            f"'@graphmend.do_not_rewrite' without parentheses; got {type(target).__name__}"
        )
    return target


@dataclass(frozen=True)
class LeftAlone:
    """Where a directive leaves code as written (a definition, or the module), and why."""

    lineno: int
    col: int
    qualname: str  # empty for the module
    reason: str


def skipped_module(source: bytes | str) -> LeftAlone | None:
    """The module's ``# graphmend: skip-file`` comment, found without parsing, or ``None``.

    A byte search first, then the tokenizer confirms that it is a comment (not
    text in a string).
    """
    line = _skip_file_line(source)
    if line is None:
        return None
    return LeftAlone(line, 0, "", f"left alone: the module is marked '{SKIP_FILE}'")


def _skip_file_line(source: bytes | str) -> int | None:
    if isinstance(source, bytes):
        if _MARKER.encode() not in source:
            return None
    elif _MARKER not in source:
        return None
    try:
        text = source if isinstance(source, str) else source_text(source)
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.COMMENT and _COMMENT.fullmatch(token.string):
                return token.start[0]
    except (tokenize.TokenError, SyntaxError, UnicodeDecodeError):
        pass  # not valid Python: parsing reports it
    return None
