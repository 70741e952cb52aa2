"""The ways in: install()/uninstall(), GRAPHMEND=1 through the .pth shim, the debug log."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

import pytest

import graphmend
from graphmend.config import Config, ConfigError
from graphmend.importer import GraphMendFinder, GraphMendLoader
from helpers.processes import python_path, run_python

SOURCE = "import torch\n\ndef f(x):\n    print('x', x)\n    return x\n"


def _finders() -> list[GraphMendFinder]:
    return [finder for finder in sys.meta_path if isinstance(finder, GraphMendFinder)]


def test_install_is_idempotent_and_reconfigures(write_module):
    first = graphmend.install(["gm_a"])
    assert graphmend.install(["gm_a"]) is first
    assert len(_finders()) == 1
    second = graphmend.install(["gm_b"])
    assert len(_finders()) == 1 and second.packages == ("gm_b",)
    assert not first.active and second.active
    graphmend.uninstall()
    assert _finders() == []
    graphmend.uninstall()  # harmless when nothing is installed


@pytest.mark.parametrize("packages", [[], (), iter([])])
def test_install_of_no_pattern_is_refused_as_the_environment_refuses_it(packages):
    with pytest.raises(ConfigError, match=r"packages=\[\] names no module pattern"):
        graphmend.install(packages)
    assert _finders() == []


@pytest.mark.parametrize(
    ("packages", "message"),
    [
        (["torch.nn"], r"packages=\['torch.nn'\]: module pattern 'torch.nn' would claim torch"),
        ("mypkg,other", r"packages=\['mypkg,other'\]: invalid module pattern"),
        (["a..b"], r"packages=\['a..b'\]: invalid module pattern"),
        ([None], r"packages=\[None\]: module patterns are strings"),
        (b"mypkg", r"packages=b'mypkg': module patterns are strings"),
        (5, r"packages=5: module patterns are strings"),
    ],
)
def test_install_refuses_a_bad_pattern_with_a_config_error(packages, message):
    # README: install() raises ConfigError for a value it cannot use, as the environment
    # does; these raised PatternError, or AttributeError from inside.
    with pytest.raises(ConfigError, match=message):
        graphmend.install(packages)
    assert _finders() == []


@pytest.mark.parametrize("cache_dir", ["", "  "])
def test_install_refuses_an_empty_cache_dir(cache_dir):
    # It used the working directory (Path("")), where GRAPHMEND_CACHE_DIR="" means the default.
    with pytest.raises(ConfigError, match=r"cache_dir='\s*' names no directory"):
        graphmend.install(["mypkg"], cache_dir=cache_dir)
    assert _finders() == []


def test_installation_is_a_context_manager(write_module):
    name = write_module(SOURCE)
    with graphmend.install(name) as installation:
        assert installation.active
        module = importlib.import_module(name)
    assert not installation.active and _finders() == []
    assert isinstance(module.__loader__, GraphMendLoader)


def test_install_warns_about_matching_modules_already_imported(write_module):
    name = write_module(SOURCE)
    importlib.import_module(name)
    with pytest.warns(graphmend.GraphMendWarning, match=rf"imported before the hook.*{name}"):
        graphmend.install([name])


def test_install_reads_cache_dir_and_packages(tmp_path, write_module, monkeypatch):
    name = write_module(SOURCE)
    monkeypatch.setenv("GRAPHMEND_PACKAGES", f"{name}, other.*")
    installation = graphmend.install(cache_dir=tmp_path / "elsewhere")
    assert installation.packages == (name, "other.*")
    importlib.import_module(name)
    assert list((tmp_path / "elsewhere").rglob("*.gmc"))


def test_a_relative_cache_dir_is_where_the_process_started(tmp_path, write_module, monkeypatch):
    name = write_module(SOURCE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GRAPHMEND_CACHE_DIR", "relative-cache")
    installation = graphmend.install([name])
    assert installation.config.environment()["GRAPHMEND_CACHE_DIR"] == str(
        tmp_path / "relative-cache"
    )  # and so for child processes started in another directory
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # as a server, or a Ray worker, may after startup
    importlib.import_module(name)
    assert list((tmp_path / "relative-cache").rglob("*.gmc"))
    assert not list(elsewhere.rglob("*.gmc"))


def test_bad_settings_are_clear_errors(monkeypatch):
    with pytest.raises(ValueError, match="invalid module pattern 'a b'"):
        graphmend.install(["a b"])
    monkeypatch.setenv("GRAPHMEND_REWRITES", "defer,teleport")
    with pytest.raises(ConfigError, match="unknown rewrite"):
        graphmend.install()
    monkeypatch.setenv("GRAPHMEND_REWRITES", "")
    assert Config.from_env().rewrites == frozenset()


def test_environment_variable_activates_every_process(write_module, tmp_path, cache_dir):
    name = write_module(SOURCE)
    script = f"import {name}, sys; print(type({name}.__loader__).__name__)"
    env = {
        "PYTHONPATH": python_path(tmp_path / "modules"),
        "GRAPHMEND_PACKAGES": name,
        "GRAPHMEND_CACHE_DIR": str(cache_dir),
    }
    on = run_python("-c", script, env={**env, "GRAPHMEND": "1", "GRAPHMEND_LOG": "debug"})
    assert on.returncode == 0, on.stderr
    assert on.stdout.strip() == "GraphMendLoader"
    assert f"graphmend: {name}: rewritten (defer 1 rewritten)" in on.stderr
    again = run_python("-c", script, env={**env, "GRAPHMEND": "1", "GRAPHMEND_LOG": "debug"})
    assert f"graphmend: {name}: cache hit (defer 1 rewritten)" in again.stderr
    off = run_python("-c", script + "; print('graphmend' in sys.modules)", env=env)
    assert off.stdout.split() == ["SourceFileLoader", "False"]
    zero = run_python("-c", script, env={**env, "GRAPHMEND": "0"})
    assert zero.stdout.strip() == "SourceFileLoader"


def test_broken_environment_never_stops_the_interpreter(write_module, tmp_path):
    result = run_python(
        "-c",
        "print('started')",
        env={"GRAPHMEND": "1", "GRAPHMEND_PACKAGES": "not a pattern!"},
    )
    assert result.returncode == 0
    assert result.stdout.strip() == "started"
    assert result.stderr.startswith(
        "graphmend: the import hook was not installed: GRAPHMEND_PACKAGES='not a pattern!': "
    )


# A branch whose arms differ in shape: it runs its original code while tracing, logged.
FALLS_BACK = """
import torch

