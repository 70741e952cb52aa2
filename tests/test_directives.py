"""Opting out in the source: ``# graphmend: skip-file`` and ``@graphmend.do_not_rewrite``
(and functions TorchDynamo never traces), honoured by every way in."""

from __future__ import annotations

import importlib
import json
import textwrap
from pathlib import Path

import pytest
import torch
import torch._dynamo

import graphmend
from graphmend.cli import main
from graphmend.config import ALL_REWRITES, Config
from graphmend.findings import Decision
from graphmend.pipeline import rewrite
from graphmend.rewriter import ModuleRewriter, Status
from graphmend.rewrites import REWRITES
from graphmend.rewrites.common import TRACING
from helpers.processes import run_python

# `shout` is rewritten (its print is deferred); `quiet` is the same code, left alone.
DECORATED = """
import torch
{imports}

def shout(x):
    print("value", x)
    return x * 2

{decorator}
def quiet(x):
    print("value", x)
    return x * 2
"""

SKIPPED = """
import torch

# graphmend: skip-file

def shout(x):
    print("value", x)
    return x * 2
"""


def _findings(source: str) -> dict[str, list[tuple[str, Decision, str]]]:
    """The findings of ``source`` by function: (rewrite, decision, reason)."""
    result = rewrite(textwrap.dedent(source), "m.py", REWRITES)
    found: dict[str, list[tuple[str, Decision, str]]] = {}
    for finding in result.findings:
        found.setdefault(finding.function, []).append(
            (finding.rewrite, finding.decision, finding.reason)
        )
    return found


def _left_alone(reason: str) -> list[tuple[str, Decision, str]]:
    return [("all", Decision.DECLINED, f"left alone: {reason}")]


@pytest.mark.parametrize(
    ("imports", "decorator"),
    [
        ("import graphmend", "@graphmend.do_not_rewrite"),
        ("import graphmend as gm", "@gm.do_not_rewrite"),
        ("from graphmend import do_not_rewrite", "@do_not_rewrite"),
        ("from graphmend.directives import do_not_rewrite as keep", "@keep"),
        ("", "@torch.compiler.disable"),
        ("", "@torch._dynamo.disable"),
        ("from torch.compiler import disable", "@disable()"),
        ("", "@torch.compiler.disable(recursive=True, reason='custom kernel')"),
    ],
)
def test_a_directive_leaves_the_function_alone(imports, decorator):
    found = _findings(DECORATED.format(imports=imports, decorator=decorator))
    assert [decision for _, decision, _ in found["shout"]] == [Decision.REWRITTEN]
    reason = f"decorated with {decorator}"
    if "torch" in decorator or decorator == "@disable()":
        reason += ", so TorchDynamo never traces it"
    assert found["quiet"] == _left_alone(reason)


@pytest.mark.parametrize(
    ("imports", "decorator"),
    [
        # A decorator is known by what its name resolves to, not by its spelling.
        ("def do_not_rewrite(f):\n    return f", "@do_not_rewrite"),
        ("import mylib as graphmend", "@graphmend.do_not_rewrite"),
        # Only the function's own frame is skipped: what it calls is traced.
        ("", "@torch.compiler.disable(recursive=False)"),
    ],
)
def test_a_look_alike_is_no_directive(imports, decorator):
    found = _findings(DECORATED.format(imports=imports, decorator=decorator))
    assert [decision for _, decision, _ in found["quiet"]] == [Decision.REWRITTEN]


def test_what_is_nested_in_a_left_alone_definition_is_left_alone():
    found = _findings(
        """
        import torch
        import graphmend

        @graphmend.do_not_rewrite
        class Block(torch.nn.Module):
            def forward(self, x):
                print(x)
                return x

        @graphmend.do_not_rewrite
        def outer(x):
            def inner(y):
                print(y)
            return inner(x)

        def host(x):
            if x.sum() > 0:
                print(x)

                @graphmend.do_not_rewrite
                def helper(y):
                    print(y)

            print(x)
        """
    )
    assert found["Block"] == _left_alone("decorated with @graphmend.do_not_rewrite")
    assert found["outer"] == _left_alone("decorated with @graphmend.do_not_rewrite")
    assert found["host.<locals>.helper"] == _left_alone("decorated with @graphmend.do_not_rewrite")
    assert {"Block.forward", "outer.<locals>.inner"}.isdisjoint(found)
    assert Decision.REWRITTEN in [decision for _, decision, _ in found["host"]]


