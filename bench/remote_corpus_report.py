"""Markdown summary of ``bench/remote_corpus.py``'s JSON (graph breaks of real remote code).

    python bench/remote_corpus_report.py bench/results/remote-corpus-<version>/remote-corpus.json

Rewrites ``remote-corpus.md`` next to the JSON.  Breaks are put in the
categories of ``census_report`` (its module docstring gives the rules).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from census_report import _table, categories, classify

ARMS = ("plain", "graphmend")
TOP_SITES = 12
#: A file path of this machine in an error message: " (/...)", or quoted: "'/.../name'".
_LOCAL_PATH = re.compile(r" \(/[^)]*\)|'/[^']*/([^'/]*)'")


def arm_run(family: dict[str, Any], arm: str, dtype: str) -> dict[str, Any] | None:
    """The arm's run in ``dtype`` if the family built and ran eagerly there, else None."""
    result = family["arms"].get(arm) or {}
    run = result.get("runs", {}).get(dtype) if result.get("status") == "ok" else None
    return run if run is not None and "eager_error" not in run else None


def _count(run: dict[str, Any] | None, category: str | None = None) -> int | None:
    if run is None or run.get("breaks") is None:
        return None
    return run["breaks"] if category is None else categories(run).get(category, 0)


def _arrow(before: int | None, after: int | None) -> str:
    return "n/a" if before is None else f"{before} → {'n/a' if after is None else after}"


def _fullgraph(run: dict[str, Any] | None) -> str:
    if run is None:
        return "n/a"
    return "yes" if run["fullgraph"]["ok"] else "no"


def _bitwise(run: dict[str, Any] | None) -> str:
    same = (run or {}).get("fullgraph", {}).get("same_as_eager")
    return "n/a" if same is None else "yes" if same["identical"] else "NO"


def _code(text: str) -> str:
    """``text`` as inline code, even when it holds backticks."""
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def site_counts(report: dict[str, Any], dtype: str) -> Counter[tuple[str, str, str, str]]:
    """(family, arm, location, category) -> breaks there, with the source line kept apart."""
    counted: Counter[tuple[str, str, str, str]] = Counter()
    for family in report["families"]:
        for arm in ARMS:
            run = arm_run(family, arm, dtype) or {}
            for record in run.get("break_records", []):
                category = classify(record["reason"], record["detail"], record["source"])
                counted[(family["family"], arm, record["location"] or "?", category)] += 1
    return counted


def sources(report: dict[str, Any]) -> dict[str, str]:
    """location -> source line, for every break site recorded."""
    found = {}
    for family in report["families"]:
        for result in family["arms"].values():
            for run in result.get("runs", {}).values():
                for record in run.get("break_records", []):
                    if record["location"] and record["source"]:
                        found[record["location"]] = record["source"]
    return found


def summary(report: dict[str, Any], dtype: str) -> dict[str, Any]:
    """Headline numbers for one dtype over the families both arms ran."""
    pairs = [
        (family, arm_run(family, "plain", dtype), arm_run(family, "graphmend", dtype))
        for family in report["families"]
    ]
    pairs = [(f, b, a) for f, b, a in pairs if b is not None and a is not None]
    counted = [(f, b, a) for f, b, a in pairs if _count(b) is not None and _count(a) is not None]
    return {
        "families": len(report["families"]),
        "paired": len(pairs),
        "breaks": (sum(_count(b) for _, b, _ in counted), sum(_count(a) for _, _, a in counted)),
        "branch": (
            sum(_count(b, "branch") for _, b, _ in counted),
            sum(_count(a, "branch") for _, _, a in counted),
        ),
        "fullgraph": (
            sum(b["fullgraph"]["ok"] for _, b, _ in pairs),
            sum(a["fullgraph"]["ok"] for _, _, a in pairs),
        ),
        "eager_identical": sum(
            bool(a.get("eager_same_as_first_arm", {}).get("identical")) for _, _, a in pairs
        ),
    }


