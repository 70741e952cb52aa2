"""Find the source files of the modules a set of patterns claims, without importing them."""

from __future__ import annotations

import importlib.machinery
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from graphmend.patterns import ModuleMatcher


@dataclass(frozen=True)
class ModuleFile:
    """A module's dotted name and its source file."""

    name: str
    path: Path


class DiscoveryError(ValueError):
    """A pattern whose modules cannot be listed."""


def discover(matcher: ModuleMatcher) -> list[ModuleFile]:
    """Every source module on ``sys.path`` that ``matcher`` claims, sorted by name."""
    for pattern in matcher.patterns:
        if pattern.split(".", 1)[0] not in matcher.roots():
            raise DiscoveryError(
                f"cannot list the modules of {pattern!r}: its top-level package is a glob"
            )
    found: dict[str, ModuleFile] = {}
    for root in matcher.roots():
        for module in _modules_under(root):
            if matcher.matches(module.name):
                found.setdefault(module.name, module)
    return sorted(found.values(), key=lambda module: module.name)


def _modules_under(root: str) -> Iterator[ModuleFile]:
    spec = importlib.machinery.PathFinder.find_spec(root)
    if spec is None:
        return
    if not spec.submodule_search_locations:
        if spec.origin and spec.origin.endswith(".py"):
            yield ModuleFile(root, Path(spec.origin))
        return
    for location in spec.submodule_search_locations:
        yield from _walk_package(root, Path(location))


def _walk_package(package: str, directory: Path) -> Iterator[ModuleFile]:
    for current, dirnames, filenames in os.walk(directory):
        relative = Path(current).relative_to(directory).parts
        dirnames[:] = sorted(d for d in dirnames if d.isidentifier())
        prefix = ".".join((package, *relative))
        for filename in sorted(filenames):
            stem, suffix = os.path.splitext(filename)
            if suffix != ".py" or not stem.isidentifier():
                continue
            name = prefix if stem == "__init__" else f"{prefix}.{stem}"
            yield ModuleFile(name, Path(current) / filename)
