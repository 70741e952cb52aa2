"""``explain`` and ``diff``: every candidate site and its decision, the rewritten functions.

Both commands read source files and never import them: the fixture modules
here raise at import, so any import would fail the test.
"""

from __future__ import annotations

import ast
import importlib.metadata
import itertools
import json
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from graphmend.cli import main
from graphmend.findings import Decision, Finding
from graphmend.pipeline import rewrite
from helpers.processes import python_path, run_python

_counter = itertools.count()

MODULE = """
import logging
import torch

logger = logging.getLogger(__name__)

def helper(x):
    return x + 1

class Block(torch.nn.Module):
    def forward(self, x):
        logger.warning("scaling %s", x)
        print(*[x])
        return x * 2

def plain(x):
    logger.info("plain", stacklevel=2)
    return x

raise RuntimeError("explain and diff must not execute this module")
"""

UNCHANGED = """
import torch

def double(x):
    return x * 2
"""

NESTED = """
import torch

def outer(x):
    print("outer", x)

    def inner(y):
        print("inner", y)
        return y

    return inner(x)
"""

TRANSFORMERS_4 = importlib.metadata.version("transformers").startswith("4.")
BART = "transformers.models.bart.modeling_bart"


@pytest.fixture
def write_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., str]:
    """Write a fresh package on ``sys.path`` whose ``__init__`` raises; returns its name."""
    root = tmp_path / "packages"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))

    def write(modules: dict[str, str]) -> str:
        name = f"gm_explain_pkg_{next(_counter)}"
        package = root / name
        package.mkdir()
        (package / "__init__.py").write_text('raise RuntimeError("package imported")\n')
        for module, source in modules.items():
            (package / f"{module}.py").write_text(textwrap.dedent(source))
        return name

    return write


def _module_path(name: str) -> Path:
    return next(
        Path(entry) / f"{name}.py" for entry in sys.path if (Path(entry) / f"{name}.py").exists()
    )


def _line_of(source: str, text: str) -> int:
    lines = textwrap.dedent(source).splitlines()
    return next(number for number, line in enumerate(lines, 1) if text in line)


