"""The cyclic garbage collector paused while a module is rewritten.

Parsing and analysing a module allocate hundreds of thousands of objects, which set
off collection after collection; with torch and transformers on the heap each costs
milliseconds, about half the time of a cold rewrite (measured).  What is left is freed
by reference counting, or by the next collection.

The pause sets the collector's first threshold to zero, which stops automatic
collection, rather than switching the collector off: ``gc.isenabled()``,
``gc.disable()`` and ``gc.enable()`` stay the program's (a thread that switched the
collector off while another thread rewrote a module found it on again after the
rewrite, and read ``gc.isenabled()`` False during it).  The thresholds are one setting
for the whole process: threads rewriting at once share one pause, and the last to
finish puts them back as the first found them, unless the program set others
meanwhile.  A child forked meanwhile (a DataLoader worker, a ``fork`` pool) has no
rewrite running: it gets them back as they were before the pause.
"""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class _Pause:
    """How many rewrites run now, and the collector's thresholds before the first."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.holders = 0
        self.thresholds: tuple[int, ...] = gc.get_threshold()

    def begin(self) -> None:
        with self.lock:
            if self.holders == 0:
                self.thresholds = gc.get_threshold()
                gc.set_threshold(0, *self.thresholds[1:])
            self.holders += 1

    def end(self) -> None:
        with self.lock:
            self.holders -= 1
            if self.holders == 0:
                self._resume()

    def _resume(self) -> None:
        """The thresholds back as they were, unless the program set others meanwhile."""
        if gc.get_threshold() == (0, *self.thresholds[1:]):
            gc.set_threshold(*self.thresholds)

    def after_fork_in_child(self) -> None:
        # the lock may have been held by a thread the child does not have
        self.lock = threading.Lock()
        if self.holders:
            self._resume()
        self.holders = 0


_PAUSE = _Pause()
if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(after_in_child=_PAUSE.after_fork_in_child)


@contextmanager
def collector_paused() -> Iterator[None]:
    """Run the block without automatic garbage collection (as it was before, after)."""
    _PAUSE.begin()
    try:
        yield
    finally:
        _PAUSE.end()
