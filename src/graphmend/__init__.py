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
from graphmend.notices import GraphMendWarning


def __getattr__(name: str) -> object:
    # graphmend.report imports torch: loaded on first use, so that installing the hook
    # at startup (GRAPHMEND=1) imports nothing more than it needs.
    if name == "report":
        from graphmend.reporting import report

        return report
    raise AttributeError(f"module 'graphmend' has no attribute {name!r}")


__all__ = [
    "DEFAULT_PACKAGES",
    "Config",
    "GraphMendWarning",
    "Installation",
    "__version__",
    "do_not_rewrite",
    "install",
    "report",
    "uninstall",
]
