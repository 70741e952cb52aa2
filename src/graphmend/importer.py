"""The import hook: a meta-path finder that claims modules by name, and their loader.

The finder rejects names on the module patterns alone, before any file-system
work; for a claimed name it asks the other finders for the spec and takes the
module only when it is plain source loaded by ``SourceFileLoader`` (namespace
packages, extension modules, sourceless and zipped modules stay as they are).
The loader is a ``SourceFileLoader`` whose ``get_code`` returns the rewritten
code: ``__file__``, ``__spec__``, ``get_source`` (so ``inspect``), resources and
``importlib.reload`` behave as without GraphMend.

transformers loads ``trust_remote_code`` modules with
``importlib.util.spec_from_file_location`` and ``exec_module``, which never
consults ``sys.meta_path``; :func:`claiming_spec_from_file_location` wraps that
function so those modules are claimed too.  transformers 4.40 loads them with
``SourceFileLoader(name, path).load_module()`` (deprecated, and blind to both);
:func:`claiming_load_module` wraps that method the same way.
"""

from __future__ import annotations

import functools
import importlib.machinery
import importlib.util
import sys
import threading
import weakref
from collections.abc import Callable, Sequence
from types import CodeType, ModuleType
from typing import Any

from graphmend.notices import write_stderr
from graphmend.patterns import ModuleMatcher, reserved
from graphmend.rewriter import ModuleRewriter


class GraphMendLoader(importlib.machinery.SourceFileLoader):
    """Loads a claimed source module with its rewritten code."""

    def __init__(self, fullname: str, path: str, rewriter: ModuleRewriter) -> None:
        super().__init__(fullname, path)
        self._rewriter = rewriter

    def get_code(self, fullname: str) -> CodeType:  # type: ignore[override]
        path = self.get_filename(fullname)
        try:
            source = self.get_data(path)
        except OSError:
            return super().get_code(fullname)  # type: ignore[return-value]
        code = self._rewriter.code_for(
            fullname,
            path,
            source,
            compile_as_python=lambda: super(GraphMendLoader, self).get_code(fullname),
        )
        if code is None:
            return super().get_code(fullname)  # type: ignore[return-value]
        return code


def claimable(spec: importlib.machinery.ModuleSpec | None) -> bool:
    """Whether a spec is a plain source module that GraphMend can take over.

    Its loader must load the spec's own module and file: a loader given to
    ``spec_from_file_location`` may name another file (or module) than the spec,
    and it, not the spec's origin, is what Python runs.
    """
    return (
        spec is not None
        and type(spec.loader) is importlib.machinery.SourceFileLoader
        and isinstance(spec.origin, str)
        and spec.origin.endswith(".py")
        and spec.loader.path == spec.origin
        and spec.loader.name == spec.name
    )


class GraphMendFinder:
    """Claims modules whose dotted names match the configured patterns (a meta-path finder)."""

    def __init__(self, matcher: ModuleMatcher, rewriter: ModuleRewriter) -> None:
        self.matcher = matcher
        self.rewriter = rewriter
        self._busy = threading.local()

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not self.claims(fullname):
            return None
        busy: set[str] = self._busy.__dict__.setdefault("names", set())
        if fullname in busy:
            return None
        busy.add(fullname)
        try:
            spec = find_spec_elsewhere(self, fullname, path, target)
        finally:
            busy.discard(fullname)
        if not claimable(spec):
            self._note_left_alone(spec)
            return None
        assert spec is not None and spec.origin is not None
        spec.loader = GraphMendLoader(fullname, spec.origin, self.rewriter)
        return spec

    def _note_left_alone(self, spec: importlib.machinery.ModuleSpec | None) -> None:
        """A debug line for a claimed module of a file that another loader serves (another
        import hook's, typeguard's or beartype's, a zip archive's): Python's machinery
        runs it, not GraphMend's."""
        if spec is None or spec.loader is None or not isinstance(spec.origin, str):
            return
        if self.rewriter.config.debug:
            loader = type(spec.loader)
            write_stderr(
                f"graphmend: {spec.name}: left alone: its loader "
                f"({loader.__module__}.{loader.__qualname__}) does not load {spec.origin} "
                "as Python's source loader; loaded as Python would\n"
            )

    def claims(self, fullname: str) -> bool:
        """Whether the module ``fullname`` is GraphMend's to rewrite.

        The patterns cannot name a reserved module (GraphMend's own, torch, what
        they import), but a glob such as ``*.modeling_*`` could still match one;
        refusing here too keeps every torch program importable whatever matched.
        """
        return self.matcher.matches(fullname) and not reserved(fullname)

    def claim_spec(self, spec: importlib.machinery.ModuleSpec | None) -> None:
        """Give a spec built outside the import system GraphMend's loader, if claimed."""
        if claimable(spec) and self.claims(spec.name):  # type: ignore[union-attr]
            spec.loader = GraphMendLoader(spec.name, spec.origin, self.rewriter)  # type: ignore[union-attr,arg-type]


