"""``python -m graphmend diff``: what the rewrites change, function by function.

Both sides are printed with ``ast.unparse`` (the original from a fresh parse),
so only the rewrites show, not formatting; the generated names read as Python
(``graphmend_cond1``, ``graphmend.runtime.branch(...)``: see :mod:`graphmend.display`).
A diff covers each function holding a rewritten site, plus one hunk for the
module-level code GraphMend injects after the module's torch import (the
runtime import and the generated helper functions).  The two statements it
puts first in every rewritten module (the tracing check bound to ``bool``
until the runtime is imported, and a ``__dir__`` hiding the injected names)
are the same everywhere and touch no function of the module: the text output
names them in one line instead of showing them.
"""

from __future__ import annotations

import ast
import difflib
import json
from collections.abc import Collection, Iterable, Iterator
from dataclasses import asdict, dataclass

from graphmend.display import Display
from graphmend.explain import Batch, ModuleReport
from graphmend.pipeline import parse
from graphmend.rewrites.common import RUNTIME, is_generated

MODULE_LEVEL = "<module>"
#: The line the text output prints, once per rewritten module, for what it leaves out.
TOP_NOTE = (
    "# {label}: GraphMend also puts first in the module a __dir__ that hides its names"
    " and a tracing check that is False until the runtime import (not shown)"
)

_Definition = ast.FunctionDef | ast.AsyncFunctionDef


@dataclass(frozen=True)
class FunctionDiff:
    """One changed function (or the injected module-level code) before and after."""

    module: str
    file: str
    function: str
    lineno: int
    original: str
    rewritten: str

    def unified(self, context: int) -> list[str]:
        """The unified diff, its headers naming the file, the function and its line."""
        where = (
            f"module level, after line {self.lineno}"
            if self.function == MODULE_LEVEL
            else f"{self.function}, line {self.lineno}"
        )
        return list(
            difflib.unified_diff(
                self.original.splitlines(),
                self.rewritten.splitlines(),
                fromfile=self.file,
                tofile=self.file,
                fromfiledate=f"{where} (original)",
                tofiledate=f"{where} (rewritten)",
                n=context,
                lineterm="",
            )
        )


def module_diffs(report: ModuleReport) -> list[FunctionDiff]:
    """The injected code, then each function with a rewritten site, in source order."""
    if not report.result.changed:
        return []
    original = parse(report.source, str(report.path))
    display = Display(original)
    rewritten_defs = _definitions(report.result.tree)
    diffs = [_injected(report, display)]
    for key, node in _changed_functions(report, original):
        diffs.append(
            FunctionDiff(
                report.name,
                str(report.path),
                key[0],
                key[1],
                ast.unparse(node),
                display.render([rewritten_defs[key]]),
            )
        )
    return diffs


def _definitions(tree: ast.Module) -> dict[tuple[str, int], _Definition]:
    """Every function of ``tree`` by (qualified name, line of its ``def``)."""
    found: dict[tuple[str, int], _Definition] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, _Definition):
                found[(prefix + child.name, child.lineno)] = child
                visit(child, f"{prefix}{child.name}.<locals>.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.stmt | ast.excepthandler | ast.match_case):
                visit(child, prefix)

    visit(tree, "")
    return found


def _changed_functions(
    report: ModuleReport, original: ast.Module
) -> Iterator[tuple[tuple[str, int], _Definition]]:
    """The innermost function around each rewritten site, outermost shown once."""
    definitions = _definitions(original)
    chosen: dict[tuple[str, int], _Definition] = {}
    for finding in report.result.findings:
        if not finding.rewritten:
            continue
        for key, node in definitions.items():
            if key[0] == finding.function and _spans(node, finding.lineno):
                chosen[key] = node
    for key, node in sorted(chosen.items(), key=lambda item: item[0][1]):
        if not any(other is not node and _contains(other, node) for other in chosen.values()):
            yield key, node


def _spans(node: ast.stmt, lineno: int) -> bool:
    return node.lineno <= lineno <= (node.end_lineno or node.lineno)


def _contains(outer: ast.stmt, inner: ast.stmt) -> bool:
    return _spans(outer, inner.lineno) and _spans(outer, inner.end_lineno or inner.lineno)


def _injected(report: ModuleReport, display: Display) -> FunctionDiff:
    """The code GraphMend adds after the module's torch import: the runtime and the
    generated functions (in a module that never imports torch, the function binding
    them once torch is imported, and its scheduling, after the docstring)."""
    block, index = _runtime_import(report.result.tree)
    anchor = _original_before(block, index)
    anchor_text = "" if anchor is None else ast.unparse(anchor)
    injected = display.render(_generated_run(block, index))
    return FunctionDiff(
        report.name,
        str(report.path),
        MODULE_LEVEL,
        0 if anchor is None else anchor.lineno,
        anchor_text,
        "\n".join([anchor_text, injected] if anchor_text else [injected]),
    )


def _original_before(block: list[ast.stmt], index: int) -> ast.stmt | None:
    """The last statement of the module's own before ``block[index]``, if any."""
    for statement in reversed(block[:index]):
        if not is_generated(statement):
            return statement
    return None


def _generated_run(block: list[ast.stmt], start: int) -> list[ast.stmt]:
    """The generated statements of ``block`` from ``start`` on, up to the next original one."""
    run = []
    for statement in block[start:]:
        if not is_generated(statement):
            break
        run.append(statement)
    return run


def _runtime_import(tree: ast.Module) -> tuple[list[ast.stmt], int]:
    """The block holding ``import graphmend.runtime as _@gm_rt``, and its index there;
    in a module that never imports torch, the module's body and the index of the
    generated function holding that import."""
    blocks = [tree.body] + [
        block
        for statement in tree.body
        if isinstance(statement, ast.If | ast.Try)
        for block in (statement.body, statement.orelse)
    ]
    for block in blocks:
        for index, statement in enumerate(block):
            if _imports_runtime(statement):
                return block, index
    for index, statement in enumerate(tree.body):
        if (
            isinstance(statement, _Definition)
            and is_generated(statement)
            and any(_imports_runtime(inner) for inner in statement.body)
        ):
            return tree.body, index
    raise ValueError("no runtime import in a rewritten module")


def _imports_runtime(statement: ast.stmt) -> bool:
    return isinstance(statement, ast.Import) and any(
        alias.asname == RUNTIME for alias in statement.names
    )


def diff(
    targets: Iterable[str], rewrites: Collection[str], *, as_json: bool = False, context: int = 3
) -> int:
    """Print the rewritten functions of the targets' modules as diffs; returns the exit status."""
    batch = Batch(rewrites)
    if as_json:
        records = [asdict(d) for report in batch.reports(targets) for d in module_diffs(report)]
        print(json.dumps(records, indent=2))
        return batch.status
    for report in batch.reports(targets):
        diffs = module_diffs(report)
        if not diffs:
            declined = len(report.result.findings)
            note = f" ({declined} declined; see 'explain')" if declined else ""
            print(f"{report.label}: no rewritten sites{note}")
            continue
        print(TOP_NOTE.format(label=report.label))
        for function_diff in diffs:
            print("\n".join(function_diff.unified(context)))
    return batch.status
