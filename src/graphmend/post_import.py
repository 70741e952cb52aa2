"""Run a callback once a module has been imported, without importing it.

Used to finish setting up once TorchDynamo is imported (importing it eagerly
would add about a second to the import of every rewritten module), and to bind
the runtime into a rewritten module that does not import torch itself, once torch
is imported.  It imports nothing of torch.
"""

from __future__ import annotations

import importlib.machinery
import sys
import threading
from collections.abc import Callable, Sequence
from types import FrameType, ModuleType
from typing import Any

from graphmend import importer  # a module: importer imports the rewriter, which imports this
from graphmend.notices import warn

Callback = Callable[[ModuleType], None]


def _is_ready(name: str) -> bool:
    module = sys.modules.get(name)
    spec = getattr(module, "__spec__", None)
    return module is not None and not getattr(spec, "_initializing", False)


def importing_here(name: str) -> bool:
    """Whether this thread is running the import of module ``name``: its code is on the stack.

    (Another thread importing it makes this one wait at its own import of it.)
    """
    if name not in sys.modules or _is_ready(name):
        return False
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") == name:
            return True
        frame = frame.f_back
    return False


class _CallbackLoader:
    """Wraps the real loader; runs the module's callbacks once it has executed.

    The callbacks are taken only then, not when the spec is found: a spec asked for
    without an import (``importlib.util.find_spec("torch")``, as transformers'
    ``is_torch_available`` does) must leave them waiting for the real import.
    """

    def __init__(self, loader: Any, finder: _PostImportFinder) -> None:
        self._loader = loader
        self._finder = finder

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        # The module keeps its real loader; this wrapper is gone after the import.
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        for callback in self._finder.take(module.__name__):
            _run(callback, module)

    def __getattr__(self, name: str) -> Any:
        # the rest of the loader's interface (get_filename, is_package, resources...)
        return getattr(self._loader, name)


def _run(callback: Callback, module: ModuleType) -> None:
    """One callback; what it raises is reported, never the import's exception, and the
    callbacks after it still run."""
    try:
        callback(module)
    except Exception as error:
        warn(
            f"graphmend: setting up after {module.__name__} was imported failed "
            f"({type(error).__name__}: {error}); please report it"
        )


class _PostImportFinder:
    def __init__(self) -> None:
        self.pending: dict[str, list[Callback]] = {}
        self._lock = threading.Lock()

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.pending:
            return None
        spec = importer.find_spec_elsewhere(self, fullname, path, target)
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _CallbackLoader(spec.loader, self)
        return spec

    def take(self, name: str) -> list[Callback]:
        """The callbacks waiting for ``name``, no longer pending."""
        with self._lock:
            callbacks = self.pending.pop(name, [])
            if not self.pending and self in sys.meta_path:
                sys.meta_path.remove(self)
        return callbacks


_finder = _PostImportFinder()


def when_imported(name: str, callback: Callback) -> None:
    """Call ``callback(module)`` now if ``name`` is imported, else right after its import."""
    if _is_ready(name):
        _run(callback, sys.modules[name])
        return
    with _finder._lock:
        _finder.pending.setdefault(name, []).append(callback)
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)
