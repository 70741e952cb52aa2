"""``python -m graphmend explain``: every candidate site of some modules and what was decided.

A target is a dotted module name, a glob over module names or a path to a
``.py`` file.  Targets are resolved to source files the way the import system
would find them (``importlib.machinery.PathFinder``), but nothing is imported
or executed: not the module, not its parent packages.  Each file then goes
through the same pipeline as the import hook, in memory.

Exit status: 0 when every target was explained, 1 when some target could not
be (no such module, unreadable file, syntax error; the others are still
reported), 2 for a usage error such as an unknown rewrite.
"""

from __future__ import annotations

import importlib.machinery
import json
import os
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from graphmend.compiling import parse_tree
from graphmend.config import Config
from graphmend.discovery import DiscoveryError, ModuleFile, discover
from graphmend.findings import Finding, describe_summary, summarize
from graphmend.notices import write_stderr
from graphmend.patterns import ModuleMatcher, PatternError, is_glob
from graphmend.pipeline import Rewritten, rewrite


class TargetError(Exception):
    """A target that cannot be explained; the message says why."""


@dataclass(frozen=True)
class ModuleReport:
    """One module rewritten in memory: its source and what the pipeline made of it."""

    name: str
    path: Path
    source: bytes
    result: Rewritten

    @property
    def label(self) -> str:
        """The module name, followed by its file when the target named a module."""
        return self.name if self.name == str(self.path) else f"{self.name} ({self.path})"

    def findings(self) -> list[Finding]:
        """The findings in source order."""
        return sorted(self.result.findings, key=lambda f: (f.lineno, f.col, f.rewrite))


def chosen_rewrites(option: str | None) -> frozenset[str]:
    """The rewrites named by ``--rewrites a,b``, or the configured ones that the installed
    torch runs (:meth:`Config.rewrites_to_run`); checked."""
    config = Config.from_env()
    if option is None:
        return config.rewrites_to_run()
    names = (part.strip() for part in option.split(",") if part.strip())
    return config.with_rewrites(names).rewrites


def resolve(target: str) -> list[ModuleFile]:
    """The source files a target names, found without importing anything.

    A target naming an existing file, ending in ``.py`` or holding a path
    separator is a path; one with glob characters is a glob over dotted
    names; anything else is a module name, and a package name stands for the
    package and every module below it (as in ``GRAPHMEND_PACKAGES``).
    """
    path = Path(target)
    if path.is_file() or target.endswith(".py") or "/" in target or "\\" in target:
        return [ModuleFile(str(path), path)]
    try:
        matcher = ModuleMatcher([target])  # refuses a reserved module (torch, the stdlib)
        if is_glob(target):
            modules = discover(matcher)
            if not modules:
                raise TargetError(f"no modules on sys.path match {target!r}")
            return modules
        spec = _find_spec(target)
        if spec.submodule_search_locations is not None:
            modules = discover(matcher)
            if not modules:  # a directory without modules, taken as a namespace package
                raise TargetError(f"no Python modules in package {target!r}")
            return modules
    except (PatternError, DiscoveryError) as error:
        raise TargetError(str(error)) from None
    if not spec.origin or not spec.origin.endswith(".py"):
        raise TargetError(f"module {target!r} has no Python source ({spec.origin})")
    return [ModuleFile(target, Path(spec.origin))]


def _find_spec(name: str) -> importlib.machinery.ModuleSpec:
    """The spec of ``name``, looking up each parent package on disk, never importing it."""
    search: list[str] | None = None
    parts = name.split(".")
    for index in range(1, len(parts) + 1):
        current = ".".join(parts[:index])
        try:
            spec = importlib.machinery.PathFinder.find_spec(current, search)
        except KeyError:  # a namespace package in a package: its path reads the parent's
            spec = importlib.machinery.ModuleSpec(current, None, is_package=True)
            directories = (os.path.join(entry, parts[index - 1]) for entry in search or ())
            spec.submodule_search_locations = [d for d in directories if os.path.isdir(d)]
        if spec is None:
            raise TargetError(f"no module named {current!r} on sys.path")
        if index < len(parts):
            if spec.submodule_search_locations is None:
                raise TargetError(f"no module named {name!r}: {current!r} is not a package")
            search = list(spec.submodule_search_locations)
    assert spec is not None
    return spec


