"""Opting out in the source: a marker comment for a file, a decorator for a function or class.

* A comment ``# graphmend: skip-file`` anywhere in a module (as isort's
  ``# isort: skip_file``, pytest's ``PYTEST_DONT_REWRITE``): the import hook
  loads the module exactly as Python would, and ``explain``/``diff``/``cache
  warm`` report it as left alone.
* ``@graphmend.do_not_rewrite`` on a function or class (as AutoGraph's
  ``do_not_convert``): no rewrite touches it or anything nested in it.

Both are read from the source before any analysis, never at run time, so the
cache key (the source bytes) covers them and this module imports nothing: the
decorator is a no-op, recognised statically by the name it resolves to through
the module's imports (see :mod:`graphmend.rewrites.left_alone`).
"""

from __future__ import annotations

from typing import TypeVar

SKIP_FILE = "# graphmend: skip-file"

_Target = TypeVar("_Target")


def do_not_rewrite(target: _Target) -> _Target:
    """Leave a function or class, and everything nested in it, as written (returns it as is)."""
    if not callable(target):
        raise TypeError(
            "graphmend.do_not_rewrite decorates a function or class, as "
            f"'@graphmend.do_not_rewrite' without parentheses; got {type(target).__name__}"
        )
    return target
