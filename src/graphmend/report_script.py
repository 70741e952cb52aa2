"""``python -m graphmend report``: run a script with GraphMend and report its compiled calls.

Without ``:FUNCTION`` the script runs as ``__main__``; every callable it hands
to ``torch.compile`` (or ``nn.Module.compile``) is reported on the first call it
makes.  While the script runs, ``torch.compile`` returns the callable itself,
wrapped to record that call: the script runs eagerly, so that a break under
``fullgraph=True`` does not stop it before the report.  With ``:FUNCTION`` the
script is loaded as a module (its ``if __name__ == "__main__":`` block does not
run) and ``FUNCTION()`` returns ``(model, args)`` or ``(model, args, kwargs)``.

``--compare`` runs the same script again in a fresh process without GraphMend
(no hook, the code as written) and reports the breaks GraphMend removed.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import torch

from graphmend.breaks import Observation, observe
from graphmend.config import Config
from graphmend.notices import flush
from graphmend.reporting import Report, explain_observation
from graphmend.runner import ScriptError, report_uncaught, run_script
from graphmend.runtime import fallbacks

#: A call to report: the callable, its arguments, and whether autograd recorded then.
Call = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any], bool]


class _FirstCall:
    """What ``torch.compile`` returns while a script is reported: the callable itself,
    recording the first call made through it."""

    def __init__(self, function: Callable[..., Any], calls: list[Call]) -> None:
        self._function = function
        self._calls = calls
        self._seen = False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not self._seen:
            self._seen = True
            self._calls.append((self._function, args, kwargs, torch.is_grad_enabled()))
        return self._function(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if "_function" not in vars(self):  # being copied or unpickled: not set yet
            raise AttributeError(name)
        return getattr(self._function, name)


class _FirstCallModule(torch.nn.Module):
    """What ``torch.compile`` returns for a module while a script is reported: a module,
    as ``OptimizedModule`` is (so that it can be assigned as a submodule, and its
    parameters and ``state_dict`` keys are those under ``_orig_mod.``), recording the
    first call made through it."""

    def __init__(self, module: torch.nn.Module, calls: list[Call]) -> None:
        super().__init__()
        self._orig_mod = module
        self._first_call = _FirstCall(module, calls)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._first_call(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if "_orig_mod" not in vars(self).get("_modules", {}):  # being copied: not set yet
                raise
            return getattr(self._modules["_orig_mod"], name)


def _recording_compile(calls: list[Call]) -> Callable[..., Any]:
    def compile_(model: Callable[..., Any] | None = None, **_options: Any) -> Any:
        if model is None:  # @torch.compile(...) used as a decorator factory
            return lambda function: compile_(function)
        if isinstance(model, torch.nn.Module):
            return _FirstCallModule(model, calls)
        return _FirstCall(model, calls)

    return compile_


def script_calls(target: str, args: list[str], config: Config | None) -> list[Call]:
    """The calls to report: run ``script.py`` (or load it and call ``FUNCTION``)."""
    path, function = split_target(target)
    calls: list[Call] = []
    original = torch.compile
    torch.compile = _recording_compile(calls)  # type: ignore[assignment]
    try:
        if function is None:
            try:
                run_script(path, args, config)
            except SystemExit as stop:
                if stop.code not in (None, 0):
                    raise
            return calls
        namespace = run_script(path, args, config, name="__graphmend_report__")
    finally:
        torch.compile = original  # type: ignore[assignment]
    return [_call_of(namespace, function, target)]


def split_target(target: str) -> tuple[str, str | None]:
    """``script.py:FUNCTION`` split; a target that is a file is all path."""
    path, _, function = target.rpartition(":")
    if not path or os.path.exists(target) or not function.isidentifier():
        return target, None
    return path, function


def _call_of(namespace: dict[str, object], function: str, target: str) -> Call:
    builder = namespace.get(function)
    if not callable(builder):
        raise ScriptError(f"{target}: the script defines no function {function!r}")
    built = report_uncaught(builder)  # an error is shown as the script's own
    if not (isinstance(built, tuple) and len(built) in (2, 3) and callable(built[0])):
        raise ScriptError(
            f"{target}: {function}() must return (model, args) or (model, args, kwargs)"
        )
    model, call_args, *rest = built
    kwargs = rest[0] if rest else {}
    wrong = [
        f"{name} a {kind}, not {type(value).__name__}"
        for name, value, kind, accepted in (
            ("args", call_args, "tuple or list", (tuple, list)),
            ("kwargs", kwargs, "dict", dict),
        )
        if not isinstance(value, accepted)
    ]
    if wrong:
        raise ScriptError(
            f"{target}: {function}() must return (model, args) or (model, args, kwargs), "
            + " and ".join(wrong)
        )
    return model, tuple(call_args), kwargs, torch.is_grad_enabled()


def observations(calls: list[Call]) -> list[tuple[Observation, list[fallbacks.Fallback]]]:
    """Each call traced as it was made (autograd on or off), with the fallbacks recorded
    while it was."""
    observed = []
    for function, args, kwargs, grad in calls:
        fallbacks.clear()
        try:
            with torch.set_grad_enabled(grad):
                observed.append((observe(function, *args, **kwargs), fallbacks.records()))
        except Exception as error:  # the call fails under TorchDynamo (or at all)
            first_line = str(error).strip().split("\n", 1)[0]
            raise ScriptError(
                f"{_name(function)}: its first call could not be traced "
                f"({type(error).__name__}: {first_line})"
            ) from None
    return observed


def plain_observations(target: str, args: list[str]) -> list[Observation]:
    """The same script's calls observed in a fresh process without GraphMend."""
    environment = {
        name: value for name, value in os.environ.items() if not name.startswith("GRAPHMEND")
    }
    with tempfile.TemporaryDirectory(prefix="graphmend-report-") as directory:
        output = os.path.join(directory, "plain.json")
        command = [sys.executable, "-m", "graphmend.report_plain", output]
        child = subprocess.run(
            [*command, target, *args], env=environment, capture_output=True, text=True
        )
        if child.returncode != 0:
            raise ScriptError(f"the run without GraphMend failed:\n{child.stderr.strip()}")
        with open(output, encoding="utf-8") as handle:
            return [Observation.from_json(entry) for entry in json.load(handle)]


