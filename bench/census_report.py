"""Markdown summary and plot of a graph-break census (``bench/census.py``'s JSON).

    python bench/census_report.py bench/results/census-<version>/census.json

Rewrites ``census.md`` and ``breaks.png`` next to the JSON (the plot needs
matplotlib).  Each default-mode graph break that Dynamo logs is put in one
category by the first matching rule below, applied to its reason (first
line), Dynamo's debug context and the transformers source line it points at:

1. ``output`` (source-fixable, the defer rewrite): the reason or context
   names ``print``, a logger or logging call, or ``warnings.warn`` (Dynamo
   says ``qualname: warn``), or the source line is such a call statement.
2. ``branch`` (source-fixable, the predicate/trap rewrites): a host-value read
   (rule 3's text) or a data-dependent guard (rule 4's text) whose source line
   is an ``if``/``elif``/``assert`` statement: the value only decides a condition.
3. ``host value`` (out of scope): ``Tensor.item()``, ``.tolist()``, numpy
   conversion, a tensor read as a Python scalar (Dynamo's "Data dependent
   operator" ``aten._local_scalar_dense``): a value needed on the host.
4. ``dynamic shape`` (out of scope): dynamic/data-dependent output shapes
   (``nonzero``, boolean masks, unbacked symbols, guards on data-dependent
   expressions).
5. ``branch`` (source-fixable): data-dependent branching or assertion on a tensor.
6. ``other``: anything else (unsupported builtins or classes, skipped
   functions, ...), neither fixable by GraphMend's rewrites nor a host value.

A failing ``fullgraph=True`` compile is classified the same way from its error.
The census stores each category in the JSON; this report classifies again from
the stored text, so that refined rules apply when it is re-rendered.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

#: Category -> (scope, what it means).
CATEGORIES: dict[str, tuple[str, str]] = {
    "output": ("source-fixable", "print / logging / warnings call in traced code (defer)"),
    "branch": ("source-fixable", "data-dependent if / assert / raise guard (predicate, trap)"),
    "host value": ("out of scope", "value needed on the host: .item(), .tolist(), numpy"),
    "dynamic shape": ("out of scope", "data-dependent output shape: nonzero, boolean mask"),
    "other": ("other", "unsupported construct, skipped function, ..."),
}
ARMS = ("plain", "graphmend")
STATUS_WORDS = {
    "ok": "measured",
    "not_built": "not built",
    "not_run": "built but not run",
    "timeout": "timed out",
    "crashed": "crashed",
    "error": "failed",
}

_OUTPUT = re.compile(
    r"\bprint\b|\blogg(?:er|ing)\b|Logger|warning_once|info_once|warnings\.warn|qualname: warn\b",
    re.IGNORECASE,
)
_OUTPUT_LINE = re.compile(r"^(?:print|warnings\.warn|logging\.\w+|\w*logger\.\w+)\(")
_HOST_VALUE = re.compile(
    r"\.item\(\)|\bitem \(\)|tolist|numpy|__bool__|__int__|__float__"
    r"|_local_scalar_dense|Data dependent operator"
)
_DYNAMIC_SHAPE = re.compile(
    r"dynamic shape|dynamic-shape|data[- ]dependent (?:output )?shape|nonzero|unbacked"
    r"|GuardOnDataDependent|Could not guard on data-dependent|masked_select|boolean mask",
    re.IGNORECASE,
)
_BRANCH = re.compile(r"data-dependent (?:branching|assert)|generic_jump|_assert", re.IGNORECASE)
_CONDITION_LINE = re.compile(r"^(?:if|elif|assert)\b")


def classify(reason: str, detail: str | None, source: str | None) -> str:
    """The category of a break or fullgraph error (rules in the module docstring)."""
    text = f"{reason} {detail or ''}"
    if _OUTPUT.search(text) or (source and _OUTPUT_LINE.match(source)):
        return "output"
    guard = _HOST_VALUE.search(text) or _DYNAMIC_SHAPE.search(text)
    if guard and source and _CONDITION_LINE.match(source):
        return "branch"
    if _HOST_VALUE.search(text):
        return "host value"
    if _DYNAMIC_SHAPE.search(text):
        return "dynamic shape"
    if _BRANCH.search(text):
        return "branch"
    return "other"


# -- per-dtype summary -----------------------------------------------------------------------


def arm_run(model: dict[str, Any], arm: str, dtype: str) -> dict[str, Any] | None:
    """The arm's run of the model in ``dtype`` if the model ran eagerly there, else None."""
    result = model["arms"].get(arm) or {}
    run = result.get("runs", {}).get(dtype) if result.get("status") == "ok" else None
    return run if run is not None and "eager_error" not in run else None


