"""Measuring one model, plain or with GraphMend: shared by ``census.py`` and ``remote_corpus.py``.

In one dtype, a model runs eagerly, under ``torch._dynamo.explain`` (default
mode, backend "eager", every graph break with its reason, Dynamo's debug
context, the innermost model-code ``file:line`` and its category from
``census_report.classify``) and under ``torch.compile(fullgraph=True)``;
outputs are flattened to tensors and compared bitwise.  Which arm runs
(plain or after ``graphmend.install()``) is up to the caller, one process
per arm.

Model code is transformers' own package or a ``trust_remote_code`` module
that transformers copied into its dynamic-module cache
(``transformers_modules/...``); locations are given relative to those roots.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import linecache
import logging
import os
import re
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import torch

from census_report import classify
from graphmend.breaks import graph_break_log


def forward(model: Callable[..., Any], inputs: dict[str, torch.Tensor]) -> Any:
    """One seeded, gradient-free call."""
    torch.manual_seed(0)
    with torch.no_grad():
        return model(**inputs)


def cast(inputs: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Floating-point inputs in ``dtype``; token ids and masks unchanged."""
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in inputs.items()}


# -- errors, stacks, outputs -----------------------------------------------------------------

#: First lines that only wrap the message below them (a ``BackendCompilerFailed``'s names
#: the backend object, at an address that differs from run to run).
_WRAPPERS = ("Encountered graph break", "Failed to handle graph break", "backend=")
_FRAME = re.compile(r'File "([^"]+)", line (\d+)')
_AT = re.compile(r"in user code at (.+):(\d+)$", re.MULTILINE)


@functools.cache
def source_roots() -> tuple[str, ...]:
    """Directories of model code, each with a trailing separator.

    The installed transformers package, and the folder above transformers'
    dynamic-module cache (``trust_remote_code`` modules), so that their
    locations read ``transformers_modules/<model>/<file>:<line>``.
    """
    import transformers
    from transformers.utils import HF_MODULES_CACHE

    return (
        os.path.dirname(transformers.__file__) + os.sep,
        os.path.join(HF_MODULES_CACHE, ""),
    )


def first_line(text: str) -> str:
    """The first line of a Dynamo message that says something (wrapper lines skipped)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    while len(lines) > 1 and lines[0].startswith(_WRAPPERS):
        lines.pop(0)
    return lines[0] if lines else ""


def debug_context(text: str) -> str | None:
    """Dynamo's "Developer debug context" line of a break message, if any."""
    for line in text.splitlines():
        if line.strip().startswith("Developer debug context:"):
            return line.split(":", 1)[1].strip()
    return None


def innermost_source(frames: list[tuple[str, int]]) -> tuple[str | None, str | None]:
    """``path:line`` (relative to its ``source_roots`` entry) and source of the innermost frame."""
    roots = source_roots()
    for filename, lineno in reversed(frames):
        root = next((root for root in roots if filename.startswith(root)), None)
        if root is not None:
            source = linecache.getline(filename, lineno).strip()
            return f"{filename[len(root) :]}:{lineno}", source or None
    return None, None


def error_frames(error: BaseException) -> list[tuple[str, int]]:
    """The user stack of a Dynamo error, else the frames its message names, else its traceback."""
    stack = getattr(error, "real_stack", None)
    if stack:
        return [(frame.filename, frame.lineno or 0) for frame in stack]
    named = [(filename, int(line)) for filename, line in _FRAME.findall(str(error))]
    if named:
        return named
    return [(f.filename, f.lineno or 0) for f in traceback.extract_tb(error.__traceback__)]


def describe(error: BaseException) -> dict[str, Any]:
    """An error as JSON: type and first line, and the innermost model-code line involved."""
    location, source = innermost_source(error_frames(error))
    message = f"{type(error).__name__}: {first_line(str(error))}"
    described: dict[str, Any] = {"error": message[:400], "location": location}
    if source:
        described["source"] = source
    return described


def flat_tensors(value: Any, path: str = "out", depth: int = 0) -> list[tuple[str, torch.Tensor]]:
    """Every tensor in a model output (ModelOutput, tuples, cache objects), with its path."""
    if isinstance(value, torch.Tensor):
        return [(path, value.detach().clone())]
    if depth > 8:
        return []
    if isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, (list, tuple)):
        items = list(enumerate(value))
    elif type(value).__module__.startswith("transformers") and hasattr(value, "__dict__"):
        items = list(vars(value).items())
    else:
        return []
    found: list[tuple[str, torch.Tensor]] = []
    for key, item in items:
        found += flat_tensors(item, f"{path}.{key}", depth + 1)
    return found


def same_bits(expected: torch.Tensor, actual: torch.Tensor) -> bool:
    """Bitwise equality (NaN payloads and the sign of zero included)."""
    if expected.dtype != actual.dtype or expected.shape != actual.shape:
        return False
    if expected.is_complex():
        expected, actual = torch.view_as_real(expected), torch.view_as_real(actual)
    if expected.is_floating_point():
        bits = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[
            expected.element_size()
        ]
        expected, actual = expected.contiguous().view(bits), actual.contiguous().view(bits)
    return torch.equal(expected, actual)