def summary_lines(report: dict[str, Any]) -> list[str]:
    """One table row per dtype: the corpus totals."""
    rows = []
    for dtype in report["meta"]["dtypes"]:
        s = summary(report, dtype)
        rows.append(
            [
                dtype,
                f"{s['paired']}/{s['families']}",
                _arrow(*s["breaks"]),
                _arrow(*s["branch"]),
                _arrow(*s["fullgraph"]),
                f"{s['eager_identical']}/{s['paired']}",
            ]
        )
    header = [
        "dtype",
        "families measured",
        "breaks, without → with",
        "at data-dependent branches",
        "fullgraph=True compiles",
        "eager output identical",
    ]
    return _table(header, rows)


def family_table(report: dict[str, Any], manifest: dict[str, Any], dtype: str) -> list[str]:
    """Per family: breaks (all, branch), fullgraph and bitwise results of both arms."""
    rows = []
    for family in report["families"]:
        name = family["family"]
        before, after = (arm_run(family, arm, dtype) for arm in ARMS)
        if before is None:
            first = family["arms"][ARMS[0]]
            why = first.get("error") or (first.get("runs", {}).get(dtype, {}).get("eager_error"))
            why = why.get("error") if isinstance(why, dict) else why or first["status"]
            why = _LOCAL_PATH.sub(lambda found: f"'{found[1]}'" if found[1] else "", str(why))
            rows.append([name, f"not measured: {why[:100]}", "", "", "", "", ""])
            continue
        eager = (after or {}).get("eager_same_as_first_arm", {}).get("identical")
        rows.append(
            [
                name,
                manifest.get(name, {}).get("description", ""),
                _arrow(_count(before), _count(after)),
                _arrow(_count(before, "branch"), _count(after, "branch")),
                f"{_fullgraph(before)} / {_fullgraph(after)}",
                f"{_bitwise(before)} / {_bitwise(after)}",
                "n/a" if eager is None else "yes" if eager else "NO",
            ]
        )
    header = [
        "family",
        "model",
        "breaks",
        "branch breaks",
        "fullgraph plain / GraphMend",
        "compiled = eager, bitwise",
        "eager same in both arms",
    ]
    return _table(header, rows)


def sites_table(report: dict[str, Any], dtype: str, limit: int = TOP_SITES) -> list[str]:
    """The break sites left with GraphMend, most breaks first, with their source line."""
    counted = site_counts(report, dtype)
    lines = sources(report)
    left: Counter[tuple[str, str, str]] = Counter()
    plain: Counter[tuple[str, str, str]] = Counter()
    for (family, arm, location, category), count in counted.items():
        (left if arm == "graphmend" else plain)[(family, location, category)] += count
    rows = [
        [
            family,
            f"`{location}`",
            category,
            plain[family, location, category],
            count,
            _code(lines.get(location, "")[:90]),
        ]
        for (family, location, category), count in left.most_common(limit)
    ]
    header = ["family", "site", "category", "plain", "GraphMend", "source line"]
    return _table(header, rows)


def render_markdown(report: dict[str, Any], manifest: dict[str, Any]) -> str:
    """The whole report."""
    meta = report["meta"]
    lines = [
        f"# Real `trust_remote_code` models: transformers {meta['transformers']}",
        "",
        f"`{meta['command']}`, {meta['started'][:10]}, torch {meta['torch']}, GraphMend "
        f"{meta['graphmend']} (rewrites {', '.join(meta['rewrites'])}); breaks counted by "
        f"`torch._dynamo.explain` (backend eager), `fullgraph=True` with backend "
        f"{meta['fullgraph_backend']}; corpus in `bench/remote_corpus/` (manifest.json).",
        "",
        *summary_lines(report),
    ]
    for dtype in meta["dtypes"]:
        lines += [f"## {dtype}", "", *family_table(report, manifest, dtype)]
        lines += ["Break sites left with GraphMend, most breaks first:", ""]
        lines += sites_table(report, dtype, limit=100)
    return "\n".join(lines)


def write_report(report: dict[str, Any], manifest: dict[str, Any], folder: Path) -> list[Path]:
    """Write ``remote-corpus.md`` to ``folder``; returns the paths written."""
    path = folder / "remote-corpus.md"
    path.write_text(render_markdown(report, manifest) + "\n")
    return [path]


def main(argv: list[str] | None = None) -> int:
    from remote_corpus import load_manifest

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("report", type=Path, help="remote-corpus.json")
    options = parser.parse_args(argv)
    report = json.loads(options.report.read_text())
    written = write_report(report, load_manifest(), options.report.parent)
    print(f"wrote {', '.join(map(str, written))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
