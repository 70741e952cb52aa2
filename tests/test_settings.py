"""Settings: module patterns with exclusions, reserved modules, GRAPHMEND_* values, ``check``."""

from __future__ import annotations

import importlib
import json
import re
import site
import sys
import tempfile
from pathlib import Path

import pytest

import graphmend
import graphmend_hook
from graphmend import config
from graphmend.check import check, satisfies
from graphmend.cli import main as cli_main
from graphmend.config import DEFAULT_PACKAGES, Config, ConfigError, hook_requested
from graphmend.importer import GraphMendFinder, GraphMendLoader
from graphmend.patterns import ModuleMatcher, PatternError
from graphmend.rewriter import ModuleRewriter
from helpers.processes import python_path, run_python

SOURCE = "import torch\n\ndef f(x):\n    print('x', x)\n    return x\n"


@pytest.mark.parametrize(
    ("patterns", "name", "claimed"),
    [
        (["tf.models.*", "!tf.models.bart.*"], "tf.models.llama.modeling_llama", True),
        (["tf.models.*", "!tf.models.bart.*"], "tf.models.bart.modeling_bart", False),
        (["tf.models.*", "!tf.models.bart"], "tf.models.bart", False),
        (["tf.models.*", "!tf.models.bart"], "tf.models.bart.modeling_bart", False),
        (["tf.models.*", "!tf.models.bart"], "tf.models.bartpho.x", True),
        (["!tf.models.bart.*", "tf.models.*"], "tf.models.bart.modeling_bart", False),
        (["*.modeling_*", "!*.modeling_bart"], "x.modeling_bart", False),
        (["*.modeling_*", "!*.modeling_bart"], "x.modeling_llama", True),
        (["!tf"], "tf.models", False),
        (["mypkg", "!torch.*"], "mypkg.a", True),
    ],
)
def test_exclusions_win_over_inclusions(patterns, name, claimed):
    assert ModuleMatcher(patterns).matches(name) is claimed


def test_exclusions_keep_the_first_component_fast_path():
    matcher = ModuleMatcher(["tf.models.*", "!*.bart.*"])
    assert matcher.patterns == ("tf.models.*",) and matcher.exclusions == ("*.bart.*",)
    assert matcher.roots() == ("tf",)
    assert matcher._roots == frozenset({"tf"})


@pytest.mark.parametrize(
    "pattern", ["mypkg.", "transformers.[", "a[b", "!", "! ", "!!x", "a.!b", "1pkg", "a-b"]
)
def test_malformed_patterns_are_refused(pattern):
    with pytest.raises(PatternError, match="module pattern"):
        ModuleMatcher([pattern])


@pytest.mark.parametrize(
    ("pattern", "named"),
    [
        ("torch", "torch"),
        ("torch.nn.functional", "torch"),
        ("torch.*", "torch"),
        ("graphmend", "graphmend"),
        ("graphmend.runtime", "graphmend"),
        ("graphmend_hook", "graphmend_hook"),
        ("*", "graphmend, torch"),
        ("t*", "torch"),
        ("?orch.nn.functional", "torch"),
        ("numpy.linalg", "numpy"),
        ("sympy", "sympy"),
        ("json", "json"),
        ("importlib.*", "importlib"),
    ],
)
def test_patterns_claiming_graphmend_torch_or_what_they_import_are_refused(pattern, named):
    with pytest.raises(PatternError, match=re.escape(f"{pattern!r} would claim {named}")):
        ModuleMatcher([pattern])
    ModuleMatcher(["mypkg", f"!{pattern}"])  # as an exclusion it is harmless


@pytest.mark.parametrize("pattern", ["*.modeling_*", "transformers.[a-z]*", "*_models.x"])
def test_globs_that_name_no_reserved_package_are_accepted(pattern):
    ModuleMatcher([pattern])


def test_the_finder_refuses_reserved_modules_whatever_the_patterns(cache_dir):
    finder = GraphMendFinder(
        ModuleMatcher(["*.decoder"]), ModuleRewriter(Config(cache_dir=cache_dir))
    )
    assert finder.matcher.matches("json.decoder")
    assert not finder.claims("json.decoder")
    assert finder.find_spec("json.decoder") is None
    assert finder.claims("mypkg.decoder")