def compare(
    expected: list[tuple[str, torch.Tensor]], actual: list[tuple[str, torch.Tensor]]
) -> dict[str, Any]:
    """Whether two flattened outputs are bitwise identical, and the first difference."""
    result: dict[str, Any] = {"identical": True, "tensors": len(expected)}
    if [path for path, _ in expected] != [path for path, _ in actual]:
        return {**result, "identical": False, "difference": "different output structure"}
    for (path, want), (_, got) in zip(expected, actual, strict=True):
        if not same_bits(want, got):
            result.update(identical=False, difference=path)
            if want.shape == got.shape and want.is_floating_point() and got.is_floating_point():
                result["max_abs_diff"] = float(
                    (want.double() - got.double()).abs().nan_to_num().max()
                )
            return result
    return result


# -- graph breaks ----------------------------------------------------------------------------


class BreakLog(logging.Handler):
    """Collects Dynamo's ``graph_breaks`` log records, one per break (``graph_break_log``).

    Each record gives the reason, Dynamo's debug context and the innermost
    model-code line of the break's user stack.  Dynamo prints the stack only
    the first time a break site is seen; later records reuse it through
    ``sites``, which maps Dynamo's frame location to that line.
    """

    def __init__(self, sites: dict[tuple[str, int], tuple[str | None, str | None]]) -> None:
        super().__init__(logging.DEBUG)
        self.sites = sites
        self.records: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        error = record.exc_info[1] if record.exc_info else None
        self.records.append(self.parse(record.getMessage(), error))

    def parse(self, message: str, error: BaseException | None) -> dict[str, Any]:
        """One break from a log message (and the exception logged with it, if any)."""
        head, _, stack = message.partition("User code traceback:")
        if "Graph Break Reason:" in head:
            text = head.split("Graph Break Reason:", 1)[1]
        else:
            text = str(error) if error is not None else message
        frames = [(filename, int(line)) for filename, line in _FRAME.findall(stack or message)]
        at = _AT.search(head)
        site = (at.group(1), int(at.group(2))) if at else None
        location, source = innermost_source(frames)
        if location is None and site is not None:
            location, source = self.sites.get(site) or innermost_source([site])
        elif site is not None:
            self.sites[site] = (location, source)
        reason, detail = first_line(text), (debug_context(text) or "")[:300] or None
        return {
            "reason": reason,
            "detail": detail,
            "location": location,
            "source": source,
            "category": classify(reason, detail, source),
        }


@contextlib.contextmanager
def timed(record: dict[str, Any], key: str) -> Iterator[None]:
    """Records the seconds the block took in ``record["seconds"][key]``."""
    started = time.perf_counter()
    try:
        yield
    finally:
        record.setdefault("seconds", {})[key] = round(time.perf_counter() - started, 2)


def count_breaks(
    model: torch.nn.Module, inputs: dict[str, torch.Tensor], sites: dict[Any, Any]
) -> dict[str, Any]:
    """Default-mode graph breaks: ``torch._dynamo.explain`` plus Dynamo's counters and log.

    ``breaks`` is the largest of explain's ``graph_break_count``, the
    ``counters["graph_break"]`` total and the number of logged breaks, since
    each source misses some kinds of break.
    """
    from torch._dynamo.utils import counters

    counters.clear()
    log = BreakLog(sites)
    with graph_break_log(log):
        try:
            torch.manual_seed(0)
            with torch.no_grad():
                explanation = torch._dynamo.explain(model)(**inputs)
        except Exception as error:
            return {"explain_error": describe(error), "break_records": log.records}
    counted = sum(counters["graph_break"].values())
    return {
        "breaks": max(explanation.graph_break_count, counted, len(log.records)),
        "graphs": explanation.graph_count,
        "explain_break_count": explanation.graph_break_count,
        "explain_break_reasons": len(explanation.break_reasons),
        "counter_breaks": counted,
        "logged_breaks": len(log.records),
        "break_records": log.records,
    }


def compile_fullgraph(
    model: torch.nn.Module, inputs: dict[str, torch.Tensor], backend: str
) -> tuple[dict[str, Any], list[tuple[str, torch.Tensor]] | None]:
    """``torch.compile(fullgraph=True)``: whether it compiles and runs, and its outputs."""
    torch._dynamo.reset()
    try:
        compiled = torch.compile(model, fullgraph=True, backend=backend)
        outputs = flat_tensors(forward(compiled, inputs))
    except Exception as error:
        described = describe(error)
        category = classify(described["error"], None, described.get("source"))
        return {"ok": False, **described, "category": category}, None
    finally:
        torch._dynamo.reset()
    return {"ok": True}, outputs


def measure(
    model: torch.nn.Module,
    inputs: dict[str, torch.Tensor],
    dtype_name: str,
    backend: str,
    sites: dict[Any, Any],
) -> tuple[dict[str, Any], dict[str, list[tuple[str, torch.Tensor]]]]:
    """Eager run, break count and fullgraph compile of a copy of the model in one dtype."""
    dtype = getattr(torch, dtype_name)
    model = copy.deepcopy(model).to(dtype)
    inputs = cast(inputs, dtype)
    record: dict[str, Any] = {}
    outputs: dict[str, list[tuple[str, torch.Tensor]]] = {}
    with timed(record, "eager"):
        try:
            outputs["eager"] = flat_tensors(forward(model, inputs))
        except Exception as error:
            record["eager_error"] = describe(error)
            return record, outputs
    with timed(record, "explain"):
        record.update(count_breaks(model, inputs, sites))
    with timed(record, "fullgraph"):
        record["fullgraph"], compiled = compile_fullgraph(model, inputs, backend)
    if compiled is not None:
        outputs["compiled"] = compiled
        record["fullgraph"]["same_as_eager"] = compare(outputs["eager"], compiled)
    return record, outputs