def test_the_marker_comment_leaves_the_module_alone():
    result = rewrite(textwrap.dedent(SKIPPED), "m.py", REWRITES)
    assert not result.changed
    [finding] = result.findings
    assert (finding.lineno, finding.col, finding.function, finding.source) == (
        4,
        0,
        "",
        "# graphmend: skip-file",
    )
    assert finding.reason == "left alone: the module is marked '# graphmend: skip-file'"
    for variant in ("#graphmend: skip-file  ", "x = 1  # graphmend: skip-file"):
        source = SKIPPED.replace("# graphmend: skip-file", variant)
        assert not rewrite(source, "m.py", REWRITES).changed


@pytest.mark.parametrize(
    "text",
    [
        'NOTE = """\n# graphmend: skip-file\n"""',  # in a string: not a comment
        "# graphmend: skip-file, maybe later",
        "# graphmend: skip_file",
        "# graphmend:skip-file",
    ],
)
def test_the_marker_must_be_the_comment_itself(text):
    assert rewrite(SKIPPED.replace("# graphmend: skip-file", text), "m.py", REWRITES).changed


def test_the_decorator_is_a_no_op_that_needs_no_torch():
    def function() -> int:
        return 1

    assert graphmend.do_not_rewrite(function) is function
    assert graphmend.do_not_rewrite(torch.nn.Linear) is torch.nn.Linear
    with pytest.raises(TypeError, match="without parentheses; got int"):
        graphmend.do_not_rewrite(3)
    result = run_python(
        "-c", "import sys, graphmend; graphmend.do_not_rewrite; print('torch' in sys.modules)"
    )
    assert (result.returncode, result.stdout) == (0, "False\n")


def _fullgraph_ok(function) -> bool:
    torch._dynamo.reset()
    try:
        torch.compile(function, backend="eager", fullgraph=True)(torch.ones(2))
    except torch._dynamo.exc.Unsupported:
        return False
    return True


def test_the_hook_leaves_the_decorated_function_alone(load_rewritten):
    module = load_rewritten(
        DECORATED.format(imports="import graphmend", decorator="@graphmend.do_not_rewrite")
    )
    assert TRACING in module.shout.__code__.co_names
    assert TRACING not in module.quiet.__code__.co_names
    assert _fullgraph_ok(module.shout)
    assert not _fullgraph_ok(module.quiet)  # print breaks the graph, as without GraphMend


def test_the_hook_loads_a_marked_module_as_python_would(write_module, cache_dir, capsys):
    name = write_module(SKIPPED)
    graphmend.activation.install_config(Config(packages=(name,), cache_dir=cache_dir, debug=True))
    module = importlib.import_module(name)
    assert not any(TRACING in entry for entry in vars(module))
    assert not _fullgraph_ok(module.shout)
    assert (
        f"graphmend: {name}: left alone: the module is marked '# graphmend: skip-file' (line 4); "
        "loaded as Python would"
    ) in capsys.readouterr().err
    assert not cache_dir.exists()  # nothing to cache: Python loads it


def test_run_honours_both(tmp_path: Path, cache_dir):
    (tmp_path / "gm_skipped_helper.py").write_text(textwrap.dedent(SKIPPED))
    script = DECORATED.format(
        imports="import graphmend\nimport gm_skipped_helper", decorator="@graphmend.do_not_rewrite"
    )
    script += textwrap.dedent(
        f"""
        print({TRACING!r} in shout.__code__.co_names, {TRACING!r} in quiet.__code__.co_names)
        print(any({TRACING!r} in entry for entry in vars(gm_skipped_helper)))
        """
    )
    (tmp_path / "script.py").write_text(script)
    result = run_python(
        "-m", "graphmend", "run", "-p", "gm_skipped_helper", "script.py", cwd=tmp_path
    )
    assert (result.returncode, result.stdout) == (0, "True False\nFalse\n"), result.stderr


