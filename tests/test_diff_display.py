"""``diff`` shows the generated code with names a person can read (``graphmend_cond1``,
``graphmend.runtime.branch(...)``), never the ``_@gm_`` names the rewritten module
really binds, and never a name the module's own source uses."""

from __future__ import annotations

import ast
import json
import textwrap

import pytest

from graphmend.cli import main
from graphmend.display import Display
from graphmend.pipeline import parse, rewrite
from graphmend.rewrites.common import PREFIX
from helpers.modules import EVERY_REWRITE

MODULE = EVERY_REWRITE

BART = "transformers.models.bart.modeling_bart"


def _diff(capsys: pytest.CaptureFixture[str], *arguments: str) -> str:
    assert main(["diff", *arguments]) == 0
    return capsys.readouterr().out


def _names(text: str) -> set[str]:
    return {node.id for node in ast.walk(ast.parse(text)) if isinstance(node, ast.Name)}


def test_generated_names_read_as_python(tmp_path, capsys):
    path = tmp_path / "model.py"
    path.write_text(textwrap.dedent(MODULE))
    out = _diff(capsys, str(path))
    assert "@gm_" not in out
    added = [line[1:] for line in out.splitlines() if line.startswith("+") and line[1:2] != "+"]
    assert added[:2] == ["import graphmend.runtime", "@graphmend.runtime.deferred('step')"]
    assert added.count("    if graphmend.runtime.tracing():") == 3
    assert "        graphmend_cond1 = x.sum() > 0" in added
    assert "        def graphmend_then1(x):" in added
    assert any(a.startswith("        graphmend_merged1 = graphmend.runtime.branch(") for a in added)
    assert "        graphmend_cond2 = (y > 100).any()" in added
    # The binding of the tracing check shows as nothing: the check reads as what it is.
    assert not any("tracing =" in a for a in added)
    # --json carries the same text: the rewritten side of each record, valid Python.
    records = json.loads(_diff(capsys, "--json", str(path)))
    assert [record["function"] for record in records] == ["<module>", "step"]
    for record in records:
        ast.parse(record["rewritten"])
        assert set(record["rewritten"].splitlines()) - set(record["original"].splitlines()) <= set(
            added
        )
    assert "    if graphmend.runtime.tracing():" in records[1]["rewritten"].splitlines()


#: A function that declares a global of its own and defers a print.
DECLARES_A_GLOBAL = """
import torch

COUNT = 0


def step(x):
    global COUNT
    COUNT += 1
    print("step", x.shape, COUNT)
    return x + COUNT
"""


def test_a_global_statement_shows_the_modules_own_names(tmp_path, capsys):
    # diff showed "global COUNT" as "global graphmend_" (and "global logger" as
    # "global graphmend_r"): the module's own names were cut as generated ones.
    path = tmp_path / "counting.py"
    path.write_text(DECLARES_A_GLOBAL)
    out = _diff(capsys, str(path))
    assert "     global COUNT" in out.splitlines()
    assert "graphmend_\n" not in out and "global graphmend_" not in out


def test_the_rewritten_module_keeps_its_generated_names():
    source = textwrap.dedent(MODULE)
    result = rewrite(source, "model.py", {"predicate", "trap", "defer"})
    before = ast.dump(result.tree)
    step = result.tree.body[-1]
    assert isinstance(step, ast.FunctionDef) and step.name == "step"
    shown = Display(parse(source, "model.py")).render([step])
    assert "@gm_" not in shown and "graphmend_cond1 = x.sum() > 0" in shown
    assert ast.dump(result.tree) == before  # rendering works on a copy
    assert PREFIX + "cond1" in before


@pytest.mark.parametrize(
    ("user_code", "prefix", "runtime_import"),
    [
        # A name of the source starting with graphmend_: the prefix grows until none does.
        ("graphmend_cond1 = 1\ngraphmend__x = 2\n", "graphmend___", "import graphmend.runtime"),
        ("def g(graphmend_flag=True):\n    return graphmend_flag\n", "graphmend__", None),
        ("class C:\n    graphmend_then = 1\n", "graphmend__", None),
        ("from tools import graphmend_util\n", "graphmend__", None),
        # graphmend bound to something else: the runtime is shown under a prefixed name.
        (
            "try:\n    import graphmend\nexcept ImportError:\n    graphmend = None\n",
            "graphmend_",
            "import graphmend.runtime as graphmend_runtime",
        ),
        (
            "from tools import graphmend\n",
            "graphmend_",
            "import graphmend.runtime as graphmend_runtime",
        ),
        (
            "def g(graphmend):\n    return graphmend\n",
            "graphmend_",
            "import graphmend.runtime as graphmend_runtime",
        ),
        # The package itself, imported and read: graphmend.runtime is what it says.
        (
            "import graphmend\n\n@graphmend.do_not_rewrite\ndef quiet(x):\n    print(x)\n",
            "graphmend_",
            "import graphmend.runtime",
        ),
    ],
)
def test_shown_names_never_match_a_name_of_the_source(
    tmp_path, capsys, user_code, prefix, runtime_import
):
    source = textwrap.dedent(MODULE) + "\n" + user_code
    path = tmp_path / "model.py"
    path.write_text(source)
    records = json.loads(_diff(capsys, "--json", str(path)))
    shown = "\n".join(record["rewritten"] for record in records)
    source_names = _names(source) | {
        node.arg for node in ast.walk(ast.parse(source)) if isinstance(node, ast.arg)
    }
    generated = {name for name in _names(shown) if name.startswith(prefix)} - source_names
    assert f"{prefix}cond1" in generated
    assert not any(name.startswith(prefix) for name in source_names)
    if runtime_import is not None:
        assert runtime_import in shown.splitlines()


def test_a_real_transformers_module_shows_valid_python(capsys):
    records = json.loads(_diff(capsys, "--json", BART))
    assert len(records) > 1
    for record in records:
        assert "@gm_" not in record["rewritten"], record["function"]
        ast.parse(record["rewritten"])
    text = _diff(capsys, BART)
    assert "@gm_" not in text
    assert "+import graphmend.runtime" in text.splitlines()


#: A configuration module that never imports torch (CodeT5+'s configuration_codet5p.py):
#: its logging call is deferred, and the runtime is bound once torch is imported.
WITHOUT_TORCH = '''
"""A configuration."""
import logging

logger = logging.getLogger(__name__)


class Config:
    @classmethod
    def make(cls, size):
        logger.info("making one of size %s", size)
        return cls()
'''


def test_a_module_that_never_imports_torch_shows_its_late_binding(tmp_path, capsys):
    # diff failed there (ValueError: no runtime import in a rewritten module).
    path = tmp_path / "configuration.py"
    path.write_text(WITHOUT_TORCH)
    out = _diff(capsys, str(path))
    assert "@gm_" not in out
    assert "module level, after line 2 (rewritten)" in out
    added = [line[1:] for line in out.splitlines() if line.startswith("+") and line[1:2] != "+"]
    assert added[0] == "def graphmend_bind(torch_module):"
    assert added[1].startswith("    global graphmend_defer")
    assert added[2] == "    import graphmend.runtime"
    assert "graphmend_post_import.when_imported('torch', graphmend_bind)" in added
    records = json.loads(_diff(capsys, "--json", str(path)))
    assert [record["function"] for record in records] == ["<module>", "Config.make"]
    for record in records:
        ast.parse(record["rewritten"])
