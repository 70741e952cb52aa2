"""GraphMend's warnings and post-import setup never fail what they are about."""

from __future__ import annotations

import importlib.util
import sys
import warnings

import pytest

import graphmend
from graphmend import post_import
from graphmend.notices import GraphMendWarning, warn
from helpers.processes import python_path, run_python


def test_a_warning_made_an_error_is_written_to_stderr(capsys):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn("graphmend: something was not done")
    assert capsys.readouterr().err == "graphmend: something was not done\n"
    with pytest.warns(GraphMendWarning, match="something"):
        warn("graphmend: something was not done")


def test_importing_torch_dynamo_under_warnings_as_errors():
    # On torch releases GraphMend warns about (2.5, 2.6), the warning is issued while
    # torch._dynamo is imported: it must not become that import's exception.
    child = run_python(
        "-W", "error", "-c", "import torch, graphmend.runtime; import torch._dynamo; print('ok')"
    )
    assert child.returncode == 0, child.stderr[-2000:]
    assert child.stdout.strip() == "ok"


def test_a_failing_callback_never_fails_the_import_nor_the_callbacks_after_it(
    tmp_path, monkeypatch
):
    (tmp_path / "gm_watched.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []

    def broken(module):
        raise RuntimeError("broken setup")

    post_import.when_imported("gm_watched", broken)
    post_import.when_imported("gm_watched", lambda module: seen.append(module.VALUE))
    # the loader a pending module's spec carries is the real one's, method for method
    spec = importlib.util.find_spec("gm_watched")
    assert spec.loader.get_filename("gm_watched") == str(tmp_path / "gm_watched.py")
    try:
        with pytest.warns(GraphMendWarning, match="gm_watched was imported failed"):
            module = importlib.import_module("gm_watched")
    finally:
        sys.modules.pop("gm_watched", None)
    assert module.VALUE == 1
    assert seen == [1]


def _line_below() -> int:
    return sys._getframe(1).f_lineno + 1


def test_a_warning_names_the_program_line_that_led_to_it(write_module, tmp_path, monkeypatch):
    # not a line of GraphMend's own code: the install() call, the import statement
    stale = write_module("VALUE = 1\n")
    importlib.import_module(stale)
    with pytest.warns(GraphMendWarning, match="imported before the hook") as caught:
        line = _line_below()
        graphmend.install([stale, "gm_notice_*"], cache_dir=tmp_path / "cache")
    assert (caught[0].filename, caught[0].lineno) == (__file__, line)

    def unreadable() -> str:
        raise PermissionError(13, "Permission denied", "graphmend/pipeline.py")

    monkeypatch.setattr("graphmend.cache.graphmend_fingerprint", unreadable)
    claimed = write_module("VALUE = 2\n", name="gm_notice_claimed")
    with pytest.warns(GraphMendWarning, match="its own source cannot be read") as caught:
        line = _line_below()
        __import__(claimed)  # through importlib's bootstrap, whose frames warnings skips
    assert (caught[0].filename, caught[0].lineno) == (__file__, line)


def test_a_warning_under_python_dash_m_of_the_users_own_obeys_the_filters(tmp_path):
    # Attributed to runpy (python -m imports the package), it was taken for GraphMend's
    # command line and written to stderr, where -W ignore::GraphMendWarning cannot reach.
    package = tmp_path / "gm_dash_m_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("import torch\nX = 1\n")
    (package / "mod.py").write_text("print('ran')\n")
    launcher = """
import runpy, sys, warnings
import graphmend, graphmend.pipeline

def broken(*args, **kwargs):
    raise RecursionError("maximum recursion depth exceeded")

graphmend.pipeline.rewrite = broken
graphmend.install(["gm_dash_m_pkg"])
warnings.simplefilter(sys.argv[1], graphmend.GraphMendWarning)
runpy.run_module("gm_dash_m_pkg.mod", run_name="__main__", alter_sys=True)
"""
    environment = {"GRAPHMEND_CACHE": "0", "PYTHONPATH": f"{tmp_path}:{python_path()}"}
    quiet = run_python("-c", launcher, "ignore", env=environment, cwd=tmp_path)
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (0, "ran\n", "")
    shown = run_python("-c", launcher, "default", env=environment, cwd=tmp_path)
    assert "GraphMendWarning: graphmend could not rewrite gm_dash_m_pkg" in shown.stderr
