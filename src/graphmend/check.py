"""``python -m graphmend check``: is GraphMend set up to work here?  For container health checks.

It reports the effective settings and where each came from, whether the hook
is active in this environment (``GRAPHMEND``, ``graphmend_hook.pth``, this
process), the cache directory and whether it can be used, and torch; the exit
status is 1 when any of them is a problem, 0 otherwise.
"""

from __future__ import annotations

import importlib.metadata
import operator
import os
import re
import site
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from graphmend import __version__
from graphmend.activation import current
from graphmend.cache import Access, BytecodeCache
from graphmend.config import ALL_REWRITES, Config, ConfigError, hook_requested, read_settings

STARTUP_FILE = "graphmend_hook.pth"


@dataclass(frozen=True)
class Line:
    """One reported fact; ``problem`` marks the ones that make the check fail."""

    label: str
    text: str
    problem: bool = False


def check(environ: Mapping[str, str] = os.environ) -> int:
    """Print the report; returns 1 when something is a problem, else 0."""
    settings, config = settings_lines(environ)
    sections = {
        "settings": settings,
        "hook": hook_lines(environ),
        "cache": cache_lines(config),
        "torch": torch_lines(),
    }
    print(f"graphmend {__version__}, Python {sys.version.split()[0]} ({sys.executable})")
    width = max(len(line.label) for lines in sections.values() for line in lines)
    for title, lines in sections.items():
        print(f"{title}:")
        for line in lines:
            mark = "PROBLEM: " if line.problem else ""
            print(f"  {line.label:<{width}}  {mark}{line.text}")
    problems = sum(line.problem for lines in sections.values() for line in lines)
    print("status: ok" if not problems else f"status: {problems} problem(s)")
    return 1 if problems else 0


def settings_lines(environ: Mapping[str, str]) -> tuple[list[Line], Config]:
    """Each ``GRAPHMEND_*`` setting's effective value and its source, and the configuration.

    A variable with a bad value is a problem; the configuration then has its
    default, as the other settings are still worth showing.
    """
    settings = read_settings(environ)
    bad = {setting.variable for setting in settings if setting.error}
    config = Config.from_env({k: v for k, v in environ.items() if k not in bad})
    lines = []
    for setting in settings:
        if setting.error:
            lines.append(Line(setting.variable, setting.error, problem=True))
            continue
        source = "default" if setting.raw is None else "environment"
        shown = _show(setting.field, getattr(config, setting.field))
        lines.append(Line(setting.variable, f"{shown} ({source})"))
    return lines, config


def _show(field: str, value: object) -> str:
    if field == "debug":
        return "debug" if value else "warning"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, frozenset):
        return ", ".join(name for name in ALL_REWRITES if name in value) or "none"
    if isinstance(value, tuple):
        return ", ".join(value)
    return str(value)


def hook_lines(environ: Mapping[str, str]) -> list[Line]:
    """``GRAPHMEND``, the startup file, and whether this process has the hook."""
    try:
        requested = hook_requested(environ)
        value = environ.get("GRAPHMEND")
        shown = "unset" if value is None else repr(value)
        switch = Line("GRAPHMEND", f"{'on' if requested else 'off'} ({shown})")
    except ConfigError as error:
        requested = False
        switch = Line("GRAPHMEND", str(error), problem=True)
    startup = startup_file()
    if startup is not None:
        found = Line(STARTUP_FILE, str(startup))
    else:
        where = ", ".join(site_directories()) or "none (python -S?)"
        found = Line(
            STARTUP_FILE,
            f"not in a site-packages directory of this interpreter ({where}); "
            "GRAPHMEND=1 cannot install the hook",
            problem=requested,
        )
    installed = current() is not None
    process = Line("this process", "hook installed" if installed else "hook not installed")
    if requested and startup is not None and not installed:
        process = Line(
            "this process",
            "hook not installed although GRAPHMEND is on (see the settings above, "
            "or python -S / -I)",
            problem=True,
        )
    return [switch, found, process]


def site_directories() -> list[str]:
    """The directories whose ``.pth`` files this interpreter runs at startup."""
    directories = list(site.getsitepackages()) if hasattr(site, "getsitepackages") else []
    if site.ENABLE_USER_SITE:
        directories.append(site.getusersitepackages())
    return directories


def startup_file() -> Path | None:
    """``graphmend_hook.pth`` in a site-packages directory of this interpreter, if any."""
    for directory in site_directories():
        candidate = Path(directory) / STARTUP_FILE
        if candidate.is_file():
            return candidate
    return None


def cache_lines(config: Config) -> list[Line]:
    """The cache directory and whether it can be used."""
    if not config.cache_enabled:
        return [Line("directory", f"{config.cache_dir} (not used: GRAPHMEND_CACHE is off)")]
    verdict = BytecodeCache(config.cache_dir).check()
    if verdict.access is Access.UNUSABLE:
        return [Line("directory", verdict.reason, problem=True)]
    if verdict.access is Access.READ_ONLY:
        return [Line("directory", f"{config.cache_dir}: read-only: {verdict.reason}")]
    return [Line("directory", f"{config.cache_dir}: read-write")]


def torch_lines() -> list[Line]:
    """torch's version, and whether GraphMend's requirement allows it."""
    try:
        import torch
    except Exception as error:
        return [Line("version", f"torch cannot be imported: {error}", problem=True)]
    version = torch.__version__
    required = _torch_requirement()
    if required is None:
        return [Line("version", f"{version} (graphmend is not installed: no requirement known)")]
    if not satisfies(version, required):
        return [Line("version", f"{version}, but graphmend requires torch{required}", problem=True)]
    return [Line("version", f"{version} (requirement: torch{required})")]


def _torch_requirement() -> str | None:
    try:
        requirements = importlib.metadata.requires("graphmend") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for requirement in requirements:
        found = re.fullmatch(r"torch\s*([<>=!~][^;]*)", requirement.strip())
        if found:
            return found.group(1).replace(" ", "")
    return None


def _release(version: str) -> tuple[int, ...]:
    """``2.13.0+cpu`` -> ``(2, 13, 0)``; pre-releases count as their release."""
    return tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0])[:3])


_COMPARISONS: dict[str, Callable[[tuple[int, ...], tuple[int, ...]], bool]] = {
    "==": operator.eq,
    "!=": operator.ne,
    "<=": operator.le,
    ">=": operator.ge,
    "<": operator.lt,
    ">": operator.gt,
}


def satisfies(version: str, specifier: str) -> bool:
    """Whether ``version`` meets a specifier such as ``>=2.5,<3`` (other clauses are ignored)."""
    have = _release(version)
    for clause in specifier.split(","):
        found = re.fullmatch(r"(==|!=|<=|>=|<|>)([\d.]+)", clause.strip())
        if found is None:
            continue
        want = _release(found.group(2))
        width = max(len(have), len(want))
        padded = have + (0,) * (width - len(have)), want + (0,) * (width - len(want))
        if not _COMPARISONS[found.group(1)](*padded):
            return False
    return True