def analyse(module: ModuleFile, rewrites: Collection[str]) -> ModuleReport:
    """Read one module's source and run the pipeline on it, in memory."""
    try:
        source = module.path.read_bytes()
    except OSError as error:
        raise TargetError(f"cannot read {module.path}: {error.strerror or error}") from None
    try:
        tree = parse_tree(source, str(module.path))
    except SyntaxError as error:
        where = f"{module.path}:{error.lineno or 0}:{error.offset or 0}"
        raise TargetError(f"{where}: syntax error: {error.msg}") from None
    try:
        result = rewrite(source, str(module.path), rewrites, tree=tree)
    except Exception as error:
        raise TargetError(
            f"{module.path}: GraphMend failed to rewrite it ({type(error).__name__}: {error}); "
            "the import hook would load it unchanged"
        ) from None
    return ModuleReport(module.name, module.path, source, result)


class Batch:
    """The modules of some targets, rewritten one at a time; failures go to stderr."""

    def __init__(self, rewrites: Collection[str]) -> None:
        self.rewrites = rewrites
        self.failures = 0

    def reports(self, targets: Iterable[str]) -> Iterator[ModuleReport]:
        """A report per module, each file once, in target order; ``!PATTERN`` targets exclude."""
        targets = list(targets)
        excluded = ModuleMatcher(target for target in targets if target.startswith("!"))
        seen: set[Path] = set()
        for target in targets:
            if target.startswith("!"):
                continue
            try:
                modules = resolve(target)
            except TargetError as error:
                self._fail(error)
                continue
            for module in modules:
                real = module.path.resolve()
                if real in seen or excluded.excludes(module.name):
                    continue
                seen.add(real)
                try:
                    yield analyse(module, self.rewrites)
                except TargetError as error:
                    self._fail(error)

    @property
    def status(self) -> int:
        """The exit status: 1 when some target could not be read or rewritten."""
        return 1 if self.failures else 0

    def _fail(self, error: TargetError) -> None:
        self.failures += 1
        write_stderr(f"graphmend: error: {error}\n", flush=True)


def explain(
    targets: Iterable[str],
    rewrites: Collection[str],
    *,
    as_json: bool = False,
    declined_only: bool = False,
) -> int:
    """Print every candidate site of the targets' modules; returns the exit status."""
    batch = Batch(rewrites)
    if as_json:
        records = [
            {"module": report.name, **finding.to_json()}
            for report in batch.reports(targets)
            for finding in report.findings()
            if not (declined_only and finding.rewritten)
        ]
        print(json.dumps(records, indent=2))
        return batch.status
    modules = rewritten = declined = 0
    for report in batch.reports(targets):
        findings = report.findings()
        modules += 1
        rewritten += sum(finding.rewritten for finding in findings)
        declined += sum(not finding.rewritten for finding in findings)
        shown = [f for f in findings if not (declined_only and f.rewritten)]
        print(module_line(report.label, findings))
        for finding in shown:
            print(f"  {site_line(finding)}")
        if shown:
            print()
    print(_total_line(modules, rewritten, declined, batch.failures))
    return batch.status


def module_line(label: str, findings: list[Finding]) -> str:
    """``name (path): 3 candidate sites: defer 2 rewritten, 1 declined``."""
    if not findings:
        return f"{label}: no candidate sites"
    summary = describe_summary(summarize(findings))
    return f"{label}: {_count(len(findings), 'candidate site')}: {summary}"


def site_line(finding: Finding) -> str:
    """``path:line:col: in Qual.name: defer declined: <reason>``."""
    function = finding.function or "<module>"
    return (
        f"{finding.location()}: in {function}: {finding.rewrite} {finding.decision.value}: "
        f"{finding.reason}"
    )


def _total_line(modules: int, rewritten: int, declined: int, failures: int) -> str:
    line = (
        f"total: {_count(modules, 'module')}, {_count(rewritten + declined, 'candidate site')}"
        f" ({rewritten} rewritten, {declined} declined)"
    )
    if failures:
        line += f"; {_count(failures, 'target')} could not be explained (errors on stderr)"
    return line


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"