def _run(capsys: pytest.CaptureFixture[str], *arguments: str) -> tuple[int, str, str]:
    status = main(list(arguments))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_explain_lists_every_site_with_its_decision(write_module, capsys):
    name = write_module(MODULE)
    path = _module_path(name)
    status, out, err = _run(capsys, "explain", name)
    assert (status, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == f"{name} ({path}): 3 candidate sites: defer 1 rewritten, 2 declined"
    warning, star, stacklevel = (
        _line_of(MODULE, "logger.warning"),
        _line_of(MODULE, "print(*[x])"),
        _line_of(MODULE, "stacklevel=2"),
    )
    assert lines[1:4] == [
        f"  {path}:{warning}:9: in Block.forward: defer rewritten: "
        "logger.warning() deferred until after the graph (1 value captured at the call)",
        f"  {path}:{star}:9: in Block.forward: defer declined: "
        "*args or **kwargs cannot be carried out of the graph",
        f"  {path}:{stacklevel}:5: in plain: defer declined: "
        "stacklevel other than 1 names a caller's frame, which is gone after the graph",
    ]
    assert lines[-1] == "total: 1 module, 3 candidate sites (1 rewritten, 2 declined)"
    assert name not in sys.modules


BUILT_THEN_TRACED = """
import torch

class Block(torch.nn.Module):
    def __init__(self, scale):
        super().__init__()
        if scale.sum() > 0:
            scale = scale * 2
        print("built with", scale)

        def hook(module, args):
            print("hook", args)

        self.register_forward_pre_hook(hook)

    def __init_subclass__(cls, scale=None):
        print("subclass", scale)

    def forward(self, x):
        y = x.sum() if isinstance(x, torch.Tensor) else x
        print("forward", y)
        return y
"""


def test_code_run_only_while_building_is_not_listed_and_help_says_so(write_module, capsys):
    name = write_module(BUILT_THEN_TRACED)
    status, out, _ = _run(capsys, "explain", name)
    assert status == 0
    sites = [line.split(": in ")[1] for line in out.splitlines() if line.startswith("  ")]
    assert [site.split(":")[0] for site in sites] == [
        "Block.__init__.<locals>.hook",
        "Block.forward",
    ]
    with pytest.raises(SystemExit):
        main(["explain", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "neither is code in a class's __init__ or __init_subclass__" in help_text
    assert "conditions on Python values (flags, isinstance(), shapes, dtypes" in help_text


def test_declined_only_hides_rewritten_sites_but_keeps_the_counts(write_module, capsys):
    name = write_module(MODULE)
    status, out, _ = _run(capsys, "explain", "--declined-only", name)
    assert status == 0
    sites = [line for line in out.splitlines() if line.startswith("  ")]
    assert [site.split(": in ")[1].split(":")[0] for site in sites] == ["Block.forward", "plain"]
    assert all(" defer declined: " in site for site in sites)
    assert "defer 1 rewritten, 2 declined" in out.splitlines()[0]


def test_rewrites_option_selects_the_rewrites(write_module, capsys):
    name = write_module(MODULE)
    status, out, _ = _run(capsys, "explain", "--rewrites", "", name)
    assert status == 0
    assert out.splitlines()[0].endswith(": no candidate sites")
    status, _, err = _run(capsys, "explain", "--rewrites", "defer,nosuch", name)
    assert status == 2
    assert "unknown rewrite(s) nosuch" in err


def test_json_round_trips_to_the_pipelines_findings(write_module, capsys):
    name = write_module(MODULE)
    path = _module_path(name)
    status, out, _ = _run(capsys, "explain", "--json", name)
    assert status == 0
    records = json.loads(out)
    assert {record.pop("module") for record in records} == {name}
    findings = [Finding(**{**r, "decision": Decision(r["decision"])}) for r in records]
    expected = rewrite(path.read_bytes(), str(path), {"defer"}).findings
    assert sorted(findings, key=lambda f: f.lineno) == sorted(expected, key=lambda f: f.lineno)
    _, out, _ = _run(capsys, "explain", "--json", "--declined-only", name)
    assert [record["decision"] for record in json.loads(out)] == ["declined", "declined"]


def test_neither_the_module_nor_its_package_is_imported(write_package, capsys):
    package = write_package({"model": MODULE})
    before = set(sys.modules)
    status, out, err = _run(capsys, "explain", f"{package}.model")
    assert (status, err) == (0, "")
    assert out.startswith(f"{package}.model (")
    status, out, _ = _run(capsys, "diff", f"{package}.model")
    assert status == 0
    assert "Block.forward" in out
    assert {name for name in set(sys.modules) - before if name.startswith(package)} == set()


def test_a_glob_or_a_package_expands_to_its_modules(write_package, capsys):
    package = write_package({"model_a": MODULE, "model_b": UNCHANGED, "other": MODULE})
    status, out, _ = _run(capsys, "explain", f"{package}.model_*")
    assert status == 0
    headers = [line for line in out.splitlines() if line and not line.startswith(" ")]
    assert [header.split(" ")[0] for header in headers[:-1]] == [
        f"{package}.model_a",
        f"{package}.model_b",
    ]
    assert headers[-1] == "total: 2 modules, 3 candidate sites (1 rewritten, 2 declined)"
    # A package name stands for the package and every module below it.
    _, out, _ = _run(capsys, "explain", package)
    assert out.splitlines()[-1].startswith("total: 4 modules, 6 candidate sites")


def test_a_path_target_is_labelled_by_its_path(tmp_path, monkeypatch, capsys):
    path = tmp_path / "research_model.py"
    path.write_text(textwrap.dedent(MODULE))
    status, out, _ = _run(capsys, "explain", str(path))
    assert status == 0
    assert out.startswith(f"{path}: 3 candidate sites")
    monkeypatch.chdir(tmp_path)
    status, out, _ = _run(capsys, "explain", "./research_model.py")
    assert status == 0
    assert out.startswith("research_model.py: 3 candidate sites")
    assert f"\n  research_model.py:{_line_of(MODULE, 'stacklevel=2')}:5: in plain: " in out


def test_a_null_byte_is_reported_at_its_line(tmp_path, capsys):
    source = tmp_path / "nul.py"
    source.write_bytes(b"import torch\nx = 1 \0 + 2\n")
    status, _, err = _run(capsys, "explain", str(source))
    assert status == 1
    assert err.splitlines()[0] == (
        f"graphmend: error: {source}:2:0: syntax error: source code cannot contain null bytes"
    )


@pytest.mark.parametrize("separator", ["\f", "\x1c", "\u2028"])
def test_a_sites_source_is_its_own_line_after_a_character_python_does_not_end_lines_at(
    tmp_path, capsys, separator
):
    # a page break (form feed) on a line of its own, common in older code, or such a
    # character in a comment: the sites below it were shown with the line above's source
    path = tmp_path / "paged.py"
    path.write_text(
        f"import torch  # {separator}\n\f\ndef f(x):\n    y = x * 2\n    print('f', y.shape)\n",
        encoding="utf-8",
    )
    status, out, _ = _run(capsys, "explain", "--json", str(path))
    assert status == 0
    assert [(r["lineno"], r["source"]) for r in json.loads(out)] == [(5, "print('f', y.shape)")]


#: A module too deeply nested for Python's parser (python itself cannot compile it).
TOO_DEEP = "x = " + " + ".join(["1"] * 10_000) + "\n"
#: How it is reported: Python 3.10's parser takes it, and the rewrite's recursion fails.
TOO_DEEP_REPORT = (
    ":0:0: syntax error: too deeply nested"
    if sys.version_info >= (3, 11)
    else (": GraphMend failed")
)


@pytest.mark.parametrize("command", ["explain", "diff"])
def test_a_module_too_deep_to_parse_is_reported_and_the_others_still_shown(
    write_module, tmp_path, capsys, command
):
    # ast construction's RecursionError ended the command in GraphMend's traceback
    deep = tmp_path / "deep.py"
    deep.write_text(TOO_DEEP)
    name = write_module(MODULE)
    status, out, err = _run(capsys, command, str(deep), name)
    assert status == 1
    assert err.startswith(f"graphmend: error: {deep}{TOO_DEEP_REPORT}") and "Recursion" in err
    assert len(err.splitlines()) == 1
    assert name in out


def test_bad_targets_are_reported_and_the_others_still_explained(write_module, tmp_path, capsys):
    name = write_module(MODULE)
    broken = tmp_path / "broken.py"
    broken.write_text("import torch\n\ndef f(:\n    pass\n")
    broken_module = write_module("import torch\nx = (\n")
    status, out, err = _run(
        capsys,
        "explain",
        "gm_no_such_module.sub",
        str(broken),
        f"{name}.sub",
        broken_module,
        "gm_no_such_package_*",
        name,
        str(tmp_path / "missing.py"),
    )
    assert status == 1
    errors = err.splitlines()
    assert errors[0] == "graphmend: error: no module named 'gm_no_such_module' on sys.path"
    assert re.fullmatch(
        rf"graphmend: error: {re.escape(str(broken))}:3:7: syntax error: .+", errors[1]
    )
    assert errors[2] == f"graphmend: error: no module named '{name}.sub': '{name}' is not a package"
    assert errors[3].startswith(f"graphmend: error: {_module_path(broken_module)}:2:")
    assert errors[4] == (
        "graphmend: error: cannot list the modules of 'gm_no_such_package_*': "
        "its top-level package is a glob"
    )
    assert errors[5].startswith(f"graphmend: error: cannot read {tmp_path / 'missing.py'}: ")
    assert len(errors) == 6
    assert out.startswith(f"{name} (")
    assert out.splitlines()[-1].endswith("; 6 targets could not be explained (errors on stderr)")


@pytest.mark.parametrize("target", ["gm_namespace.inner", "gm_namespace.inner.leaf"])
def test_a_namespace_package_inside_a_namespace_package_is_explained(
    capsys, tmp_path, monkeypatch, target
):
    # its path reads the parent package from sys.modules, which nothing imported: a
    # KeyError traceback from importlib
    inner = tmp_path / "gm_namespace" / "inner"
    inner.mkdir(parents=True)
    (inner / "leaf.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    status, out, err = _run(capsys, "explain", target)
    assert (status, err) == (0, "")
    assert out.startswith("gm_namespace.inner.leaf (")


def test_a_directory_without_modules_is_an_error(capsys, tmp_path, monkeypatch):
    # read as a namespace package, it was explained as 0 modules, exit status 0
    (tmp_path / "gm_empty_directory").mkdir()
    monkeypatch.syspath_prepend(str(tmp_path))
    status, _out, err = _run(capsys, "explain", "gm_empty_directory")
    assert status == 1
    assert err == "graphmend: error: no Python modules in package 'gm_empty_directory'\n"


@pytest.mark.parametrize("command", ["explain", "diff"])
@pytest.mark.parametrize("target", ["torch.nn.functional", "os"])
def test_a_module_graphmend_never_rewrites_is_refused(capsys, command, target):
    # a single module was explained with its sites "rewritten", though the hook never
    # claims torch or the standard library
    status, out, err = _run(capsys, command, target)
    assert status == 1
    assert f"module pattern {target!r} would claim {target.partition('.')[0]}" in err
    assert "rewritten:" not in out


def test_command_line_exit_status_and_output(write_module, tmp_path):
    name = write_module(MODULE)
    result = run_python(
        "-m",
        "graphmend",
        "explain",
        name,
        "gm_no_such_module",
        env={"PYTHONPATH": python_path(_module_path(name).parent)},
    )
    assert result.returncode == 1
    assert "3 candidate sites: defer 1 rewritten, 2 declined" in result.stdout
    assert result.stderr == "graphmend: error: no module named 'gm_no_such_module' on sys.path\n"


def test_a_reader_that_stops_early_ends_the_command_quietly(write_module):
    functions = "".join(f"def f{i}(x):\n    print('value', x)\n\n" for i in range(600))
    name = write_module("import torch\n\n" + functions)
    process = subprocess.Popen(
        [sys.executable, "-m", "graphmend", "diff", name],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": python_path(_module_path(name).parent)},
    )
    assert process.stdout is not None and process.stderr is not None
    assert process.stdout.readline().startswith(b"# ")
    process.stdout.close()
    assert process.wait(timeout=60) == 1
    assert process.stderr.read() == b""


def test_real_transformers_module(capsys):
    was_imported = BART in sys.modules
    status, out, err = _run(capsys, "explain", BART)
    assert (status, err) == (0, "")
    lines = out.splitlines()
    sites = [line for line in lines if line.startswith("  ")]
    count = int(re.match(rf"{re.escape(BART)} \(.+\): (\d+) candidate sites?", lines[0])[1])
    rewritten = sum(" rewritten: " in site for site in sites)
    assert count == len(sites) > 0
    assert lines[-1] == (
        f"total: 1 module, {count} candidate site{'s' if count != 1 else ''} "
        f"({rewritten} rewritten, {count - rewritten} declined)"
    )
    _, out, _ = _run(capsys, "explain", "--json", BART)
    records = json.loads(out)
    assert len(records) == count
    assert all(record["filename"].endswith("modeling_bart.py") for record in records)
    if TRANSFORMERS_4:
        # transformers 4.x warns from forward (the decoder's, and until the attention
        # classes were merged, BartSdpaAttention's and BartFlashAttention2's); every
        # such site is deferred.
        warning_sites = {
            (r["function"], r["decision"])
            for r in records
            if r["source"].startswith("logger.warning_once(")
        }
        assert ("BartDecoder.forward", "rewritten") in warning_sites
        assert {decision for _, decision in warning_sites} == {"rewritten"}
    assert was_imported or BART not in sys.modules


def test_real_transformers_python_conditions_are_not_sites(capsys):
    # Found on both transformers versions by listing every rewritten site's condition:
    # flags imported relatively, string tests, dict reads, is_contiguous() were rewritten.
    python_valued = re.compile(
        r"is_torchdynamo_compiling\(\)|is_\w+_available\(\)|\.startswith\(|kwargs\.get\("
        r"|\.is_contiguous\(\)"
    )
    modules = [f"transformers.models.{name}" for name in ("bark", "prophetnet", "seamless_m4t")]
    status, out, _ = _run(capsys, "explain", "--json", *modules, BART, "!*.configuration_*")
    assert status == 0
    records = json.loads(out)
    assert {r["rewrite"] for r in records} >= {"predicate", "defer"}
    sites = [
        f"{r['module']}:{r['lineno']}: {r['source']}"
        for r in records
        if r["rewrite"] != "defer" and python_valued.search(r["source"])
    ]
    assert sites == []


def test_real_transformers_glob(capsys):
    status, out, _ = _run(capsys, "explain", "transformers.models.*.modeling_bart*")
    assert status == 0
    assert out.startswith(f"{BART} (")
    assert out.splitlines()[-1].startswith("total: 1 module, ")


def test_diff_shows_the_injected_code_and_only_the_changed_functions(write_module, capsys):
    name = write_module(MODULE)
    path = _module_path(name)
    status, out, err = _run(capsys, "diff", name)
    assert (status, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == (
        f"# {name} ({path}): GraphMend also puts first in the module a __dir__ that hides its "
        "names and a tracing check that is False until the runtime import (not shown)"
    )
    headers = [line for line in lines if line.startswith(("--- ", "+++ "))]
    torch_line = _line_of(MODULE, "import torch")
    forward_line = _line_of(MODULE, "def forward")
    assert headers == [
        f"--- {path}\tmodule level, after line {torch_line} (original)",
        f"+++ {path}\tmodule level, after line {torch_line} (rewritten)",
        f"--- {path}\tBlock.forward, line {forward_line} (original)",
        f"+++ {path}\tBlock.forward, line {forward_line} (rewritten)",
    ]
    added = [line[1:] for line in lines if line.startswith("+") and line[1:2] != "+"]
    assert added[:3] == [
        "import graphmend.runtime",
        "@graphmend.runtime.deferred('Block.forward')",
        "def graphmend_defer2(*gm_tokens3_):",
    ]
    assert any(re.fullmatch(r"    logger.warning\('scaling %s', gm_p\d+_\)", a) for a in added)
    assert "    if graphmend.runtime.tracing():" in added
    removed = [line for line in lines if line.startswith("-") and line[1:2] != "-"]
    assert removed == ["-    logger.warning('scaling %s', x)"]
    assert "def helper" not in out and "def plain" not in out


def test_diff_json_gives_each_function_before_and_after(write_module, capsys):
    name = write_module(MODULE)
    path = _module_path(name)
    status, out, _ = _run(capsys, "diff", "--json", name)
    assert status == 0
    records = json.loads(out)
    assert [(r["module"], r["file"], r["function"]) for r in records] == [
        (name, str(path), "<module>"),
        (name, str(path), "Block.forward"),
    ]
    forward = records[1]
    assert forward["lineno"] == _line_of(MODULE, "def forward")
    original = ast.parse(textwrap.dedent(MODULE)).body[4].body[0]
    assert forward["original"] == ast.unparse(original)
    assert "if graphmend.runtime.tracing():" in forward["rewritten"]
    assert records[0]["original"] == "import torch"
    assert records[0]["rewritten"].startswith("import torch\nimport graphmend.runtime\n")


def test_diff_of_nested_functions_shows_the_outer_one_once(write_module, capsys):
    name = write_module(NESTED)
    status, out, _ = _run(capsys, "diff", "--json", name)
    assert status == 0
    functions = [record["function"] for record in json.loads(out)]
    assert functions == ["<module>", "outer"]


def test_diff_says_so_when_nothing_was_rewritten(write_module, capsys):
    unchanged = write_module(UNCHANGED)
    declined = write_module("import torch\n\ndef f(x):\n    print(*x)\n")
    status, out, _ = _run(capsys, "diff", unchanged, declined)
    assert status == 0
    assert out.splitlines() == [
        f"{unchanged} ({_module_path(unchanged)}): no rewritten sites",
        f"{declined} ({_module_path(declined)}): no rewritten sites (1 declined; see 'explain')",
    ]
    status, out, _ = _run(capsys, "diff", "--json", unchanged)
    assert (status, json.loads(out)) == (0, [])


def test_diff_of_a_real_transformers_module(capsys):
    status, out, _ = _run(capsys, "diff", BART)
    _, explained, _ = _run(capsys, "explain", "--json", BART)
    assert status == 0
    functions = {r["function"] for r in json.loads(explained) if r["decision"] == "rewritten"}
    headers = re.findall(
        r"^\+\+\+ .*modeling_bart\.py\t(.+), (?:after )?line \d+ \(rewritten\)$", out, re.M
    )
    if functions:
        assert headers[0] == "module level"
        assert set(headers[1:]) <= functions
        assert "+import graphmend.runtime" in out.splitlines()
    else:
        assert out.endswith("no rewritten sites\n")