def observe_without_graphmend(target: str, args: list[str], *, output: str) -> int:
    """The comparison child: the script's calls observed as written, as JSON in ``output``."""
    observed = observations(script_calls(target, args, None))
    with open(output, "w", encoding="utf-8") as handle:
        json.dump([observation.to_json() for observation, _ in observed], handle)
    return 0


def report_script(
    target: str, args: list[str], config: Config, *, compare: bool, as_json: bool
) -> int:
    """Run the script and print a report per compiled call; exit status 0.  Under
    ``as_json`` what the script prints goes to stderr: stdout holds only the JSON."""
    with _stdout_to_stderr() if as_json else contextlib.nullcontext():
        calls = script_calls(target, args, config)
        observed = observations(calls)
        plain = list(plain_observations(target, args)) if compare else []
    paired = itertools.zip_longest(observed, plain[: len(observed)])
    reports = [
        explain_observation(observation, recorded, before)
        for (observation, recorded), before in paired
    ]
    _print(calls, reports, as_json)
    return 0


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """Standard output sent to standard error: ``sys.stdout``, and file descriptor 1
    where it has one (what a child process, ``os.write(1, ...)`` or C code writes)."""
    flush(sys.stdout)
    flush(sys.stderr)
    try:
        out, err = sys.stdout.fileno(), sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # a stream of Python's own (a test's)
        out = err = None
    saved = os.dup(out) if out is not None else None
    try:
        if out is not None:
            os.dup2(err, out)  # type: ignore[arg-type]
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        flush(sys.stderr)
        if saved is not None:
            os.dup2(saved, out)  # type: ignore[arg-type]
            os.close(saved)


def _print(calls: list[Call], reports: list[Report], as_json: bool) -> None:
    names = [_name(call[0]) for call in calls]
    if as_json:
        entries = [{"model": name, **r.to_json()} for name, r in zip(names, reports, strict=True)]
        print(json.dumps(entries, indent=2))
        return
    if not reports:
        print("the script compiled nothing (no call through torch.compile)")
    for name, one in zip(names, reports, strict=True):
        print(f"== {name}")
        print(one)


def _name(function: Callable[..., Any]) -> str:
    owner = getattr(function, "__self__", function)  # nn.Module.compile: a bound _call_impl
    if isinstance(owner, torch.nn.Module):
        return type(owner).__qualname__
    return getattr(function, "__qualname__", type(function).__qualname__)
