"""Shared fixtures: fixture modules loaded through the hook, graph counting, subprocesses."""

from __future__ import annotations

import itertools
import os
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

import graphmend
from helpers.modules import import_plain, import_rewritten

_counter = itertools.count()


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    return tmp_path / "cache"


@pytest.fixture(autouse=True)
def _isolated(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No GraphMend settings leak in from the environment, and no hook leaks out."""
    for variable in (
        "GRAPHMEND",
        "GRAPHMEND_PACKAGES",
        "GRAPHMEND_LOG",
        "GRAPHMEND_REWRITES",
        "GRAPHMEND_CACHE",
        "GRAPHMEND_CUDA_GUARDS",
    ):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("GRAPHMEND_CACHE_DIR", str(cache_dir))
    yield
    graphmend.uninstall()


@pytest.fixture
def write_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., str]:
    """Write ``source`` as a fresh, uniquely named top-level module; returns its name."""
    root = tmp_path / "modules"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))

    def write(source: str, *, name: str | None = None, encoding: str = "utf-8") -> str:
        module = name or f"gm_fixture_{os.getpid()}_{next(_counter)}"
        (root / f"{module}.py").write_bytes(textwrap.dedent(source).encode(encoding))
        return module

    return write


@pytest.fixture
def load_rewritten(tmp_path: Path) -> Callable[[str], ModuleType]:
    """Import ``source`` as a fresh, uniquely named module claimed by the hook."""
    directory = tmp_path / "rewritten"
    directory.mkdir()

    def load(source: str) -> ModuleType:
        return import_rewritten(directory, f"gm_fixture_{os.getpid()}_{next(_counter)}", source)

    return load


@pytest.fixture
def load_both(tmp_path: Path) -> Callable[[str], tuple[ModuleType, ModuleType]]:
    """Import ``source`` twice, as fresh modules: plainly, and claimed by the hook."""
    directory = tmp_path / "both"
    directory.mkdir()

    def load(source: str) -> tuple[ModuleType, ModuleType]:
        plain = import_plain(directory, f"gm_plain_{os.getpid()}_{next(_counter)}", source)
        name = f"gm_fixture_{os.getpid()}_{next(_counter)}"
        return plain, import_rewritten(directory, name, source)

    return load
