"""Startup shim: ``GRAPHMEND=1`` in the environment installs GraphMend's import hook.

``graphmend_hook.pth`` in site-packages imports this module only when the
``GRAPHMEND`` variable is set, so a process without it pays one dictionary
lookup.  Images that prefer ``sitecustomize.py`` call :func:`activate_from_env`.
"""

from __future__ import annotations

import os
import sys


def activate_from_env() -> None:
    """Install the hook if ``GRAPHMEND`` is set to a true value; never raises."""
    value = os.environ.get("GRAPHMEND", "").strip().lower()
    if value in ("", "0", "false", "no", "off"):  # graphmend.config.is_enabled, not imported
        return
    try:
        import graphmend

        graphmend.install()
    except Exception as error:
        sys.stderr.write(f"graphmend: GRAPHMEND={value} but the hook was not installed: {error}\n")


activate_from_env()
