"""Settings: which modules are claimed, where the cache lives, which rewrites run.

Every setting has an environment variable, so that ``GRAPHMEND=1`` alone can
configure a process (a serving container, each ``torchrun`` rank):

``GRAPHMEND``             ``1``/``true``/``yes``/``on`` installs the hook at startup
``GRAPHMEND_PACKAGES``    comma-separated module patterns (``!`` excludes); replaces
                          the default scope, or applies exclusions alone to it
``GRAPHMEND_CACHE_DIR``   cache directory (default: the user cache directory); a
                          relative path is taken from the starting directory
``GRAPHMEND_CACHE``       ``0`` turns the bytecode cache off
``GRAPHMEND_REWRITES``    comma-separated rewrites to run (unset: all of them; empty:
                          none)
``GRAPHMEND_LOG``         ``debug`` writes one line per claimed module to stderr
``GRAPHMEND_CUDA_GUARDS`` ``sync``: lowered guards raise the original exception on
                          CUDA too (default ``async``: ``torch._assert_async``)

A value GraphMend cannot use is a :class:`ConfigError` naming the variable and
the value; at startup it means the hook is not installed, with one line on
stderr, never a failing interpreter.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from graphmend.patterns import EXCLUDE, ModuleMatcher, PatternError
from graphmend.torch_releases import runnable_rewrites

#: Where transformers keeps model code and the code it calls while a model runs,
#: plus ``transformers_modules.*``, the modules of ``trust_remote_code`` models.
DEFAULT_PACKAGES: tuple[str, ...] = (
    "transformers.models.*",
    "transformers.modeling_*",
    "transformers.masking_utils",
    "transformers.cache_utils",
    "transformers.configuration_utils",
    "transformers.integrations.*",
    "transformers.pytorch_utils",
    "transformers.activations",
    "transformers.loss.*",
    "transformers_modules.*",
)

#: The rewrites GraphMend knows, in the order the pipeline applies them.
ALL_REWRITES: tuple[str, ...] = ("from_python", "predicate", "trap", "defer", "continuation")
#: The rewrites run unless ``GRAPHMEND_REWRITES`` says otherwise: all of them.
DEFAULT_REWRITES: tuple[str, ...] = ALL_REWRITES

#: The values of a switch such as ``GRAPHMEND`` or ``GRAPHMEND_CACHE`` (any case).
ON_WORDS: tuple[str, ...] = ("1", "true", "yes", "on")
OFF_WORDS: tuple[str, ...] = ("", "0", "false", "no", "off")

#: What a lowered guard does on CUDA (``GRAPHMEND_CUDA_GUARDS``).
CUDA_GUARD_MODES: tuple[str, ...] = ("async", "sync")

_LOG_LEVELS = ("debug", "warning")


class ConfigError(ValueError):
    """A setting (argument or environment variable) with a value GraphMend cannot use."""


def default_cache_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """The per-user cache directory, following each platform's convention.

    A process with no home directory (``HOME`` unset and a user id the password
    database does not know, as in containers run with an arbitrary ``--user``)
    gets ``graphmend-<uid>`` in the temporary directory, as TorchInductor does;
    the cache's ownership checks apply there as anywhere.
    """
    try:
        if sys.platform == "win32":
            base = environ.get("LOCALAPPDATA") or str(Path.home() / "AppData" / "Local")
            return Path(base) / "graphmend" / "Cache"
        if sys.platform == "darwin":
            return Path.home() / "Library" / "Caches" / "graphmend"
        base = environ.get("XDG_CACHE_HOME", "")
        if not os.path.isabs(base):  # the XDG specification: a relative path is ignored
            base = str(Path.home() / ".cache")
    except (RuntimeError, KeyError):  # no home directory (KeyError: Python 3.10)
        user = os.geteuid() if hasattr(os, "geteuid") else "user"
        return Path(tempfile.gettempdir()) / f"graphmend-{user}"
    return Path(base) / "graphmend"


def parse_switch(value: str) -> bool:
    """``True`` for an on-word, ``False`` for an off-word; anything else is an error."""
    word = value.strip().lower()
    if word in ON_WORDS:
        return True
    if word in OFF_WORDS:
        return False
    raise ConfigError(
        f"use {'/'.join(ON_WORDS)} for on, {'/'.join(w for w in OFF_WORDS if w)} (or unset) for off"
    )


def hook_requested(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether ``GRAPHMEND`` asks for the hook; an unknown word is a :class:`ConfigError`."""
    value = environ.get("GRAPHMEND")
    if value is None:
        return False
    try:
        return parse_switch(value)
    except ConfigError as error:
        raise ConfigError(f"GRAPHMEND={value!r}: {error}") from None


