"""GraphMend's warnings, which never become the exception of what they are about.

A filter that turns warnings into errors (``python -W error``, pytest's
``filterwarnings = error``) would otherwise make a warning about an import fail
that import, and one issued while TorchDynamo traces fail the compiled call:
where the filter says so, the message is written to stderr instead.
"""

from __future__ import annotations

import contextlib
import os
import sys
import types
import warnings
from collections.abc import Iterator
from typing import TextIO


class GraphMendWarning(UserWarning):
    """Something GraphMend could not do, and what happens instead."""


def warn(message: str) -> None:
    """Issue ``message`` as a :class:`GraphMendWarning`, or write it to stderr.

    It is attributed to the first frame outside GraphMend: the program's ``import``,
    call or ``install()`` that led to it, not a line of GraphMend's own code.
    """
    level = _first_frame_outside()
    if level is None:  # GraphMend's command line, with no line of the user's to name
        write_stderr(f"{message}\n")
        return
    try:
        warnings.warn(message, GraphMendWarning, stacklevel=level)
    except GraphMendWarning:
        write_stderr(f"{message}\n")


_OWN_DIRECTORY = os.path.dirname(os.path.abspath(__file__)) + os.sep


#: While GraphMend's command line runs (:func:`command_line`), the files of the frames
#: that started it: ``python -m``'s runpy, or the ``graphmend`` console script.
_launchers: frozenset[str] = frozenset()


@contextlib.contextmanager
def command_line(launcher: str) -> Iterator[None]:
    """While GraphMend's command line runs from ``launcher`` (its ``sys.argv[0]``): a
    warning with no frame of the user's above it, only the launcher's, is written as its
    message, not attributed to a line of runpy or of the console script."""
    global _launchers
    saved = _launchers
    _launchers = frozenset({*_RUNPY_FILES, os.path.abspath(launcher)})
    try:
        yield
    finally:
        _launchers = saved


def _first_frame_outside() -> int | None:
    """The ``stacklevel`` that makes a warning issued in :func:`warn` name the first frame
    not in GraphMend's package, counted as :mod:`warnings` counts it (import machinery
    frames are skipped, not counted); ``None`` where GraphMend's command line runs and
    that frame is its launcher's, or there is none."""
    frame, level = sys._getframe(1), 1  # warn's frame, which warnings.warn starts from
    while frame is not None and frame.f_code.co_filename.startswith(_OWN_DIRECTORY):
        frame, level = frame.f_back, level + 1
        while frame is not None and _import_machinery(frame):
            frame = frame.f_back
    if _launchers and (frame is None or frame.f_code.co_filename in _launchers):
        return None
    return level


#: The file names of :mod:`runpy`'s frames, which run ``python -m graphmend``.
_RUNPY_FILES = ("<frozen runpy>", os.path.join(os.path.dirname(os.__file__), "runpy.py"))


def _import_machinery(frame: types.FrameType) -> bool:
    """Whether :mod:`warnings` skips ``frame`` (importlib's bootstrap, as it judges it)."""
    filename = frame.f_code.co_filename
    return "importlib" in filename and "_bootstrap" in filename


def write_stderr(text: str, *, flush: bool = False) -> None:
    """Write ``text`` to stderr (and flush it, under ``flush``) if it can be written,
    else say nothing.

    ``sys.stderr`` is ``None`` in a process started with it closed (``2>&-``), and a
    write fails on a pipe whose reader went away or on a full disk; as :mod:`warnings`
    does, GraphMend then drops the message rather than fail what it reports on.
    """
    if sys.stderr is None:
        return
    with contextlib.suppress(OSError, ValueError):  # ValueError: the program closed it
        sys.stderr.write(text)
        if flush:
            sys.stderr.flush()


def flush(stream: TextIO | None) -> None:
    """Flush ``stream``; nothing for ``None``, a standard stream closed at startup."""
    if stream is not None:
        stream.flush()
