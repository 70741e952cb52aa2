"""``graphmend.report`` and ``python -m graphmend report``: each remaining graph break is
tied to GraphMend's decision at its line, with the reason and the values a failing
trace-time check saw."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import graphmend
from graphmend.breaks import observe
from graphmend.cli import main as cli_main
from graphmend.report_script import script_calls
from graphmend.reporting import Report, Verdict
from helpers.modules import import_both, import_plain, import_rewritten
from helpers.processes import offline_model_environment, run_python

PROBE = Path(__file__).parent / "helpers" / "report_probe.py"

MODULE = """
import torch

import graphmend


class Attention(torch.nn.Module):
    def forward(self, x):
        return x * 2


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attention = Attention()

    def forward(self, x):
        if x.sum() > 0:
            y = x[:1]
        else:
            y = x * 3
        if x.mean() > 0:
            z = self.attention(x)
        else:
            z = x
        if torch.isnan(x).any():
            raise ValueError(f"nan in {x}")
        return y, z, opted_out(x)


@graphmend.do_not_rewrite
def opted_out(x):
    if x.max() > 0:
        x = x + 1
    return x
"""


def _by_source(report: Report) -> dict[str, object]:
    return {entry.source: entry for entry in report.remaining}


def test_each_remaining_break_has_graphmend_decision_and_reason(tmp_path: Path) -> None:
    module = import_rewritten(tmp_path, "report_subject", MODULE)
    report = graphmend.report(module.Model(), torch.ones(2, 4))
    entries = _by_source(report)
    assert set(entries) == {
        "if x.sum() > 0:",
        "if x.mean() > 0:",
        "if torch.isnan(x).any():",
        "if x.max() > 0:",
    }
    shapes = entries["if x.sum() > 0:"]
    assert shapes.verdict is Verdict.FELL_BACK and shapes.observed.category == "branch"
    assert "float32[1, 4] tensor" in shapes.why and "float32[2, 4] tensor" in shapes.why
    submodule = entries["if x.mean() > 0:"]
    assert submodule.verdict is Verdict.FELL_BACK
    assert "its type Attention is not known to be pure" in submodule.why
    guard = entries["if torch.isnan(x).any():"]
    assert guard.verdict is Verdict.FELL_BACK and "the message needs tensor data" in guard.why
    opted_out = entries["if x.max() > 0:"]
    assert opted_out.verdict is Verdict.LEFT_ALONE and "do_not_rewrite" in opted_out.why
    assert all(entry.hint for entry in report.remaining)


def test_a_break_below_a_page_break_shows_its_own_line(tmp_path: Path) -> None:
    # str.splitlines() ends a line at a form feed too, Python does not: every break
    # below a page break was shown with the source of the line above it
    source = "import torch\n\f\ndef f(x):\n    x = x + 1\n    torch._dynamo.graph_break()\n"
    module = import_rewritten(tmp_path, "paged_subject", source + "    return x * 2\n")
    report = graphmend.report(module.f, torch.ones(2))
    assert [entry.source for entry in report.remaining] == ["torch._dynamo.graph_break()"]


FALLING_BACK = """
import torch


class Gate(torch.nn.Module):
    def forward(self, x):
        return x * 2


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gate = Gate()

    def forward(self, x):
        if x.sum() > 0:
            x = self.gate(x)
        else:
            x = x - 1
        if x.mean() > 0:
            x = self.gate(x)
        else:
            x = x + 1
        return x