def paired_runs(census: dict[str, Any], dtype: str) -> list[tuple[str, dict, dict]]:
    """(model type, plain run, GraphMend run) for models both arms ran in ``dtype``."""
    pairs = []
    for model in census["models"]:
        before, after = (arm_run(model, arm, dtype) for arm in ARMS)
        if before is not None and after is not None:
            pairs.append((model["model_type"], before, after))
    return pairs


def _identical(comparison: dict[str, Any] | None) -> bool:
    return bool(comparison and comparison.get("identical"))


def categories(run: dict[str, Any]) -> Counter[str]:
    """Breaks of a run by category; breaks Dynamo counted but did not log are "unitemized"."""
    counted = Counter(
        classify(record["reason"], record["detail"], record["source"])
        for record in run.get("break_records", [])
    )
    unitemized = (run.get("breaks") or 0) - sum(counted.values())
    if unitemized > 0:
        counted["unitemized"] = unitemized
    return counted


def summarize(census: dict[str, Any], dtype: str) -> dict[str, Any]:
    """The headline numbers for one dtype."""
    models = census["models"]
    pairs = paired_runs(census, dtype)
    counted = [
        (t, b, a)
        for t, b, a in pairs
        if b.get("breaks") is not None and a.get("breaks") is not None
    ]
    before = sum(b["breaks"] for _, b, _ in counted)
    after = sum(a["breaks"] for _, _, a in counted)
    compiled = {
        "plain": [b for _, b, _ in pairs if b["fullgraph"]["ok"]],
        "graphmend": [a for _, _, a in pairs if a["fullgraph"]["ok"]],
    }
    left: Counter[str] = Counter()
    found: Counter[str] = Counter()
    for _, b, a in counted:
        found += categories(b)
        left += categories(a)
    return {
        "model_types": len(models),
        "ran": sum(arm_run(m, "plain", dtype) is not None for m in models),
        "paired": len(pairs),
        "with_breaks": sum(b["breaks"] > 0 for _, b, _ in counted),
        "with_breaks_after": sum(a["breaks"] > 0 for _, _, a in counted),
        "breaks_before": before,
        "breaks_after": after,
        "fix_rate": (before - after) / before if before else None,
        "fixed_models": sum(b["breaks"] > 0 and a["breaks"] == 0 for _, b, a in counted),
        "more_breaks_after": [t for t, b, a in counted if a["breaks"] > b["breaks"]],
        "fullgraph_before": len(compiled["plain"]),
        "fullgraph_after": len(compiled["graphmend"]),
        "compiled_identical": {
            arm: sum(_identical(run["fullgraph"].get("same_as_eager")) for run in runs)
            for arm, runs in compiled.items()
        },
        "eager_identical": sum(_identical(a.get("eager_same_as_first_arm")) for _, _, a in pairs),
        "explain_failed": [
            t for t, b, a in pairs if b.get("breaks") is None or a.get("breaks") is None
        ],
        "found_by_category": dict(found),
        "left_by_category": dict(left),
    }


# -- markdown --------------------------------------------------------------------------------


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += [
        "| " + " | ".join(str(cell).replace("|", "\\|") for cell in row) + " |" for row in rows
    ]
    return [*lines, ""]


def _percent(numerator: int, denominator: int) -> str:
    return f"{numerator}/{denominator}" + (
        f" ({100 * numerator / denominator:.0f}%)" if denominator else ""
    )


def status_line(census: dict[str, Any]) -> str:
    """How many model types ended in each status (ok, not built, not run, timeout, ...)."""
    counted = Counter(model["status"] for model in census["models"])
    parts = [
        f"{count} {STATUS_WORDS.get(status, status)}" for status, count in counted.most_common()
    ]
    return f"{len(census['models'])} model types: " + ", ".join(parts) + "."


