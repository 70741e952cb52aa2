"""``graphmend.report``: each graph break that remains, and GraphMend's decision at its line.

A call is traced with TorchDynamo (:mod:`graphmend.breaks`); for each break
that remains, the report says what GraphMend decided at that line:

* **not in scope**: the module is not claimed by the patterns;
* **not rewritten**: claimed, but loaded before the hook was installed;
* **left alone**: an opt-out (``# graphmend: skip-file``, ``do_not_rewrite``);
* **not a candidate**: no rewrite covers the statement (a condition on sizes or
  Python values, a call TorchDynamo cannot trace, ...);
* **declined**: a rewrite saw the site and refused it, for the reason given;
* **fell back while tracing**: rewritten, but a check made while tracing failed
  (:mod:`graphmend.runtime.fallbacks`: which check, with the values it saw);
* **rewritten**: rewritten and taken, yet TorchDynamo still broke there.

Each comes with what the user can do, where there is something.  With a
comparison run (``python -m graphmend report --compare``, without GraphMend, in a
fresh process) the report also lists the breaks GraphMend removed and the graph
counts before and after.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from types import ModuleType
from typing import Any

from graphmend.activation import current
from graphmend.breaks import Observation, ObservedBreak, observe
from graphmend.compiling import source_text
from graphmend.config import ALL_REWRITES as REWRITE_NAMES
from graphmend.config import Config, ConfigError
from graphmend.discovery import ModuleFile
from graphmend.explain import ModuleReport, TargetError, analyse
from graphmend.findings import Finding
from graphmend.patterns import ModuleMatcher
from graphmend.pipeline import ALL_REWRITES
from graphmend.runtime import fallbacks


class Verdict(str, Enum):
    """GraphMend's decision at the line of a remaining break."""

    NOT_IN_SCOPE = "not in scope"
    NOT_REWRITTEN = "not rewritten"
    LEFT_ALONE = "left alone"
    NOT_A_CANDIDATE = "not a candidate"
    DECLINED = "declined"
    FELL_BACK = "fell back while tracing"
    REWRITTEN = "rewritten"


#: Why a break of each category is not a candidate for any rewrite.
_NOT_CANDIDATES = {
    "branch": "the condition is not a tensor GraphMend can see in the source "
    "(a Python value, sizes, or a value a called function returns)",
    "dynamic shape": "the value depends on tensor data or dynamic sizes, outside any "
    "if condition or guard GraphMend rewrites",
    "host value": "a tensor value is read into Python outside an if condition or guard "
    "GraphMend rewrites",
    "output call": "GraphMend defers print, module-level loggers and warnings.warn only",
    "unsupported call": "GraphMend has no rewrite for a call TorchDynamo cannot trace",
    "other": "no GraphMend rewrite covers this statement",
}

_HINTS = {
    Verdict.NOT_IN_SCOPE: "claim the module: GRAPHMEND_PACKAGES='{module}' (or "
    "graphmend.install(['{module}'])); `python -m graphmend explain {target}` shows what "
    "GraphMend would do there",
    Verdict.NOT_REWRITTEN: "install GraphMend before the model code is imported "
    "(`python -m graphmend run`, GRAPHMEND=1, or graphmend.install() first)",
    Verdict.LEFT_ALONE: "remove the opt-out if the code may be rewritten",
    Verdict.FELL_BACK: "the check protects the result: GraphMend keeps the break rather "
    "than compute something else; making both branches give tensors of one shape and "
    "dtype (or a pure submodule) lets it merge them",
}

_INFERENCE_HINT = (
    "call the model under torch.no_grad() or torch.inference_mode(): GraphMend merges "
    "branches only where autograd does not record"
)

_CATEGORY_HINTS = {
    "dynamic shape": "torch._dynamo.config.capture_dynamic_output_shape_ops = True captures "
    "operators whose output shape depends on data; static shapes (dynamic=False) keep "
    "sizes Python ints",
    "host value": "torch._dynamo.config.capture_scalar_outputs = True keeps .item() in the "
    "graph (fullgraph=True often captures it already)",
    "output call": "move the call out of the compiled code, or log through a module-level "
    "logger GraphMend defers",
}


@dataclass(frozen=True)
class ExplainedBreak:
    """A remaining break and GraphMend's decision at its line."""

    observed: ObservedBreak
    source: str
    verdict: Verdict
    why: str
    hint: str = ""

    def to_json(self) -> dict[str, object]:
        """The break and the decision as plain JSON values."""
        return {
            **self.observed.to_json(),
            "source": self.source,
            "decision": self.verdict.value,
            "why": self.why,
            "hint": self.hint,
        }


