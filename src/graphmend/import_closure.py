"""The modules of a scope that some modules import, found from their source without importing.

``cache warm transformers.models.llama`` must also warm what llama pulls in from
the scope (``transformers.modeling_utils``, ``transformers.cache_utils``, ...),
or the server still rewrites those at its first import.  Every import statement
of a file counts, wherever it is: inside functions (run at call time) and under
``if TYPE_CHECKING:``.  Imports are followed through the modules the scope
claims, never through others, so the walk stays inside the scope; but a name
imported from a package outside the scope is looked up among that package's
re-exports (``from .integrations import is_fsdp_enabled`` loads
``transformers.integrations.fsdp``, named in the ``TYPE_CHECKING`` block of the
lazy package ``transformers.integrations``).
"""

from __future__ import annotations

import ast
import importlib.machinery
from collections.abc import Iterable, Iterator
from pathlib import Path

from graphmend.compiling import parse_tree
from graphmend.discovery import ModuleFile
from graphmend.patterns import ModuleMatcher


def imported_modules(modules: Iterable[ModuleFile], scope: ModuleMatcher) -> list[ModuleFile]:
    """The modules ``scope`` claims that ``modules`` import, directly or through each other.

    ``modules`` themselves are left out; the result is sorted by name.
    """
    return _Closure(scope).of(list(modules))


class _Closure:
    """One walk: the specs found and the re-exports read, each once."""

    def __init__(self, scope: ModuleMatcher) -> None:
        self.scope = scope
        self._specs: dict[str, importlib.machinery.ModuleSpec | None] = {}
        self._exports: dict[str, dict[str, str]] = {}

    def of(self, start: list[ModuleFile]) -> list[ModuleFile]:
        seen = {module.name for module in start}
        found: dict[str, ModuleFile] = {}
        pending = list(start)
        while pending:
            module = pending.pop()
            for name in self._imported_names(module):
                if name in seen or not self.scope.matches(name):
                    continue
                seen.add(name)
                located = self._locate(name)
                if located is not None:
                    found[name] = located
                    pending.append(located)
        return sorted(found.values(), key=lambda module: module.name)

    def _imported_names(self, module: ModuleFile) -> Iterator[str]:
        """Every module name an import statement of ``module`` may load (and its parents)."""
        for node, target in _imports(module):
            yield from _with_parents(target)
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if alias.name == "*":
                        continue
                    # ``from package import name`` loads package.name when it is a
                    # submodule, or the module the package re-exports it from.
                    yield f"{target}.{alias.name}"
                    source = self._reexports(target).get(alias.name)
                    if source is not None:
                        yield source

    def _reexports(self, package: str) -> dict[str, str]:
        """Name -> module that an unclaimed package's ``__init__`` imports it from."""
        if package not in self._exports:
            self._exports[package] = {}
            init = self._locate(package)
            if init and init.path.name == "__init__.py" and not self.scope.matches(package):
                self._exports[package] = {
                    alias.asname or alias.name: target
                    for node, target in _imports(init)
                    if isinstance(node, ast.ImportFrom)
                    for alias in node.names
                }
        return self._exports[package]

    def _locate(self, name: str) -> ModuleFile | None:
        """The source file of ``name``, as the path-based import system would find it."""
        spec = self._spec(name)
        if spec is None or not spec.has_location or not str(spec.origin).endswith(".py"):
            return None
        return ModuleFile(name, Path(str(spec.origin)))

    def _spec(self, name: str) -> importlib.machinery.ModuleSpec | None:
        if name not in self._specs:
            parent, _, _ = name.rpartition(".")
            spec = None
            if not parent:
                spec = importlib.machinery.PathFinder.find_spec(name)
            else:
                parent_spec = self._spec(parent)
                locations = parent_spec and parent_spec.submodule_search_locations
                if locations:
                    spec = importlib.machinery.PathFinder.find_spec(name, list(locations))
            self._specs[name] = spec
        return self._specs[name]


def _imports(module: ModuleFile) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
    """Each import statement of ``module`` with the absolute module it names."""
    try:
        tree = parse_tree(module.path.read_bytes(), str(module.path))
    except (OSError, SyntaxError, ValueError):
        return
    package = module.name if module.path.name == "__init__.py" else module.name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((node, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = _absolute(node, package)
            if target is not None:
                yield node, target


def _absolute(node: ast.ImportFrom, package: str) -> str | None:
    """The module a ``from ... import`` names, or ``None`` when it reaches above the top."""
    if not node.level:
        return node.module
    parts = package.split(".") if package else []
    if node.level > len(parts):
        return None
    base = ".".join(parts[: len(parts) - node.level + 1])
    return f"{base}.{node.module}" if node.module else base


def _with_parents(name: str) -> Iterator[str]:
    """``a``, ``a.b`` and ``a.b.c`` for ``a.b.c``: importing a module imports its parents."""
    parts = name.split(".")
    for end in range(1, len(parts) + 1):
        yield ".".join(parts[:end])