def _write(root: Path, name: str, source: str) -> Path:
    path = root / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    return path


def _cli(capsys: pytest.CaptureFixture[str], *arguments: str) -> tuple[int, str, str]:
    status = main(list(arguments))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_explain_and_diff_show_what_is_left_alone(tmp_path, capsys):
    decorated = _write(
        tmp_path,
        "decorated",
        DECORATED.format(imports="import graphmend", decorator="@graphmend.do_not_rewrite"),
    )
    skipped = _write(tmp_path, "skipped", SKIPPED)
    status, out, _ = _cli(capsys, "explain", str(decorated), str(skipped))
    assert status == 0
    assert (
        f"  {decorated}:10:1: in quiet: all declined: left alone: decorated with "
        "@graphmend.do_not_rewrite"
    ) in out.splitlines()
    assert (
        f"  {skipped}:4:1: in <module>: all declined: left alone: the module is marked "
        "'# graphmend: skip-file'"
    ) in out.splitlines()
    status, out, _ = _cli(capsys, "explain", "--json", str(skipped))
    assert [(r["rewrite"], r["decision"]) for r in json.loads(out)] == [("all", "declined")]

    status, out, _ = _cli(capsys, "diff", "--json", str(decorated), str(skipped))
    assert status == 0
    assert [record["function"] for record in json.loads(out)] == ["<module>", "shout"]
    status, out, _ = _cli(capsys, "diff", str(skipped))
    assert out == f"{skipped}: no rewritten sites (1 declined; see 'explain')\n"


def test_cache_warm_honours_both(tmp_path, cache_dir, monkeypatch, capsys):
    package = tmp_path / "pkgs" / "gm_optout_pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    _write(
        package,
        "decorated",
        DECORATED.format(imports="import graphmend", decorator="@graphmend.do_not_rewrite"),
    )
    skipped = _write(package, "skipped", SKIPPED)
    monkeypatch.syspath_prepend(str(package.parent))

    assert main(["cache", "warm", "gm_optout_pkg"]) == 0
    captured = capsys.readouterr()
    assert (
        "gm_optout_pkg.skipped: left alone: the module is marked '# graphmend: skip-file' (line 4)"
    ) in captured.err
    assert "1 rewritten" in captured.out and "1 left alone" in captured.out

    rewriter = ModuleRewriter(Config.from_env())
    outcome = rewriter.build("gm_optout_pkg.skipped", str(skipped), skipped.read_bytes())
    assert (outcome.status, outcome.code) == (Status.LEFT_ALONE, None)
    # The decorated module comes from the cache, its left-alone function as written.
    graphmend.install(packages=["gm_optout_pkg"])
    module = importlib.import_module("gm_optout_pkg.decorated")
    assert TRACING in module.shout.__code__.co_names
    assert TRACING not in module.quiet.__code__.co_names


@pytest.mark.parametrize("call", ["locals()", "vars()", "dir()", "eval('x')", "exec('y = 1')"])
def test_a_function_reading_its_own_locals_is_left_alone(call):
    """The names a rewrite adds to a frame would be among what ``locals()`` gives
    (``combine(**locals())`` was given one: a TypeError, where plain compile runs; found
    by helper hpy)."""
    source = (
        "import torch\n\ndef f(x):\n    y = x + 1\n"
        f"    assert (y < 100).all(), 'big'\n    seen = {call}\n    return y\n"
    )
    findings = rewrite(source, "m.py", ALL_REWRITES).findings
    assert [f.reason for f in findings] == [
        f"left alone: it calls {call.split('(')[0]}(), which would list the names GraphMend "
        "adds to its frame"
    ]