def summary_table(census: dict[str, Any]) -> list[str]:
    """The headline table: one column per dtype."""
    dtypes = census["meta"]["dtypes"]
    summaries = [summarize(census, dtype) for dtype in dtypes]
    rows: list[tuple[str, Any]] = [
        ("model types in the auto mappings", lambda s: s["model_types"]),
        ("built and ran eagerly", lambda s: s["ran"]),
        ("measured in both arms", lambda s: s["paired"]),
        (
            "models with graph breaks, without → with GraphMend",
            lambda s: f"{s['with_breaks']} → {s['with_breaks_after']}",
        ),
        (
            "graph breaks, without → with GraphMend",
            lambda s: f"{s['breaks_before']} → {s['breaks_after']}",
        ),
        (
            "fix rate (breaks removed)",
            lambda s: "n/a" if s["fix_rate"] is None else f"{100 * s['fix_rate']:.0f}%",
        ),
        ("models with every break fixed", lambda s: s["fixed_models"]),
        (
            "fullgraph=True compiles, without → with",
            lambda s: f"{s['fullgraph_before']} → {s['fullgraph_after']}",
        ),
        (
            "fullgraph output == eager (bitwise), without",
            lambda s: _percent(s["compiled_identical"]["plain"], s["fullgraph_before"]),
        ),
        (
            "fullgraph output == eager (bitwise), with",
            lambda s: _percent(s["compiled_identical"]["graphmend"], s["fullgraph_after"]),
        ),
        (
            "eager output with == without (bitwise)",
            lambda s: _percent(s["eager_identical"], s["paired"]),
        ),
        (
            "explain failed (breaks unknown, not summed)",
            lambda s: ", ".join(s["explain_failed"]) or "none",
        ),
        (
            "models with more breaks with GraphMend",
            lambda s: ", ".join(s["more_breaks_after"]) or "none",
        ),
    ]
    return _table(["", *dtypes], [[label, *(cell(s) for s in summaries)] for label, cell in rows])


def category_table(census: dict[str, Any]) -> list[str]:
    """Breaks by category, found (without GraphMend) and left (with it), per dtype."""
    dtypes = census["meta"]["dtypes"]
    summaries = [summarize(census, dtype) for dtype in dtypes]
    names = [*CATEGORIES, "unitemized"]
    rows = []
    for name in names:
        scope = CATEGORIES.get(
            name, ("counted, not logged", "breaks Dynamo counted without a log record")
        )[0]
        cells = [
            f"{s['found_by_category'].get(name, 0)} → {s['left_by_category'].get(name, 0)}"
            for s in summaries
        ]
        rows.append([name, scope, *cells])
    return _table(["category", "scope", *(f"{d}: found → left" for d in dtypes)], rows)


def _sites(run: dict[str, Any], limit: int = 3) -> str:
    """The run's break sites, most frequent first: "reason @ transformers line ×count"."""
    counted = Counter(
        f"{record['reason'][:60]} @ {record['location'] or '?'}"
        for record in run.get("break_records", [])
    )
    shown = [
        f"{site} ×{count}" if count > 1 else site for site, count in counted.most_common(limit)
    ]
    if len(counted) > limit:
        shown.append(f"+{len(counted) - limit} more")
    return "; ".join(shown)


def _fullgraph_cell(run: dict[str, Any]) -> str:
    fullgraph = run["fullgraph"]
    if fullgraph["ok"]:
        return "ok" if _identical(fullgraph.get("same_as_eager")) else "ok, output differs"
    category = classify(fullgraph.get("error", ""), None, fullgraph.get("source"))
    return f"fails ({category})"


def _fullgraph_error(run: dict[str, Any]) -> str:
    fullgraph = run["fullgraph"]
    if fullgraph["ok"]:
        return ""
    return f"fullgraph: {fullgraph.get('error', '')[:80]} @ {fullgraph.get('location') or '?'}"


def models_table(census: dict[str, Any], dtype: str) -> list[str]:
    """Models with a break or a failing fullgraph compile in either arm."""
    chosen = {
        m["model_type"]: m["arms"]["plain"].get("choice", {})
        for m in census["models"]
        if m["status"] == "ok"
    }
    rows = []
    for model_type, before, after in paired_runs(census, dtype):
        compiled = before["fullgraph"]["ok"] and after["fullgraph"]["ok"]
        if before.get("breaks") or after.get("breaks") or not compiled:
            rows.append(
                [
                    model_type,
                    chosen[model_type].get("class", "?"),
                    f"{before.get('breaks', '?')} → {after.get('breaks', '?')}",
                    f"{_fullgraph_cell(before)} → {_fullgraph_cell(after)}",
                    "yes" if _identical(after.get("eager_same_as_first_arm")) else "NO",
                    _sites(before) or _fullgraph_error(before),
                    _sites(after) or _fullgraph_error(after),
                ]
            )
    header = [
        "model type",
        "class",
        "breaks",
        "fullgraph=True",
        "eager same",
        "without GraphMend (reason @ transformers line)",
        "left with GraphMend",
    ]
    return _table(header, rows) if rows else ["None.", ""]