#: What each of GraphMend's wrappers wraps.  Not an attribute of the wrapper: another
#: library's wrapper of it made with ``functools.wraps`` would hold a copy.
_WRAPPED: weakref.WeakKeyDictionary[Callable[..., Any], Callable[..., Any]] = (
    weakref.WeakKeyDictionary()
)


def unwrapped(function: object) -> Callable[..., Any] | None:
    """What ``function`` wraps if it is one of GraphMend's wrappers, else None."""
    try:
        return _WRAPPED.get(function)  # type: ignore[arg-type]
    except TypeError:  # not weakly referenceable: not a function of ours
        return None


def wraps_graphmend(function: object) -> bool:
    """Whether ``function`` is, or wraps by ``functools.wraps``, one of GraphMend's
    wrappers."""
    seen: set[int] = set()
    while function is not None and id(function) not in seen:
        if unwrapped(function) is not None:
            return True
        seen.add(id(function))
        function = getattr(function, "__wrapped__", None)
    return False


def claiming_spec_from_file_location(
    original: Callable[..., Any], finder_of: Callable[[], GraphMendFinder | None]
) -> Callable[..., Any]:
    """Wrap ``importlib.util.spec_from_file_location`` so claimed names get our loader."""

    @functools.wraps(original)
    def spec_from_file_location(*args: Any, **kwargs: Any) -> Any:
        spec = original(*args, **kwargs)
        finder = finder_of()
        if finder is not None:
            finder.claim_spec(spec)
        return spec

    _WRAPPED[spec_from_file_location] = original
    return spec_from_file_location


def claiming_load_module(
    original: Callable[..., Any], finder_of: Callable[[], GraphMendFinder | None]
) -> Callable[..., Any]:
    """Wrap ``SourceFileLoader.load_module`` so claimed names load with our loader."""

    @functools.wraps(original)
    def load_module(self: importlib.machinery.SourceFileLoader, fullname: str | None = None) -> Any:
        finder = finder_of()
        if finder is not None and type(self) is importlib.machinery.SourceFileLoader:
            spec = importlib.util.spec_from_loader(self.name, self)
            finder.claim_spec(spec)
            if spec is not None and isinstance(spec.loader, GraphMendLoader):
                return original(spec.loader, fullname)
        return original(self, fullname)

    _WRAPPED[load_module] = original
    return load_module


def find_spec_elsewhere(
    finder: object, fullname: str, path: Sequence[str] | None, target: ModuleType | None
) -> importlib.machinery.ModuleSpec | None:
    """The spec the meta-path finders other than ``finder`` give for a module."""
    for other in list(sys.meta_path):
        if other is finder:
            continue
        find_spec = getattr(other, "find_spec", None)
        if find_spec is not None:
            spec = find_spec(fullname, path, target)
        else:
            spec = _legacy_spec(other, fullname, path)
        if spec is not None:
            return spec
    return None


def _legacy_spec(
    finder: object, fullname: str, path: Sequence[str] | None
) -> importlib.machinery.ModuleSpec | None:
    """The spec Python 3.11 and earlier make of a finder with ``find_module`` alone (PEP
    302, left out from 3.12 on): one of the loader it gives, as ``importlib`` makes it."""
    find_module = getattr(finder, "find_module", None)
    if sys.version_info >= (3, 12) or find_module is None:
        return None
    loader = find_module(fullname, path)
    return None if loader is None else importlib.util.spec_from_loader(fullname, loader)