@dataclass(frozen=True)
class Report:
    """What TorchDynamo made of a call through GraphMend, break by break."""

    graphs: int
    remaining: tuple[ExplainedBreak, ...]
    #: Graph count and breaks of the same call without GraphMend, when compared.
    plain: Observation | None = None
    removed: tuple[ObservedBreak, ...] = field(default=())

    def to_json(self) -> dict[str, object]:
        """The report as plain JSON values (``report --json``)."""
        data: dict[str, object] = {
            "graphs": self.graphs,
            "breaks": [entry.to_json() for entry in self.remaining],
        }
        if self.plain is not None:
            data["without_graphmend"] = self.plain.to_json()
            data["removed"] = [entry.to_json() for entry in self.removed]
        return data

    def __str__(self) -> str:
        return "\n".join(self._lines())

    def _lines(self) -> Iterator[str]:
        if self.plain is not None:
            yield (
                f"graphs: {self.plain.graphs} without GraphMend, {self.graphs} with it; "
                f"breaks removed: {len(self.removed)}"
            )
            for removed in self.removed:
                yield f"  removed: {removed.location()} ({removed.category}) {removed.reason}"
        else:
            yield f"graphs: {self.graphs}"
        if not self.remaining:
            yield "no graph break remains"
            return
        yield f"graph breaks remain at {len(self.remaining)} line(s):"
        for entry in self.remaining:
            where = entry.observed
            yield ""
            yield f"{where.location()} in {where.function}: {entry.source}"
            yield f"  break: {where.category}: {where.reason}"
            yield f"  graphmend: {entry.verdict.value}: {entry.why}"
            if entry.hint:
                yield f"  what you can do: {entry.hint}"


def report(model: Callable[..., Any], *args: Any, **kwargs: Any) -> Report:
    """Trace ``model(*args, **kwargs)`` with TorchDynamo and explain each remaining break.

    GraphMend must have been installed before the model's code was imported
    (``python -m graphmend report`` does that for a script).  Nothing is compiled
    for real; TorchDynamo's state is reset before and after.
    """
    fallbacks.clear()
    observation = observe(model, *args, **kwargs)
    return explain_observation(observation, fallbacks.records())


def explain_observation(
    observation: Observation,
    recorded: list[fallbacks.Fallback],
    plain: Observation | None = None,
) -> Report:
    """The report for breaks observed with GraphMend, the fallbacks recorded meanwhile
    and, if given, the same call observed without GraphMend."""
    decider = _Decider(recorded)
    remaining = tuple(decider.decide(entry) for entry in observation.breaks)
    removed: tuple[ObservedBreak, ...] = ()
    if plain is not None:
        left = {(entry.filename, entry.lineno) for entry in observation.breaks}
        removed = tuple(
            entry for entry in plain.breaks if (entry.filename, entry.lineno) not in left
        )
    return Report(observation.graphs, remaining, plain, removed)


class _Decider:
    """GraphMend's decision at a line, from the settings, the static findings of its
    file and the fallbacks recorded while tracing."""

    def __init__(self, recorded: list[fallbacks.Fallback]) -> None:
        self._fallbacks: dict[tuple[str, int], list[fallbacks.Fallback]] = {}
        for entry in recorded:
            self._fallbacks.setdefault((entry.filename, entry.lineno), []).append(entry)
        self._files: dict[str, _StaticFile | str] = {}
        self._modules = _modules_by_file()
        installation = current()
        self._config = installation.config if installation is not None else _configured()

    def decide(self, observed: ObservedBreak) -> ExplainedBreak:
        static = self._static(observed.filename)
        if isinstance(static, str):
            return ExplainedBreak(observed, "", Verdict.NOT_A_CANDIDATE, static)
        statement = static.statement_at(observed.lineno)
        source = static.line(statement)
        verdict, why, hint = self._verdict(observed, static, statement)
        if not hint:
            hint = _reason_hint(observed.reason) or _CATEGORY_HINTS.get(observed.category, "")
        return ExplainedBreak(observed, source, verdict, why, hint)

    def _verdict(
        self, observed: ObservedBreak, static: _StaticFile, statement: int
    ) -> tuple[Verdict, str, str]:
        module = self._modules.get(_real(observed.filename))
        name = module.__name__ if module is not None else static.name
        findings = static.findings_at(statement, observed.lineno)
        left_alone = static.left_alone(statement)
        if module is None or not self._claims(module):
            claimed = "not claimed by the patterns " + ", ".join(self._config.packages)
            rewritten = {f.rewrite for f in findings if f.rewritten}
            would = ", ".join(name for name in REWRITE_NAMES if name in rewritten)
            if would:
                claimed += f"; GraphMend would rewrite this site ({would})"
            hint = _HINTS[Verdict.NOT_IN_SCOPE].format(module=name, target=observed.filename)
            return Verdict.NOT_IN_SCOPE, f"module {name} is {claimed}", hint
        if left_alone is not None:
            return Verdict.LEFT_ALONE, left_alone.reason, _HINTS[Verdict.LEFT_ALONE]
        fell_back = self._fallbacks.get((observed.filename, statement)) or self._fallbacks.get(
            (observed.filename, observed.lineno)
        )
        if fell_back:
            why = "; ".join(f"{entry.rewrite}: {entry.reason}" for entry in fell_back)
            hint = _INFERENCE_HINT if "autograd records" in why else _HINTS[Verdict.FELL_BACK]
            return Verdict.FELL_BACK, why, hint
        rewritten = [f for f in findings if f.rewritten]
        if rewritten and not _is_rewritten(module):
            why = "claimed, but the module was imported before GraphMend was installed"
            return Verdict.NOT_REWRITTEN, why, _HINTS[Verdict.NOT_REWRITTEN]
        if rewritten:
            return Verdict.REWRITTEN, _still_breaks(rewritten[0], observed), ""
        declined = [f for f in findings if not f.rewritten]
        if declined:
            return Verdict.DECLINED, f"{declined[0].rewrite}: {declined[0].reason}", ""
        return Verdict.NOT_A_CANDIDATE, _NOT_CANDIDATES[observed.category], ""

    def _claims(self, module: ModuleType) -> bool:
        return _is_rewritten(module) or ModuleMatcher(self._config.packages).matches(
            module.__name__
        )

    def _static(self, filename: str) -> _StaticFile | str:
        if filename not in self._files:
            try:
                name = getattr(self._modules.get(_real(filename)), "__name__", filename)
                self._files[filename] = _StaticFile(
                    analyse(ModuleFile(name, Path(filename)), self._config.rewrites_to_run())
                )
            except TargetError as error:
                self._files[filename] = f"GraphMend cannot read it: {error}"
        return self._files[filename]


