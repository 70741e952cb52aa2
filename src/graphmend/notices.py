"""GraphMend's warnings, which never become the exception of what they are about.

A filter that turns warnings into errors (``python -W error``, pytest's
``filterwarnings = error``) would otherwise make a warning about an import fail
that import, and one issued while TorchDynamo traces fail the compiled call:
where the filter says so, the message is written to stderr instead.
"""

from __future__ import annotations

import contextlib
import sys
import warnings


class GraphMendWarning(UserWarning):
    """Something GraphMend could not do, and what happens instead."""


def warn(message: str, stacklevel: int = 2) -> None:
    """Issue ``message`` as a :class:`GraphMendWarning` (``stacklevel`` as for
    :func:`warnings.warn`, counted from the caller), or write it to stderr."""
    try:
        warnings.warn(message, GraphMendWarning, stacklevel=stacklevel + 1)
    except GraphMendWarning:
        write_stderr(f"{message}\n")


def write_stderr(text: str) -> None:
    """Write ``text`` to stderr if it can be written, else say nothing.

    ``sys.stderr`` is ``None`` in a process started with it closed (``2>&-``), and a
    write fails on a pipe whose reader went away or on a full disk; as :mod:`warnings`
    does, GraphMend then drops the message rather than fail what it reports on.
    """
    if sys.stderr is None:
        return
    with contextlib.suppress(OSError, ValueError):  # ValueError: the program closed it
        sys.stderr.write(text)