"""


def test_fallbacks_in_resumed_frames_are_reported_at_the_lines_plain_compile_breaks(
    tmp_path: Path,
) -> None:
    # Both sites fall back (a submodule not known to be pure): the second breaks in the
    # frame TorchDynamo resumes after the first, whose line table it writes itself.  The
    # generated call of each site spans the ``if``'s lines: Python 3.10 placed it on its
    # last line (the fallback was recorded there, and the report said "rewritten, but
    # TorchDynamo broke inside it"), and on 3.12+ the resumed frame's breaks were
    # reported lines below the user's.
    plain, mended = import_both(tmp_path, "resumed_lines", FALLING_BACK)
    x = torch.ones(2, 4)
    torch._dynamo.reset()
    assert sorted(entry.lineno for entry in observe(plain.Model(), x).breaks) == [16, 20]
    report = graphmend.report(mended.Model(), x)
    assert sorted((entry.observed.lineno, entry.verdict) for entry in report.remaining) == [
        (16, Verdict.FELL_BACK),
        (20, Verdict.FELL_BACK),
    ]


def test_a_module_not_claimed_is_not_in_scope_and_says_what_would_change(
    tmp_path: Path,
) -> None:
    module = import_plain(tmp_path, "report_unclaimed", MODULE)
    report = graphmend.report(module.Model(), torch.ones(2, 4))
    entry = _by_source(report)["if x.sum() > 0:"]
    assert entry.verdict is Verdict.NOT_IN_SCOPE
    assert "GraphMend would rewrite this site (predicate, continuation)" in entry.why
    assert "GRAPHMEND_PACKAGES='report_unclaimed'" in entry.hint


def test_declined_sites_and_non_candidates_are_told_apart(tmp_path: Path) -> None:
    source = """
    import torch

    def forward(x, n):
        if x.sum() > 0:
            print("positive")
            x = x + 1
        k = n.item()
        return x * k
    """
    module = import_rewritten(tmp_path, "report_declined", source)
    report = graphmend.report(module.forward, torch.ones(3), torch.tensor(2))
    entries = _by_source(report)
    declined = entries["if x.sum() > 0:"]
    assert declined.verdict is Verdict.DECLINED and declined.why.startswith("predicate: ")
    host = entries["k = n.item()"]
    assert host.verdict is Verdict.NOT_A_CANDIDATE and host.observed.category == "host value"
    assert "capture_scalar_outputs" in host.hint


def test_fallbacks_are_logged_with_pid_and_rank(tmp_path: Path) -> None:
    (tmp_path / "logged.py").write_text(textwrap.dedent(MODULE))
    script = (
        "import torch, graphmend\ngraphmend.install(['logged'])\nimport logged\n"
        "torch.compile(logged.Model(), backend='eager')(torch.ones(2, 4))\n"
    )
    child = run_python("-c", script, cwd=tmp_path, env={"GRAPHMEND_LOG": "debug", "RANK": "3"})
    assert child.returncode == 0, child.stderr
    lines = [line for line in child.stderr.splitlines() if "runs its original code" in line]
    assert any(
        " rank 3]: " in line and "logged.py:18 (forward)" in line and "float32[1, 4]" in line
        for line in lines
    ), child.stderr


SCRIPT = """
import os

import torch
import subject



def build():
    return subject.Model(), (torch.ones(2, 4),)


if __name__ == "__main__":
    model = torch.compile(subject.Model(), fullgraph=True)
    print("result", model(torch.ones(2, 4))[1].shape)
    os.write(1, b"written to descriptor 1\\n")
"""

SUBJECT = """
import torch

class Model(torch.nn.Module):
    def forward(self, x):
        x = x + 1  # merged, x is not the caller's tensor: test_predicate's aliasing tests
        if x.sum() > 0:
            x = x * 2
        if x.mean() > 0:
            y = x[:1]
        else:
            y = x
        return x, y