def f(x):
    if x.sum() > 0:
        y = x[:1]
    else:
        y = x * 3
    return y
"""
IMPORT = "import {name}"
# The hook installed without its own debug log: only the runtime's line is written.
COMPILE = (
    "import torch; from graphmend.activation import install_config; "
    "from graphmend.config import Config; install_config(Config(packages=({name!r},))); "
    "import {name}; torch.compile({name}.f, backend='eager')(torch.ones(2, 4))"
)


@pytest.mark.parametrize(
    ("options", "env", "program"),
    [
        ([], {"GRAPHMEND": "maybe"}, IMPORT),
        ([], {"GRAPHMEND": "1", "GRAPHMEND_LOG": "debug"}, IMPORT),
        (["-W", "error"], {"GRAPHMEND": "1", "GRAPHMEND_CACHE_DIR": os.devnull}, IMPORT),
        ([], {"GRAPHMEND_LOG": "debug"}, COMPILE),
    ],
    ids=["bad-value-at-startup", "debug-log-of-an-import", "warning-made-an-error", "runtime-log"],
)
def test_a_stderr_that_cannot_be_written_never_stops_the_program(
    write_module, tmp_path, options, env, program
):
    # A log reader that went away (a broken pipe) or a full disk: plain Python runs the
    # program whatever it cannot say, and so must the messages GraphMend writes itself.
    name = write_module(FALLS_BACK)
    done = tmp_path / "done"
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run(
            [
                sys.executable,
                *options,
                "-c",
                f"{program.format(name=name)}; open({str(done)!r}, 'w')",
            ],
            env={
                **os.environ,
                "PYTHONPATH": python_path(tmp_path / "modules"),
                "GRAPHMEND_PACKAGES": name,
                **env,
            },
            stderr=write_end,
            timeout=600,
        )
    finally:
        os.close(write_end)
    assert result.returncode == 0
    assert done.exists()
