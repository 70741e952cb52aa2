"""The cyclic garbage collector paused while a module is rewritten.

Parsing and analysing a module allocate hundreds of thousands of objects, which set
off collection after collection; with torch and transformers on the heap each costs
milliseconds, about half the time of a cold rewrite (measured).  What is left is freed
by reference counting, or by the next collection.

The collector is one switch for the whole process: threads rewriting at once share one
pause, and the last to finish puts it back as the first found it.  A child forked
meanwhile (a DataLoader worker, a ``fork`` pool) has no rewrite running: it gets the
collector back as it was before the pause.
"""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class _Pause:
    """How many rewrites run now, and whether the collector ran before the first."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.holders = 0
        self.was_enabled = False

    def begin(self) -> None:
        with self.lock:
            if self.holders == 0:
                self.was_enabled = gc.isenabled()
                gc.disable()
            self.holders += 1

    def end(self) -> None:
        with self.lock:
            self.holders -= 1
            if self.holders == 0 and self.was_enabled:
                gc.enable()

    def after_fork_in_child(self) -> None:
        # the lock may have been held by a thread the child does not have
        self.lock = threading.Lock()
        if self.holders and self.was_enabled:
            gc.enable()
        self.holders = 0


_PAUSE = _Pause()
if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(after_in_child=_PAUSE.after_fork_in_child)


@contextmanager
def collector_paused() -> Iterator[None]:
    """Run the block without the cyclic garbage collector (as it was before, after)."""
    _PAUSE.begin()
    try:
        yield
    finally:
        _PAUSE.end()