"""


@pytest.fixture
def script(tmp_path: Path) -> Path:
    (tmp_path / "subject.py").write_text(textwrap.dedent(SUBJECT))
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(SCRIPT))
    return path


def test_report_command_runs_the_script_and_compares_without_graphmend(script: Path) -> None:
    child = run_python(
        "-m",
        "graphmend",
        "report",
        "--compare",
        "--json",
        "-p",
        "subject",
        str(script),
        cwd=script.parent,
    )
    assert child.returncode == 0, child.stderr
    # the script ran, eagerly; what it printed goes to stderr: stdout is only the JSON
    assert "result torch.Size([1, 4])" in child.stderr
    assert "written to descriptor 1" in child.stderr  # os.write(1, ...), as a child writes
    (model,) = json.loads(child.stdout)
    assert model["model"] == "Model"
    assert model["without_graphmend"]["graphs"] > model["graphs"]
    assert [entry["lineno"] for entry in model["removed"]] == [7]
    (remaining,) = model["breaks"]
    assert remaining["lineno"] == 9 and remaining["decision"] == "fell back while tracing"


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_report_command_with_a_closed_stream_drops_what_it_writes_there(
    script, monkeypatch, capsys, stream
) -> None:
    # Python sets sys.stdout or sys.stderr to None when started with it closed
    # (report --json script.py >&-): GraphMend's AttributeError, before the script ran
    monkeypatch.chdir(script.parent)
    monkeypatch.setattr(sys, stream, None)
    assert cli_main(["report", "--json", "-p", "subject", str(script)]) == 0
    written = capsys.readouterr()
    if stream == "stdout":
        assert "result torch.Size([1, 4])" in written.err
    else:
        assert json.loads(written.out)[0]["model"] == "Model"


def test_report_command_whose_reader_is_gone_stops_quietly(script: Path) -> None:
    # report --json script.py | true: GraphMend's BrokenPipeError traceback, where
    # explain, diff and check stop quietly with status 1
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        child = subprocess.run(
            [sys.executable, "-m", "graphmend", "report", "--json", "-p", "subject", str(script)],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            cwd=script.parent,
        )
    finally:
        os.close(write_end)
    assert child.returncode == 1
    assert child.stderr.splitlines() == ["result torch.Size([1, 4])", "written to descriptor 1"]


def test_report_command_calls_a_named_function(script: Path) -> None:
    child = run_python(
        "-m", "graphmend", "report", "-p", "subject", f"{script}:build", cwd=script.parent
    )
    assert child.returncode == 0, child.stderr
    assert "result torch" not in child.stdout  # the script's body ran as a module: no __main__ code
    assert "subject.py:9 in forward: if x.mean() > 0:" in child.stdout
    assert "graphmend: fell back while tracing: predicate: result 1:" in child.stdout


def test_report_command_names_a_missing_function(script: Path) -> None:
    child = run_python("-m", "graphmend", "report", f"{script}:nothing", cwd=script.parent)
    assert child.returncode == 2
    assert "defines no function 'nothing'" in child.stderr


#: Census models and the bundled remote-code model: the decision at each line where a
#: break remains (source line → decision); a model with none compiles as one graph.
REAL_MODELS = {
    "xlm_length_assert": {},
    "tiny_remote_model": {},
    "led_global_attention": {
        "is_global_attn = is_index_global_attn.flatten().any().item()": "not a candidate",
    },
    "encodec_padding": {
        "if length <= max_pad:": "not a candidate",
        "hidden_states = self.lstm(hidden_states)[0] + hidden_states": "not a candidate",
    },
    "fastspeech2_conformer_model": {
        "hidden_states = torch.zeros(": "not a candidate",
        "repeated = torch.repeat_interleave(encoded_embedding, target_duration, dim=0)": (
            "not a candidate"
        ),
    },
}


@pytest.fixture(scope="module")
def real_reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    scratch = tmp_path_factory.mktemp("report")
    env = offline_model_environment(scratch)
    child = run_python(str(PROBE), *REAL_MODELS, env=env)
    assert child.returncode == 0, child.stderr[-3000:]
    return json.loads(child.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", REAL_MODELS)
def test_real_models_every_remaining_break_is_explained(real_reports, case) -> None:
    report = real_reports[case]
    decisions = {entry["source"]: entry["decision"] for entry in report["breaks"]}
    for source, decision in REAL_MODELS[case].items():
        assert decisions.get(source) == decision, report["breaks"]
    for entry in report["breaks"]:
        assert entry["decision"] in {verdict.value for verdict in Verdict}
        assert entry["why"] and entry["category"] and entry["source"], entry
    if not REAL_MODELS[case]:
        assert report["graphs"] == 1 and not report["breaks"]


#: torch.compile of modules as scripts use it: true under plain torch.compile.
COMPILED_MODULES = """
import copy

