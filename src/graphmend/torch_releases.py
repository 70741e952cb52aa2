"""The torch releases GraphMend's TorchDynamo support is tested on, and the one installed.

Deferred output (T2) relies on TorchDynamo internals (``runtime/dynamo_support.py``) and
is on only for the releases the test suite runs on.  Elsewhere the calls stay as
written, so that they break the graph where plain compile's do: the import hook, which
may run before torch is imported, reads the installed release without importing it.
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Set

from graphmend.notices import warn

#: The oldest and newest torch releases (major, minor) the test suite runs on.
TESTED = ((2, 5), (2, 15))

#: The rewrite that needs TorchDynamo's support (``config.ALL_REWRITES``).
DEFERRED_OUTPUT = "defer"

#: The untested releases :func:`warn_untested` has warned of in this process.
_warned: set[str] = set()


def torch_release(version: str) -> tuple[int, int] | None:
    """``(major, minor)`` of a torch version string such as ``2.13.0+cpu``; None if unreadable."""
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match[1]), int(match[2])) if match else None


def is_tested(version: str) -> bool:
    """Whether a torch version string names a release within :data:`TESTED`."""
    release = torch_release(version)
    return release is not None and TESTED[0] <= release <= TESTED[1]


def installed_torch_version() -> str | None:
    """``torch.__version__`` where torch is imported, else the version of the installed
    distribution; ``None`` where neither is known."""
    version = getattr(sys.modules.get("torch"), "__version__", None)
    return version if isinstance(version, str) else _distribution_version()


@functools.lru_cache(maxsize=1)
def _distribution_version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


def runnable_rewrites(rewrites: Set[str], version: str | None = None) -> frozenset[str]:
    """``rewrites`` less deferred output where torch (``version``, else the installed
    one) is outside :data:`TESTED`: unregistered with TorchDynamo, a deferred call would
    break the graph inside a function of GraphMend's, one break more than the original
    call (:func:`warn_untested`).  Unchanged where the release is unknown."""
    version = installed_torch_version() if version is None else version
    if version is None or is_tested(version) or DEFERRED_OUTPUT not in rewrites:
        return frozenset(rewrites)
    warn_untested(version)
    return frozenset(rewrites) - {DEFERRED_OUTPUT}


def warn_untested(version: str) -> None:
    """Say, once per process, that deferred output is off on the untested ``version``."""
    if version in _warned:
        return
    _warned.add(version)
    newest = ".".join(map(str, TESTED[1]))
    warn(
        f"GraphMend: torch {version} is not among the releases its TorchDynamo support is "
        f"tested on (2.5 to {newest}); print, logging and warnings calls in compiled code "
        "keep their graph breaks"
    )