class _StaticFile:
    """A file's statements and the pipeline's findings on it, in memory."""

    def __init__(self, analysed: ModuleReport) -> None:
        self.name = analysed.name
        self._lines = source_text(analysed.source).split("\n")  # not at a form feed
        self._findings = analysed.findings()
        self._tree = ast.parse(analysed.source)

    def line(self, lineno: int) -> str:
        return self._lines[lineno - 1].strip() if 0 < lineno <= len(self._lines) else ""

    def statement_at(self, lineno: int) -> int:
        """The first line of the innermost statement spanning ``lineno``."""
        return _innermost(self._tree, lineno) or lineno

    def findings_at(self, statement: int, lineno: int) -> list[Finding]:
        return [
            finding
            for finding in self._findings
            if finding.lineno in (statement, lineno) and finding.rewrite != ALL_REWRITES
        ]

    def left_alone(self, statement: int) -> Finding | None:
        """The opt-out covering a line: of the module, or of a definition around it."""
        around = {node.lineno for node in _definitions_around(self._tree, statement)}
        for finding in self._findings:
            if finding.rewrite == ALL_REWRITES and (
                finding.lineno in around or finding.function == "<module>"
            ):
                return finding
        return None


def _innermost(tree: ast.Module, lineno: int) -> int | None:
    """The first line of the innermost non-definition statement spanning ``lineno``."""
    found: ast.stmt | None = None
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.stmt)
            and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and node.lineno <= lineno <= (node.end_lineno or node.lineno)
            and (found is None or node.lineno >= found.lineno)
        ):
            found = node
    return found.lineno if found is not None else None


def _definitions_around(tree: ast.Module, lineno: int) -> list[ast.stmt]:
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        and node.lineno <= lineno <= (node.end_lineno or node.lineno)
    ]


#: TorchDynamo settings that remove a break, by words of its reason.
_REASON_HINTS = (
    ("rnn, gru, or lstm", "torch._dynamo.config.allow_rnn = True lets TorchDynamo trace it"),
)


def _reason_hint(reason: str) -> str:
    text = reason.lower()
    return next((hint for words, hint in _REASON_HINTS if words in text), "")


def _still_breaks(finding: Finding, observed: ObservedBreak) -> str:
    if finding.rewrite == "defer":
        return (
            "the call is deferred, but TorchDynamo could not carry one of its arguments "
            f"out of the graph ({observed.reason})"
        )
    return f"the {finding.rewrite} site was taken, but TorchDynamo broke inside it"


def _is_rewritten(module: ModuleType | None) -> bool:
    return module is not None and "_@gm_rt" in vars(module)


def _modules_by_file() -> dict[str, ModuleType]:
    modules = {}
    for module in list(sys.modules.values()):
        filename = getattr(module, "__file__", None)
        if isinstance(filename, str):
            modules.setdefault(_real(filename), module)
    return modules


def _real(filename: str) -> str:
    return str(Path(filename).resolve())


def _configured() -> Config:
    try:
        return Config.from_env()
    except ConfigError:
        return Config()