def sites_left(census: dict[str, Any]) -> list[str]:
    """Distinct break sites left with GraphMend, by category: where the remaining work is."""
    sites: dict[tuple[str, str, str], dict[str, Any]] = {}
    for dtype in census["meta"]["dtypes"]:
        for model_type, _, after in paired_runs(census, dtype):
            for record in after.get("break_records", []):
                category = classify(record["reason"], record["detail"], record["source"])
                key = (category, record["location"] or "?", record["reason"][:90])
                site = sites.setdefault(
                    key, {"models": set(), "dtypes": set(), "breaks": 0, "source": record["source"]}
                )
                site["models"].add(model_type)
                site["dtypes"].add(dtype)
                site["breaks"] += 1
    order = list(CATEGORIES)
    rows = [
        [
            category,
            f"`{location}`",
            f"`{(site['source'] or '')[:70]}`",
            reason,
            ", ".join(sorted(site["models"])[:6]) + (" ..." if len(site["models"]) > 6 else ""),
            ", ".join(sorted(site["dtypes"])),
            site["breaks"],
        ]
        for (category, location, reason), site in sorted(
            sites.items(),
            key=lambda item: (order.index(item[0][0]), -len(item[1]["models"]), item[0][1]),
        )
    ]
    header = ["category", "transformers line", "source", "reason", "models", "dtypes", "breaks"]
    return _table(header, rows) if rows else ["None.", ""]


def problems(census: dict[str, Any]) -> list[str]:
    """Things to investigate: GraphMend-arm failures, model modules GraphMend did not
    load, eager outputs that differ between the arms."""
    lines = []
    for model in census["models"]:
        if model["status"] != "ok":
            continue
        mended = model["arms"].get("graphmend", {})
        if mended.get("status") != "ok":
            detail = mended.get("error") or mended.get("log_tail", "")[-300:]
            lines.append(
                f"- `{model['model_type']}`: GraphMend arm {mended.get('status')}: {detail}"
            )
            continue
        if mended.get("loader") != "GraphMendLoader":
            lines.append(
                f"- `{model['model_type']}`: model module loaded by {mended.get('loader')}"
            )
        for dtype in census["meta"]["dtypes"]:
            before, after = arm_run(model, "plain", dtype), arm_run(model, "graphmend", dtype)
            if (before is None) != (after is None):
                lines.append(f"- `{model['model_type']}` {dtype}: eager runs in one arm only")
            elif after is not None and not _identical(after.get("eager_same_as_first_arm")):
                difference = after.get("eager_same_as_first_arm")
                lines.append(
                    f"- `{model['model_type']}` {dtype}: eager outputs differ: {difference}"
                )
    return [*(lines or ["None."]), ""]


def failure_reason(outcome: dict[str, Any]) -> str:
    """One line saying why a model type was not measured, from its first arm's outcome."""
    if outcome["status"] in ("not_built", "not_run") and outcome.get("attempts"):
        best = [a for a in outcome["attempts"] if a.get("stage") == "eager"] or outcome["attempts"]
        attempt = best[0]
        where = f" at {attempt['location']}" if attempt.get("location") else ""
        tried = attempt.get("class", attempt["level"])
        return f"{tried} ({attempt['stage']}): {attempt['error']}{where}"
    if "error" in outcome:
        return str(outcome["error"].get("error"))
    if outcome["status"] == "timeout":
        return f"timed out after {outcome['wall_seconds']} s"
    last_lines = outcome.get("log_tail", "").strip().splitlines()
    return f"{outcome['status']} (exit {outcome.get('exit')}): {' '.join(last_lines[-1:])}"


def not_measured(census: dict[str, Any]) -> list[str]:
    """Model types that could not be built or run generically, with the reason."""
    rows = [
        [m["model_type"], m["status"], failure_reason(m["arms"]["plain"])[:220]]
        for m in census["models"]
        if m["status"] != "ok"
    ]
    return (
        _table(["model type", "status", "reason (first attempt that got furthest)"], rows)
        if rows
        else ["None.", ""]
    )


