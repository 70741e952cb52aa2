"""Settings: which modules are claimed, where the cache lives, which rewrites run.

Every setting has an environment variable, so that ``GRAPHMEND=1`` alone can
configure a process (a serving container, each ``torchrun`` rank):

``GRAPHMEND_PACKAGES``   comma-separated module patterns; replaces the default scope
``GRAPHMEND_CACHE_DIR``  cache directory (default: the user cache directory)
``GRAPHMEND_CACHE``      ``0`` turns the bytecode cache off
``GRAPHMEND_REWRITES``   comma-separated rewrites to run (unset: all; empty: none)
``GRAPHMEND_LOG``        ``debug`` writes one line per claimed module to stderr

``GRAPHMEND_CUDA_GUARDS=sync`` is read by :mod:`graphmend.runtime.traps`, where
it takes effect: it decides what the rewritten code does on CUDA, not what is
rewritten.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from graphmend.patterns import ModuleMatcher

#: Where transformers keeps model code and the code it calls while a model runs,
#: plus ``transformers_modules.*``, the modules of ``trust_remote_code`` models.
DEFAULT_PACKAGES: tuple[str, ...] = (
    "transformers.models.*",
    "transformers.modeling_*",
    "transformers.masking_utils",
    "transformers.cache_utils",
    "transformers.integrations.*",
    "transformers.pytorch_utils",
    "transformers.activations",
    "transformers.loss.*",
    "transformers_modules.*",
)

#: The rewrites GraphMend knows, in the order the pipeline applies them.
ALL_REWRITES: tuple[str, ...] = ("predicate", "trap", "defer")

_FALSE_WORDS = frozenset({"", "0", "false", "no", "off"})


class ConfigError(ValueError):
    """A setting (argument or environment variable) with a value GraphMend cannot use."""


def default_cache_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """The per-user cache directory, following each platform's convention."""
    if sys.platform == "win32":
        base = environ.get("LOCALAPPDATA") or str(Path.home() / "AppData" / "Local")
        return Path(base) / "graphmend" / "Cache"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "graphmend"
    base = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "graphmend"


def is_enabled(value: str | None) -> bool:
    """Whether an environment flag such as ``GRAPHMEND`` is switched on."""
    return value is not None and value.strip().lower() not in _FALSE_WORDS


def _split(value: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in value.split(",") if part.strip())


def _check_rewrites(names: Iterable[str]) -> frozenset[str]:
    chosen = frozenset(names)
    unknown = sorted(chosen - set(ALL_REWRITES))
    if unknown:
        raise ConfigError(
            f"unknown rewrite(s) {', '.join(unknown)}; known: {', '.join(ALL_REWRITES)}"
        )
    return chosen


@dataclass(frozen=True)
class Config:
    """Everything that decides what GraphMend does in one process."""

    packages: tuple[str, ...] = DEFAULT_PACKAGES
    cache_dir: Path = field(default_factory=default_cache_dir)
    cache_enabled: bool = True
    rewrites: frozenset[str] = frozenset(ALL_REWRITES)
    debug: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "rewrites", _check_rewrites(self.rewrites))
        # Validates the patterns now rather than at the first import.
        ModuleMatcher(self.packages)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Config:
        """Read the ``GRAPHMEND_*`` environment variables."""
        packages = _split(environ.get("GRAPHMEND_PACKAGES", "")) or DEFAULT_PACKAGES
        cache_dir = environ.get("GRAPHMEND_CACHE_DIR", "").strip()
        rewrites = environ.get("GRAPHMEND_REWRITES")
        log = environ.get("GRAPHMEND_LOG", "").strip().lower()
        if log not in ("", "debug", "warning"):
            raise ConfigError(
                f"GRAPHMEND_LOG={log!r}: use 'debug' (a line per claimed module) "
                "or 'warning' (the default: only modules that fell back)"
            )
        return cls(
            packages=packages,
            cache_dir=Path(cache_dir).expanduser() if cache_dir else default_cache_dir(environ),
            cache_enabled=environ.get("GRAPHMEND_CACHE") is None
            or is_enabled(environ.get("GRAPHMEND_CACHE")),
            rewrites=_check_rewrites(_split(rewrites)) if rewrites is not None else ALL_REWRITES,
            debug=log == "debug",
        )

    def with_packages(self, packages: Iterable[str]) -> Config:
        """A copy claiming exactly ``packages``."""
        return replace(self, packages=tuple(packages))

    def with_more_packages(self, extra: Iterable[str]) -> Config:
        """A copy claiming ``extra`` as well."""
        return self.with_packages([*self.packages, *extra])

    def with_rewrites(self, rewrites: Iterable[str]) -> Config:
        """A copy running exactly ``rewrites`` (checked)."""
        return replace(self, rewrites=frozenset(rewrites))

    def settings_key(self) -> str:
        """The part of the cache key that depends on settings (not on the source)."""
        return "rewrites=" + ",".join(sorted(self.rewrites))
