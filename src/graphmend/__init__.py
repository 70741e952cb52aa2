"""GraphMend: rewrite PyTorch model code at import so ``torch.compile`` captures one graph.

Three ways in: ``python -m graphmend run script.py``, ``GRAPHMEND=1`` in the
environment, or :func:`install` at program start.  ``# graphmend: skip-file`` in a
module and :func:`do_not_rewrite` on a function or class leave that code as written.
"""

from __future__ import annotations

__version__ = "0.1.0"

from graphmend.activation import Installation, install, uninstall
from graphmend.config import DEFAULT_PACKAGES, Config
from graphmend.directives import do_not_rewrite
from graphmend.rewriter import GraphMendWarning

__all__ = [
    "DEFAULT_PACKAGES",
    "Config",
    "GraphMendWarning",
    "Installation",
    "__version__",
    "do_not_rewrite",
    "install",
    "uninstall",
]