def resumed_note(meta: dict[str, Any]) -> str:
    """' (resumed: ...)' when the run carried on from an earlier run's journal."""
    resumed = meta.get("resumed")
    if not resumed:
        return ""
    return (
        f" (resumed: {resumed} model types from the journal of an earlier run, "
        f"{meta['model_types'] - resumed} measured in this one)"
    )


def render_markdown(census: dict[str, Any]) -> str:
    """The whole report."""
    meta = census["meta"]
    lines = [
        f"# Graph-break census: transformers {meta['transformers']}",
        "",
        f"torch {meta['torch']}, Python {meta['python']}, GraphMend {meta['graphmend']} "
        f"(rewrites: {', '.join(meta['rewrites'])}); breaks counted with "
        f"`torch._dynamo.explain` (backend eager, default mode), `fullgraph=True` compiled with "
        f"backend {meta['fullgraph_backend']}; {meta['cpus']} CPUs, {meta['jobs']} jobs, "
        f"{meta.get('wall_seconds', '?')} s{resumed_note(meta)}; started {meta['started']}.",
        f"Command: `{meta['command']}`",
        "",
        "## Summary",
        "",
        status_line(census),
        "",
        *summary_table(census),
        "## Breaks by category (without → with GraphMend)",
        "",
        *category_table(census),
    ]
    for dtype in meta["dtypes"]:
        lines += [
            f"## Models with breaks or a failing fullgraph compile: {dtype}",
            "",
            *models_table(census, dtype),
        ]
    lines += ["## Break sites left with GraphMend", "", *sites_left(census)]
    lines += ["## GraphMend arm problems", "", *problems(census)]
    lines += ["## Not built or not run", "", *not_measured(census)]
    lines += [
        "## Category rules",
        "",
        *(f"- `{name}` ({scope}): {text}" for name, (scope, text) in CATEGORIES.items()),
    ]
    lines += ["", "Rules are applied in the order given in `bench/census_report.py`.", ""]
    return "\n".join(lines)


# -- plot ------------------------------------------------------------------------------------


def plot_breaks(census: dict[str, Any], path: Path) -> bool:
    """Bars of breaks before/after per model with breaks, one panel per dtype.

    Returns False (and plots nothing) where matplotlib is not installed.
    """
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    dtypes = census["meta"]["dtypes"]
    panels = []
    for dtype in dtypes:
        rows = [
            (t, b.get("breaks") or 0, a.get("breaks") or 0)
            for t, b, a in paired_runs(census, dtype)
            if (b.get("breaks") or 0) + (a.get("breaks") or 0) > 0
        ]
        panels.append((dtype, rows))
    height = max(2.5, 0.28 * max((len(rows) for _, rows in panels), default=1) + 1.2)
    figure, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), height), squeeze=False)
    for axis, (dtype, rows) in zip(axes[0], panels, strict=True):
        positions = range(len(rows))
        axis.barh(
            [p - 0.2 for p in positions],
            [r[1] for r in rows],
            0.4,
            label="without GraphMend",
            color="0.6",
        )
        axis.barh(
            [p + 0.2 for p in positions],
            [r[2] for r in rows],
            0.4,
            label="with GraphMend",
            color="tab:blue",
        )
        axis.set_yticks(list(positions), [r[0] for r in rows], fontsize=8)
        axis.invert_yaxis()
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.set_xlabel("graph breaks (default mode)")
        axis.set_title(f"{dtype}: models with breaks" if rows else f"{dtype}: no model breaks")
        axis.legend(loc="lower right", fontsize=8)
    figure.suptitle(f"Graph breaks per model, transformers {census['meta']['transformers']}")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return True


def write_report(census: dict[str, Any], folder: Path) -> list[Path]:
    """Write ``census.md`` and ``breaks.png`` into ``folder``; returns the files written."""
    written = [folder / "census.md"]
    written[0].write_text(render_markdown(census))
    if plot_breaks(census, folder / "breaks.png"):
        written.append(folder / "breaks.png")
    else:
        print("matplotlib is not installed: no breaks.png (rerun census_report.py where it is)")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("census", type=Path, help="census.json written by bench/census.py")
    options = parser.parse_args(argv)
    census = json.loads(options.census.read_text())
    written = write_report(census, options.census.parent)
    print(f"wrote {', '.join(map(str, written))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