import torch

net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
net[1] = torch.compile(net[1])  # a compiled module assigned as a submodule
net.tag = "mine"
compiled = torch.compile(net)
assert isinstance(compiled, torch.nn.Module)
assert list(compiled.state_dict()) == ["_orig_mod.0.weight", "_orig_mod.0.bias"]
assert compiled._orig_mod is net and compiled.training and compiled.tag == "mine"
average = copy.deepcopy(compiled)  # as an exponential moving average of the weights is made
assert average.tag == "mine" and average._orig_mod is not net
"""


def test_a_compiled_module_is_a_module_while_the_script_is_reported(tmp_path: Path) -> None:
    exec(COMPILED_MODULES, {})  # as the script runs without report (no call: no compile)
    path = tmp_path / "compiles_modules.py"
    path.write_text(COMPILED_MODULES + "compiled(torch.ones(2))\n")
    calls = script_calls(str(path), [], None)
    assert [type(function).__name__ for function, *_ in calls] == ["Sequential", "ReLU"]


@pytest.mark.parametrize(
    ("built", "wrong"),
    [
        ("linear, 5", "args a tuple or list, not int"),
        ("linear, (torch.ones(2),), 7", "kwargs a dict, not int"),
        ("linear, [torch.ones(2)], []", "kwargs a dict, not list"),
        ("linear, {}, []", "args a tuple or list, not dict and kwargs a dict, not list"),
        ("linear,", ""),
    ],
)
def test_report_command_says_what_a_named_function_returns_wrong(
    tmp_path, built, wrong, capsys
) -> None:
    path = tmp_path / "builds.py"
    path.write_text(
        f"import torch\n\ndef build():\n    linear = torch.nn.Linear(2, 2)\n    return {built}\n"
    )
    assert cli_main(["report", f"{path}:build"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"graphmend: {path}:build: build() must return (model, args) or")
    assert line.endswith(f"(model, args, kwargs), {wrong}" if wrong else "(model, args, kwargs)")


def test_report_command_says_in_one_line_that_a_call_cannot_be_traced(tmp_path, capsys) -> None:
    # It ended in a hundred-line traceback through GraphMend's and torch's frames.
    path = tmp_path / "untraceable.py"
    path.write_text(
        "import torch\n\ndef f(x):\n    return x + 'a'\n\ng = torch.compile(f)\n"
        "try:\n    g(torch.ones(1))\nexcept TypeError:\n    pass\n"
    )
    assert cli_main(["report", str(path)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("graphmend: f: its first call could not be traced (TorchRuntimeError:")


def test_report_command_shows_a_failing_named_function_as_the_scripts_error(tmp_path) -> None:
    path = tmp_path / "builds.py"
    path.write_text("def build():\n    raise KeyError('no model here')\n")
    child = run_python("-m", "graphmend", "report", f"{path}:build", cwd=tmp_path)
    assert child.returncode == 1
    assert child.stderr.splitlines() == [
        "Traceback (most recent call last):",
        f'  File "{path}", line 2, in build',
        "    raise KeyError('no model here')",
        "KeyError: 'no model here'",
    ]


def test_report_command_has_no_option_that_writes_a_named_file(tmp_path, capsys) -> None:
    # report --without-graphmend FILE script.py, the option of report --compare's child,
    # ran the script and overwrote FILE with JSON: a user's source lost
    notes = tmp_path / "notes.py"
    notes.write_text("kept = True\n")
    script = tmp_path / "script.py"
    script.write_text("print('ran')\n")
    assert cli_main(["report", "--without-graphmend", str(notes), str(script)]) == 2
    captured = capsys.readouterr()
    assert "unknown option '--without-graphmend'" in captured.err
    assert (captured.out, notes.read_text()) == ("", "kept = True\n")