def scope(patterns: Iterable[str]) -> tuple[str, ...]:
    """The patterns claimed: ``patterns``, or the default scope less them when they only exclude."""
    chosen = tuple(patterns)
    if all(pattern.strip().startswith(EXCLUDE) for pattern in chosen):
        return (*DEFAULT_PACKAGES, *chosen)
    return chosen


def cuda_guards(environ: Mapping[str, str] = os.environ) -> str:
    """``GRAPHMEND_CUDA_GUARDS``, checked: ``"async"`` (the default) or ``"sync"``."""
    return _read("GRAPHMEND_CUDA_GUARDS", environ) or CUDA_GUARD_MODES[0]


def debug_log(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether ``GRAPHMEND_LOG`` asks for debug lines (checked, as :func:`cuda_guards`)."""
    return bool(_read("GRAPHMEND_LOG", environ))


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


def _packages(value: str) -> tuple[str, ...]:
    patterns = _split(value)
    if not patterns:
        if value.strip():
            raise ConfigError("names no module pattern (unset it for the default scope)")
        return DEFAULT_PACKAGES
    try:
        ModuleMatcher(patterns)
    except PatternError as error:
        raise ConfigError(str(error)) from None
    return scope(patterns)


def _cache_dir(value: str) -> Path | None:
    if not value.strip():
        return None
    return absolute(expand_home(Path(value.strip())))


def absolute(path: Path) -> Path:
    """``path`` joined to the working directory; ConfigError when that cannot be read
    (it was deleted)."""
    try:
        return path.absolute()
    except OSError as error:
        raise ConfigError(
            f"a relative path needs the working directory, which cannot be read ({error.strerror})"
        ) from None


def expand_home(path: Path) -> Path:
    """``path`` with ``~`` or ``~user`` expanded; ConfigError when there is no such home."""
    try:
        return path.expanduser()
    except (RuntimeError, KeyError):  # KeyError: Python 3.10
        prefix = path.parts[0]  # '~' or '~user'
        whose = "this process" if prefix == "~" else f"the user {prefix[1:]!r}"
        raise ConfigError(f"{prefix!r} cannot be expanded: {whose} has no home directory") from None


def _log(value: str) -> bool:
    level = value.strip().lower() or "warning"
    if level not in _LOG_LEVELS:
        raise ConfigError(
            "use 'debug' (a line per claimed module) "
            "or 'warning' (the default: only modules that fell back)"
        )
    return level == "debug"


def _cuda_guards(value: str) -> str:
    mode = value.strip().lower() or CUDA_GUARD_MODES[0]
    if mode not in CUDA_GUARD_MODES:
        raise ConfigError(
            "use 'sync' (the original exception, a host synchronisation per guard) or "
            "'async' (the default: torch._assert_async)"
        )
    return mode


@dataclass(frozen=True)
class _Variable:
    name: str
    field: str
    parse: Callable[[str], Any]


_VARIABLES: tuple[_Variable, ...] = (
    _Variable("GRAPHMEND_PACKAGES", "packages", _packages),
    _Variable("GRAPHMEND_CACHE_DIR", "cache_dir", _cache_dir),
    _Variable("GRAPHMEND_CACHE", "cache_enabled", parse_switch),
    _Variable("GRAPHMEND_REWRITES", "rewrites", lambda value: _check_rewrites(_split(value))),
    _Variable("GRAPHMEND_LOG", "debug", _log),
    _Variable("GRAPHMEND_CUDA_GUARDS", "cuda_guards", _cuda_guards),
)


def _read(name: str, environ: Mapping[str, str]) -> Any:
    """The parsed value of one variable; ``None`` when unset (the default applies)."""
    variable = next(v for v in _VARIABLES if v.name == name)
    value = environ.get(name)
    if value is None:
        return None
    try:
        return variable.parse(value)
    except ConfigError as error:
        raise ConfigError(f"{name}={value!r}: {error}") from None


@dataclass(frozen=True)
class Setting:
    """One ``GRAPHMEND_*`` variable as a process sees it (what ``check`` reports)."""

    variable: str
    field: str
    #: The variable's value, ``None`` when unset.
    raw: str | None
    #: Why the value cannot be used, naming the variable and the value; ``None`` if it can.
    error: str | None


def read_settings(environ: Mapping[str, str] = os.environ) -> list[Setting]:
    """Every ``GRAPHMEND_*`` setting variable, with its value and any error."""
    settings = []
    for variable in _VARIABLES:
        try:
            _read(variable.name, environ)
            error = None
        except ConfigError as problem:
            error = str(problem)
        settings.append(Setting(variable.name, variable.field, environ.get(variable.name), error))
    return settings


@dataclass(frozen=True)
class Config:
    """Everything that decides what GraphMend does in one process."""

    packages: tuple[str, ...] = DEFAULT_PACKAGES
    cache_dir: Path = field(default_factory=default_cache_dir)
    cache_enabled: bool = True
    rewrites: frozenset[str] = frozenset(DEFAULT_REWRITES)
    debug: bool = False
    cuda_guards: str = CUDA_GUARD_MODES[0]

    def __post_init__(self) -> None:
        # Fixed now: the process may change its working directory, its children start
        # in others, and the cache must stay where it was named.
        try:
            object.__setattr__(self, "cache_dir", absolute(Path(self.cache_dir)))
        except ConfigError as error:
            raise ConfigError(f"cache_dir={str(self.cache_dir)!r}: {error}") from None
        if "\0" in str(self.cache_dir):
            raise ConfigError(f"cache_dir={str(self.cache_dir)!r}: a path cannot hold a NUL")
        try:
            os.fsencode(self.cache_dir)
        except UnicodeEncodeError:
            raise ConfigError(
                f"cache_dir={str(self.cache_dir)!r}: the file system's encoding "
                f"({sys.getfilesystemencoding()}) cannot name it"
            ) from None
        object.__setattr__(self, "rewrites", _check_rewrites(self.rewrites))
        object.__setattr__(self, "packages", scope(self.packages))
        if self.cuda_guards not in CUDA_GUARD_MODES:
            raise ConfigError(f"cuda_guards={self.cuda_guards!r}: use 'async' or 'sync'")
        try:  # now rather than at the first import
            ModuleMatcher(self.packages)
        except PatternError as error:
            raise ConfigError(f"packages={list(self.packages)!r}: {error}") from None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Config:
        """Read the ``GRAPHMEND_*`` environment variables; a bad one is a :class:`ConfigError`."""
        values = {variable.field: _read(variable.name, environ) for variable in _VARIABLES}
        chosen = {name: value for name, value in values.items() if value is not None}
        if "cache_dir" not in chosen:  # looked up only when needed: it may find no home
            chosen["cache_dir"] = default_cache_dir(environ)
        return cls(**chosen)

    def environment(self) -> dict[str, str]:
        """Environment variables that make a child process install the hook with these settings."""
        return {
            "GRAPHMEND": "1",
            "GRAPHMEND_PACKAGES": ",".join(self.packages),
            "GRAPHMEND_CACHE_DIR": str(self.cache_dir),
            "GRAPHMEND_CACHE": "1" if self.cache_enabled else "0",
            "GRAPHMEND_REWRITES": ",".join(r for r in ALL_REWRITES if r in self.rewrites),
            "GRAPHMEND_LOG": "debug" if self.debug else "warning",
            "GRAPHMEND_CUDA_GUARDS": self.cuda_guards,
        }

    def with_packages(self, packages: Iterable[str]) -> Config:
        """A copy claiming exactly ``packages`` (exclusions alone apply to the default scope)."""
        return replace(self, packages=tuple(packages))

    def with_more_packages(self, extra: Iterable[str]) -> Config:
        """A copy claiming ``extra`` as well (an exclusion in ``extra`` narrows the scope)."""
        return self.with_packages([*self.packages, *extra])

    def with_rewrites(self, rewrites: Iterable[str]) -> Config:
        """A copy running exactly ``rewrites`` (checked)."""
        return replace(self, rewrites=frozenset(rewrites))

    def rewrites_to_run(self) -> frozenset[str]:
        """:attr:`rewrites` less what the installed torch cannot run (deferred output
        outside the releases tested: :func:`graphmend.torch_releases.runnable_rewrites`)."""
        return runnable_rewrites(self.rewrites)

    def settings_key(self) -> str:
        """The part of the cache key that depends on settings (not on the source)."""
        return "rewrites=" + ",".join(sorted(self.rewrites_to_run()))
