"""``install()`` / ``uninstall()``: put the import hook in place, or take it away."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import threading
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from types import TracebackType

from graphmend.config import Config, ConfigError, expand_home
from graphmend.importer import (
    GraphMendFinder,
    GraphMendLoader,
    claiming_load_module,
    claiming_spec_from_file_location,
    unwrapped,
    wraps_graphmend,
)
from graphmend.notices import warn
from graphmend.patterns import ModuleMatcher
from graphmend.rewriter import ModuleRewriter

_lock = threading.RLock()
_active: Installation | None = None


class Installation:
    """The installed hook.  Usable as a context manager that uninstalls on exit."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.finder = GraphMendFinder(ModuleMatcher(config.packages), ModuleRewriter(config))

    @property
    def packages(self) -> tuple[str, ...]:
        """The module patterns this installation claims."""
        return self.config.packages

    @property
    def active(self) -> bool:
        """Whether this is the installed hook (not uninstalled or replaced)."""
        return _active is self

    def uninstall(self) -> None:
        """Remove the hook; modules already rewritten stay as they are."""
        if self.active:
            uninstall()

    def __enter__(self) -> Installation:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.uninstall()

    def __repr__(self) -> str:
        state = "active" if self.active else "inactive"
        return f"<graphmend.Installation {state} packages={list(self.packages)!r}>"


def install(
    packages: Iterable[str] | None = None, *, cache_dir: str | Path | None = None
) -> Installation:
    """Rewrite matching modules from now on; returns the installation.

    ``packages`` are module patterns (``"mypkg"`` covers the package and its
    submodules, ``"transformers.models.*"`` is a glob); they replace the default
    scope, which is :data:`graphmend.DEFAULT_PACKAGES` or ``GRAPHMEND_PACKAGES``.
    Other settings come from the ``GRAPHMEND_*`` environment variables.  Calling
    it again is harmless: the hook is installed once, with the latest settings.
    """
    config = Config.from_env()
    if packages is not None:
        given = packages
        if not isinstance(packages, Iterable) or isinstance(packages, bytes):
            raise ConfigError(f"packages={given!r}: module patterns are strings")
        packages = [packages] if isinstance(packages, str) else list(packages)
        if not all(isinstance(pattern, str) for pattern in packages):
            raise ConfigError(f"packages={given!r}: module patterns are strings")
        if not packages:  # as GRAPHMEND_PACKAGES=',' is refused
            raise ConfigError(
                "packages=[] names no module pattern (leave it out for the default scope)"
            )
        config = config.with_packages(packages)
    if cache_dir is not None:
        if isinstance(cache_dir, str) and not cache_dir.strip():  # a Path("") is "."
            raise ConfigError(
                f"cache_dir={cache_dir!r} names no directory (leave it out for the default)"
            )
        try:
            expanded = expand_home(Path(cache_dir))
        except ConfigError as error:
            raise ConfigError(f"cache_dir={str(cache_dir)!r}: {error}") from None
        config = replace(config, cache_dir=expanded)
    return install_config(config)


def install_config(config: Config) -> Installation:
    """Install the hook with a complete configuration (used by ``install`` and the CLI)."""
    global _active
    with _lock:
        if _active is not None and _active.config == config and _active.finder in sys.meta_path:
            return _active  # installed, and still in place (a harness may restore the list)
        _remove_hook()
        installation = Installation(config)
        sys.meta_path.insert(0, installation.finder)
        _active = installation
        _wrap_spec_from_file_location()
        _wrap_load_module()
    _warn_about_imported(installation)
    return installation


def current() -> Installation | None:
    """The installed hook, if any."""
    return _active


def uninstall() -> None:
    """Remove the hook.  Modules imported while it was installed stay rewritten."""
    with _lock:
        _remove_hook()
        _unwrap_spec_from_file_location()
        _unwrap_load_module()


def _remove_hook() -> None:
    global _active
    if _active is not None:
        if _active.finder in sys.meta_path:
            sys.meta_path.remove(_active.finder)
        _active = None


def _current_finder() -> GraphMendFinder | None:
    return _active.finder if _active is not None else None


def _wrap_spec_from_file_location() -> None:
    current = importlib.util.spec_from_file_location
    if not wraps_graphmend(current):
        importlib.util.spec_from_file_location = claiming_spec_from_file_location(
            current, _current_finder
        )


def _unwrap_spec_from_file_location() -> None:
    # only GraphMend's own wrapper: one another library put around it stays (and ours
    # in it, which does nothing while no hook is installed)
    original = unwrapped(importlib.util.spec_from_file_location)
    if original is not None:
        importlib.util.spec_from_file_location = original


def _wrap_load_module() -> None:
    loader = importlib.machinery.SourceFileLoader
    current = getattr(loader, "load_module", None)  # deprecated: a Python may lack it
    if current is not None and not wraps_graphmend(current):
        loader.load_module = claiming_load_module(current, _current_finder)  # type: ignore[method-assign]


def _unwrap_load_module() -> None:
    loader = importlib.machinery.SourceFileLoader
    original = unwrapped(vars(loader).get("load_module"))
    if original is not None:
        del loader.load_module  # the method it inherits, unless it had its own
        if loader.load_module is not original:
            loader.load_module = original  # type: ignore[method-assign]


def _warn_about_imported(installation: Installation) -> None:
    stale = sorted(
        name
        for name, module in list(sys.modules.items())
        if installation.finder.claims(name)
        and name != "__main__"  # the running program (``run DIRECTORY`` claims it)
        and str(getattr(module, "__file__", None) or "").endswith(".py")
        and not isinstance(getattr(module, "__loader__", None), GraphMendLoader)
    )
    if stale:
        shown = ", ".join(stale[:5]) + (f" and {len(stale) - 5} more" if len(stale) > 5 else "")
        warn(
            f"graphmend.install(): {len(stale)} matching module(s) were imported before "
            f"the hook and stay unrewritten: {shown}. Install GraphMend before importing "
            "them (or use GRAPHMEND=1 / python -m graphmend run)."
        )
