"""For images that prefer ``sitecustomize`` to a ``.pth`` file.

Copy this file onto ``sys.path`` (for example into site-packages); with
``GRAPHMEND=1`` in the environment every Python process then starts with
GraphMend's import hook installed.  Without the variable it costs one
environment lookup.  It does nothing more than the ``graphmend_hook.pth`` that
``pip install graphmend`` already puts in site-packages, so use one or the other.
"""

import os

if os.environ.get("GRAPHMEND"):
    import graphmend_hook  # noqa: F401  (installs the hook on import)