@pytest.mark.parametrize("pattern", ["torch.nn.functional", "torch", "graphmend", "*"])
def test_a_reserved_pattern_never_breaks_importing_torch(pattern):
    result = run_python(
        "-c",
        "import torch; print(torch.ones(1).sum().item())",
        env={"GRAPHMEND": "1", "GRAPHMEND_PACKAGES": pattern},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "1.0"
    [line] = result.stderr.splitlines()
    assert line.startswith(
        f"graphmend: the import hook was not installed: GRAPHMEND_PACKAGES={pattern!r}: "
        f"module pattern {pattern!r} would claim "
    )


def test_a_glob_matching_torch_modules_leaves_them_alone():
    result = run_python(
        "-c",
        "import torch, sys; print(torch.ones(1).sum().item()); "
        "print(any(type(f).__name__ == 'GraphMendFinder' for f in sys.meta_path))",
        env={"GRAPHMEND": "1", "GRAPHMEND_PACKAGES": "*.functional"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["1.0", "True"]
    assert result.stderr == ""


def _package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    package = tmp_path / "pkgs" / name
    (package / "skip").mkdir(parents=True)
    for relative in ("__init__.py", "keep.py", "skip/__init__.py", "skip/inner.py"):
        (package / relative).write_text(SOURCE)
    monkeypatch.syspath_prepend(str(package.parent))


def test_install_honours_exclusions(tmp_path, monkeypatch):
    _package(tmp_path, monkeypatch, "gm_excl_pkg")
    graphmend.install(["gm_excl_pkg", "!gm_excl_pkg.skip"])
    loaders = {
        name: type(importlib.import_module(f"gm_excl_pkg.{name}").__loader__)
        for name in ("keep", "skip", "skip.inner")
    }
    assert loaders["keep"] is GraphMendLoader
    assert loaders["skip"] is not GraphMendLoader
    assert loaders["skip.inner"] is not GraphMendLoader


def test_exclusions_in_the_environment_reach_a_new_process(tmp_path, monkeypatch):
    # GRAPHMEND=1 with GRAPHMEND_PACKAGES='pkg,!pkg.skip', as a serving container sets it.
    _package(tmp_path, monkeypatch, "gm_env_excl")
    probe = (
        "import importlib\n"
        "for name in ('keep', 'skip', 'skip.inner'):\n"
        "    module = importlib.import_module('gm_env_excl.' + name)\n"
        "    print(name, type(module.__loader__).__name__)\n"
    )
    result = run_python(
        "-c",
        probe,
        env={
            "GRAPHMEND": "1",
            "GRAPHMEND_PACKAGES": "gm_env_excl,!gm_env_excl.skip",
            "PYTHONPATH": python_path(tmp_path / "pkgs"),
        },
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "keep GraphMendLoader",
        "skip SourceFileLoader",
        "skip.inner SourceFileLoader",
    ]


def test_exclusions_alone_narrow_the_default_scope(monkeypatch):
    bart = "!transformers.models.bart.*"
    assert Config().with_packages([bart]).packages == (*DEFAULT_PACKAGES, bart)
    assert Config.from_env({"GRAPHMEND_PACKAGES": bart}).packages == (*DEFAULT_PACKAGES, bart)
    monkeypatch.setenv("GRAPHMEND_PACKAGES", f"mypkg, {bart}")
    assert graphmend.install().packages == ("mypkg", bart)
    assert graphmend.install([bart]).packages == (*DEFAULT_PACKAGES, bart)


def test_cache_warm_honours_exclusions(tmp_path, monkeypatch, capsys):
    _package(tmp_path, monkeypatch, "gm_warm_excl")
    assert cli_main(["cache", "warm", "gm_warm_excl", "!gm_warm_excl.skip"]) == 0
    captured = capsys.readouterr()
    assert "warmed 2 modules" in captured.out
    assert "gm_warm_excl.skip" not in captured.err


def test_explain_and_diff_honour_exclusion_targets(tmp_path, monkeypatch, capsys):
    _package(tmp_path, monkeypatch, "gm_explain_excl")
    assert cli_main(["explain", "gm_explain_excl", "!gm_explain_excl.skip"]) == 0
    out = capsys.readouterr().out
    assert "gm_explain_excl.keep (" in out and "total: 2 modules" in out
    assert "gm_explain_excl.skip" not in out
    assert cli_main(["diff", "--json", "gm_explain_excl.*", "!*.inner"]) == 0
    modules = {record["module"] for record in json.loads(capsys.readouterr().out)}
    assert modules == {"gm_explain_excl.keep", "gm_explain_excl.skip"}
    assert cli_main(["explain", "gm_explain_excl", "!bad pattern"]) == 2
    assert "invalid module pattern '!bad pattern'" in capsys.readouterr().err


@pytest.mark.parametrize("word", ["1", "true", "YES", " on "])
def test_on_words(word):
    assert hook_requested({"GRAPHMEND": word})


@pytest.mark.parametrize("word", ["", "0", "false", "No", "off"])
def test_off_words(word):
    assert not hook_requested({"GRAPHMEND": word})
    assert not hook_requested({})


@pytest.mark.parametrize("word", ["disabled", "none", "n", "2", "enable"])
def test_other_words_are_errors_naming_the_value(word):
    with pytest.raises(ConfigError, match=rf"GRAPHMEND={word!r}: use 1/true/yes/on for on"):
        hook_requested({"GRAPHMEND": word})


def test_the_startup_shim_knows_the_off_words():
    assert graphmend_hook.OFF_WORDS == config.OFF_WORDS


BAD_VALUES = [
    ("GRAPHMEND_CUDA_GUARDS", "bogus", "use 'sync'"),
    ("GRAPHMEND_PACKAGES", ",,,", "names no module pattern"),
    ("GRAPHMEND_PACKAGES", "mypkg.", "invalid module pattern 'mypkg.'"),
    ("GRAPHMEND_PACKAGES", "transformers.[", "invalid module pattern 'transformers.['"),
    ("GRAPHMEND_PACKAGES", "torch", "would claim torch"),
    ("GRAPHMEND_CACHE", "maybe", "use 1/true/yes/on for on"),
    ("GRAPHMEND_LOG", "verbose", "use 'debug'"),
    ("GRAPHMEND_REWRITES", "defer,teleport", "unknown rewrite(s) teleport"),
    ("GRAPHMEND_CACHE_DIR", "~gm-no-such-user/c", "the user 'gm-no-such-user' has no home"),
]


@pytest.mark.parametrize(("variable", "value", "reason"), BAD_VALUES)
def test_a_bad_value_is_an_error_naming_the_variable_and_the_value(variable, value, reason):
    with pytest.raises(ConfigError) as caught:
        Config.from_env({variable: value})
    assert str(caught.value).startswith(f"{variable}={value!r}: ")
    assert reason in str(caught.value)


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("GRAPHMEND", "disabled"),
        ("GRAPHMEND", "none"),
        ("GRAPHMEND", "n"),
        ("GRAPHMEND_CUDA_GUARDS", "bogus"),
        ("GRAPHMEND_PACKAGES", ",,,"),
    ],
)
def test_a_bad_value_at_startup_leaves_the_hook_out_with_one_line(variable, value):
    result = run_python(
        "-c",
        "import sys; print(any(type(f).__name__ == 'GraphMendFinder' for f in sys.meta_path))",
        env={"GRAPHMEND": "1", variable: value},
    )
    assert result.returncode == 0
    assert result.stdout.strip() == "False"
    [line] = result.stderr.splitlines()
    assert line.startswith(f"graphmend: the import hook was not installed: {variable}={value!r}: ")


def test_a_bad_value_at_startup_without_stderr_writes_nothing(monkeypatch, capsys):
    # Python sets sys.stderr to None when started with stderr closed (2>&-); an exception
    # out of the .pth line would then be printed on stdout.
    monkeypatch.setenv("GRAPHMEND", "1")
    monkeypatch.setenv("GRAPHMEND_LOG", "verbose")
    monkeypatch.setattr("sys.stderr", None)
    graphmend_hook.activate_from_env()
    assert capsys.readouterr().out == ""
    assert graphmend.activation.current() is None


def test_cuda_guards_setting():
    assert Config.from_env({}).cuda_guards == "async"
    assert Config.from_env({"GRAPHMEND_CUDA_GUARDS": " SYNC "}).cuda_guards == "sync"
    assert config.cuda_guards({"GRAPHMEND_CUDA_GUARDS": "sync"}) == "sync"
    assert config.cuda_guards({}) == "async"
    with pytest.raises(ConfigError, match="GRAPHMEND_CUDA_GUARDS='bogus'"):
        config.cuda_guards({"GRAPHMEND_CUDA_GUARDS": "bogus"})


@pytest.mark.parametrize(
    "chosen",
    [
        Config(),
        Config(
            packages=("mypkg", "!mypkg.slow"),
            cache_dir=Path("/srv/cache"),
            cache_enabled=False,
            rewrites=frozenset(),
            debug=True,
            cuda_guards="sync",
        ),
        Config(packages=("*.modeling_*",), rewrites=frozenset({"defer", "trap"})),
    ],
)
def test_environment_round_trips(chosen):
    environment = chosen.environment()
    assert environment["GRAPHMEND"] == "1"
    assert Config.from_env(environment) == chosen


def test_check_reports_a_healthy_environment_with_exit_0(cache_dir):
    result = run_python("-m", "graphmend", "check", env={"GRAPHMEND": "1"})
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert any(line.split() == ["GRAPHMEND", "on", "('1')"] for line in lines)
    assert any(line.split() == ["this", "process", "hook", "installed"] for line in lines)
    assert f"GRAPHMEND_CACHE_DIR    {cache_dir} (environment)" in result.stdout
    assert "GRAPHMEND_PACKAGES     transformers.models.*," in result.stdout
    assert f"{cache_dir}: read-write" in result.stdout
    assert "(requirement: torch>=" in result.stdout
    assert lines[-1] == "status: ok"


def test_check_fails_on_a_cache_others_can_write(monkeypatch, capsys, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    status, out = _check(monkeypatch, capsys, GRAPHMEND_CACHE_DIR=str(shared))
    assert status == 1
    assert f"PROBLEM: {shared}" in out and "writable by" in out


def _check(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], **env: str):
    for variable, value in env.items():
        monkeypatch.setenv(variable, value)
    status = check()
    return status, capsys.readouterr().out


def test_check_without_graphmend_set_is_healthy(monkeypatch, capsys):
    status, out = _check(monkeypatch, capsys)
    assert status == 0
    assert "GRAPHMEND              off (unset)" in out
    assert "hook not installed" in out
    assert out.endswith("status: ok\n")


def test_check_fails_on_each_bad_value(monkeypatch, capsys, tmp_path):
    (tmp_path / "a_file").write_text("")
    status, out = _check(
        monkeypatch,
        capsys,
        GRAPHMEND="maybe",
        GRAPHMEND_CUDA_GUARDS="bogus",
        GRAPHMEND_PACKAGES="mypkg.",
        GRAPHMEND_CACHE_DIR=str(tmp_path / "a_file"),
    )
    assert status == 1
    assert "PROBLEM: GRAPHMEND='maybe': use 1/true/yes/on" in out
    assert "PROBLEM: GRAPHMEND_CUDA_GUARDS='bogus'" in out
    assert "PROBLEM: GRAPHMEND_PACKAGES='mypkg.': invalid module pattern" in out
    assert f"PROBLEM: {tmp_path / 'a_file'} is not a directory" in out
    # The other settings are still shown, with their sources.
    assert (
        "GRAPHMEND_REWRITES     from_python, predicate, trap, defer, continuation (default)" in out
    )
    assert out.endswith("status: 4 problem(s)\n")


def test_check_fails_when_graphmend_is_on_without_the_startup_file(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(site, "getsitepackages", lambda: [str(tmp_path)])
    monkeypatch.setattr(site, "ENABLE_USER_SITE", False)
    status, out = _check(monkeypatch, capsys, GRAPHMEND="1")
    assert status == 1
    assert f"PROBLEM: not in a site-packages directory of this interpreter ({tmp_path})" in out
    status, out = _check(monkeypatch, capsys, GRAPHMEND="0")
    assert status == 0


def test_check_fails_when_graphmend_is_on_but_this_process_has_no_hook(monkeypatch, capsys):
    status, out = _check(monkeypatch, capsys, GRAPHMEND="1")
    assert status == 1
    assert "PROBLEM: hook not installed although GRAPHMEND is on" in out
    graphmend.install()
    status, out = _check(monkeypatch, capsys, GRAPHMEND="1")
    assert status == 0


def test_check_reports_the_cache_off(monkeypatch, capsys, cache_dir):
    status, out = _check(monkeypatch, capsys, GRAPHMEND_CACHE="0")
    assert status == 0
    assert f"{cache_dir} (not used: GRAPHMEND_CACHE is off)" in out


@pytest.mark.parametrize(
    ("version", "specifier", "holds"),
    [
        ("2.13.0+cpu", ">=2.5", True),
        ("2.5.1", ">=2.5", True),
        ("2.4.1", ">=2.5", False),
        ("2.6.0a0+git123", ">=2.5,<2.6", False),
        ("2.5.0", ">=2.5,<2.6", True),
    ],
)
def test_torch_version_requirement(version, specifier, holds):
    assert satisfies(version, specifier) is holds


@pytest.fixture
def homeless(monkeypatch):
    """No home directory, as in a container run with a user id the system does not know."""
    for variable in ("HOME", "XDG_CACHE_HOME", "LOCALAPPDATA"):
        monkeypatch.delenv(variable, raising=False)

    def no_home(cls=None):
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(Path, "home", classmethod(no_home))
    expanduser = Path.expanduser
    monkeypatch.setattr(
        Path, "expanduser", lambda self: no_home() if str(self)[:1] == "~" else expanduser(self)
    )


@pytest.mark.skipif(sys.platform in ("win32", "darwin"), reason="XDG_CACHE_HOME is for Linux")
def test_a_relative_xdg_cache_home_is_ignored():
    # The XDG Base Directory specification: a relative path is invalid, to be ignored.
    expected = Path.home() / ".cache" / "graphmend"
    assert config.default_cache_dir({"XDG_CACHE_HOME": "relative"}) == expected
    assert config.default_cache_dir({"XDG_CACHE_HOME": "/abs"}) == Path("/abs/graphmend")


def test_no_home_directory_never_keeps_the_hook_out(homeless, monkeypatch, tmp_path):
    monkeypatch.setenv("GRAPHMEND_CACHE_DIR", str(tmp_path / "cache"))
    assert graphmend.install(["mypkg"]).config.cache_dir == tmp_path / "cache"
    monkeypatch.delenv("GRAPHMEND_CACHE_DIR")
    directory = graphmend.install(["mypkg"]).config.cache_dir
    assert directory.name.startswith("graphmend-") and directory.parent == Path(
        tempfile.gettempdir()
    )
    monkeypatch.setenv("GRAPHMEND_CACHE_DIR", "~/cache")
    with pytest.raises(ConfigError, match=r"GRAPHMEND_CACHE_DIR='~/cache': '~' cannot be expanded"):
        Config.from_env()


def test_a_cache_dir_holding_a_nul_is_a_config_error():
    # accepted, it failed every claimed import with os.lstat's ValueError
    with pytest.raises(
        ConfigError, match=r"cache_dir='/tmp/cache\\x00x': a path cannot hold a NUL"
    ):
        graphmend.install(["mypkg"], cache_dir="/tmp/cache\0x")


def test_a_cache_dir_argument_without_a_home_is_a_config_error(homeless):
    # It was the RuntimeError of Path.expanduser, where the same value in
    # GRAPHMEND_CACHE_DIR is a ConfigError that names it.
    with pytest.raises(ConfigError, match=r"cache_dir='~/cache': '~' cannot be expanded"):
        graphmend.install(["mypkg"], cache_dir="~/cache")
    assert graphmend.activation.current() is None
