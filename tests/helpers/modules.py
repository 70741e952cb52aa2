"""Import fixture source through the GraphMend hook."""

from __future__ import annotations

import importlib
import itertools
import sys
import textwrap
from pathlib import Path
from types import CodeType, ModuleType
from typing import Any

from graphmend.activation import install_config
from graphmend.config import ALL_REWRITES, Config


def import_rewritten(directory: Path, name: str, source: str) -> ModuleType:
    """Write ``source`` as module ``name`` in ``directory`` and import it, claimed by the hook
    with every rewrite."""
    config = Config(packages=(name,), cache_dir=directory / "cache", rewrites=ALL_REWRITES)
    with install_config(config):
        return import_plain(directory, name, source)


def import_both(directory: Path, stem: str, source: str) -> tuple[ModuleType, ModuleType]:
    """``source`` imported twice: as ``<stem>_plain``, and rewritten as ``<stem>_mended``."""
    return (
        import_plain(directory, f"{stem}_plain", source),
        import_rewritten(directory, f"{stem}_mended", source),
    )


def import_plain(directory: Path, name: str, source: str) -> ModuleType:
    """Write ``source`` as module ``name`` in ``directory`` and import it."""
    (directory / f"{name}.py").write_text(textwrap.dedent(source))
    sys.path.insert(0, str(directory))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(directory))


def run_as_module(code: CodeType, stem: str) -> dict[str, Any]:
    """Run ``code`` as a module of its own, registered in ``sys.modules`` under a new name
    made from ``stem`` (TorchDynamo 2.5 imports a traced function's module by name), and
    return its namespace."""
    module = ModuleType(f"{stem}_{next(_run_modules)}")
    sys.modules[module.__name__] = module
    exec(code, module.__dict__)
    return module.__dict__


_run_modules = itertools.count()


#: A module with one site of each rewrite: a predicated branch (T1), a lowered guard
#: (T3), then a deferred print (T2; after the guard, since output before a guard keeps
#: the guard's break).
EVERY_REWRITE = """
import torch

def step(x):
    if x.sum() > 0:
        y = x * 2
    else:
        y = x - 1
    if (y > 100).any():
        raise ValueError("too large")
    print("step", x.shape)
    return y + 1
"""
