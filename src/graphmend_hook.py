"""Startup shim: ``GRAPHMEND=1`` in the environment installs GraphMend's import hook.

``graphmend_hook.pth`` in site-packages imports this module only when the
``GRAPHMEND`` variable is set, so a process without it pays one dictionary
lookup, and one with an off-word (``GRAPHMEND=0``) imports nothing more.
Images that prefer ``sitecustomize.py`` call :func:`activate_from_env`.
"""

from __future__ import annotations

import os
import sys

#: ``graphmend.config.OFF_WORDS``, repeated so that an off-word imports nothing.
OFF_WORDS = ("", "0", "false", "no", "off")


def activate_from_env() -> None:
    """Install the hook if ``GRAPHMEND`` is an on-word; never raises.

    An unknown word or a bad ``GRAPHMEND_*`` value leaves the hook out, with
    one line on stderr naming the variable and the value.
    """
    if os.environ.get("GRAPHMEND", "").strip().lower() in OFF_WORDS:
        return
    try:
        from graphmend.config import hook_requested

        if hook_requested():
            import graphmend

            graphmend.install()
    except Exception as error:
        # As graphmend.notices.write_stderr, which may be what failed to import: stderr
        # is None when closed (2>&-), and a write to a broken pipe or a full disk fails.
        import contextlib

        if sys.stderr is not None:
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.write(f"graphmend: the import hook was not installed: {error}\n")


activate_from_env()
