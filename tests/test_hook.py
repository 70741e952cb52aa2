"""The import hook: what it claims, and that claimed modules keep their identity."""

from __future__ import annotations

import functools
import gc
import importlib
import importlib.machinery
import importlib.resources
import importlib.util
import inspect
import os
import pickle
import py_compile
import sys
import threading
import traceback
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path
from types import FrameType, ModuleType

import pytest
import torch

import graphmend
from graphmend import pipeline
from graphmend.collector_pause import collector_paused
from graphmend.config import Config
from graphmend.importer import GraphMendFinder, GraphMendLoader
from graphmend.notices import GraphMendWarning
from graphmend.rewriter import ModuleRewriter, Status

MODULE = """
import torch

class Point:
    def __init__(self, x):
        self.x = x

def shout(x):
    print("value", x)
    return x

def fail(x):
    print("about to fail", x)
    raise RuntimeError("boom")
"""


def _install(*patterns: str, cache_dir: Path) -> graphmend.Installation:
    return graphmend.activation.install_config(Config(packages=patterns, cache_dir=cache_dir))


def test_claimed_module_keeps_its_identity(write_module, cache_dir, capsys):
    name = write_module(MODULE)
    _install(name, cache_dir=cache_dir)
    module = importlib.import_module(name)
    assert isinstance(module.__loader__, GraphMendLoader)
    assert module.__spec__.loader is module.__loader__
    assert module.__spec__.origin == module.__file__
    assert module.__file__.endswith(f"{name}.py")
    # inspect reads the original source from disk.
    assert inspect.getsource(module.shout).splitlines()[1] == '    print("value", x)'
    # Classes pickle by reference to the module.
    point = pickle.loads(pickle.dumps(module.Point(3)))
    assert type(point) is module.Point and point.x == 3
    # Tracebacks carry the original line numbers.
    with pytest.raises(RuntimeError) as raised:
        module.fail(1)
    frame = traceback.extract_tb(raised.value.__traceback__)[-1]
    assert (frame.lineno, frame.line) == (14, 'raise RuntimeError("boom")')
    capsys.readouterr()


def test_debug_log_without_stderr_never_breaks_an_import(write_module, cache_dir, monkeypatch):
    # Python sets sys.stderr to None when started with file descriptor 2 closed (2>&-).
    name = write_module(MODULE)
    graphmend.activation.install_config(Config(packages=(name,), cache_dir=cache_dir, debug=True))
    monkeypatch.setattr(sys, "stderr", None)
    assert isinstance(importlib.import_module(name).__loader__, GraphMendLoader)


def test_reload_goes_through_the_hook_again(write_module, cache_dir):
    name = write_module(MODULE)
    _install(name, cache_dir=cache_dir)
    module = importlib.import_module(name)
    reloaded = importlib.reload(module)
    assert reloaded is module
    assert isinstance(reloaded.__loader__, GraphMendLoader)


BEFORE_THE_EDIT = """
import torch

def step(x):
    y = x * 2
    print("step", y.shape)
    return y + 1
"""

#: The module edited: a function whose output is deferred first, then step as it was.
AFTER_THE_EDIT = """
import torch

def helper(x):
    y = x + 1
    print("helper", y.dtype)
    return y

def step(x):
    y = x * 2
    print("step", y.shape)
    return y + 1
"""


def test_code_from_before_a_reload_defers_its_own_output(write_module, cache_dir, capsys):
    # The generated functions are module globals, numbered in order: compiled after
    # the reload, step as imported before the edit (a method of a model made then)
    # called the new version's function of its number, helper's, and printed
    # "helper torch.Size([2])".
    name = write_module(BEFORE_THE_EDIT)
    _install(name, cache_dir=cache_dir)
    module = importlib.import_module(name)
    step = module.step
    write_module(AFTER_THE_EDIT, name=name)
    importlib.reload(module)
    torch._dynamo.reset()
    assert torch.equal(torch.compile(step, backend="eager")(torch.ones(2)), torch.full((2,), 3.0))
    assert capsys.readouterr().out == "step torch.Size([2])\n"


def _load_module_as_transformers_4_40_does(name: str, path: Path) -> ModuleType:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # load_module is deprecated
        return importlib.machinery.SourceFileLoader(name, str(path)).load_module()


def test_uninstall_keeps_another_librarys_wrapper_of_what_graphmend_wraps(
    tmp_path, cache_dir, monkeypatch
):
    # functools.wraps copied the mark GraphMend put on its wrapper into the other
    # library's: uninstall took that one for GraphMend's and put the original back
    path = tmp_path / "plugin.py"
    path.write_text(MODULE)
    name = f"gm_plugin_{os.getpid()}"
    monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setattr(
        importlib.util, "spec_from_file_location", importlib.util.spec_from_file_location
    )
    _install(name, cache_dir=cache_dir)
    seen = []
    inner = importlib.util.spec_from_file_location

    @functools.wraps(inner)
    def audited(*args, **kwargs):
        seen.append(args[0])
        return inner(*args, **kwargs)

    importlib.util.spec_from_file_location = audited
    graphmend.uninstall()
    assert importlib.util.spec_from_file_location is audited
    spec = importlib.util.spec_from_file_location(name, path)
    assert type(spec.loader) is importlib.machinery.SourceFileLoader and seen == [name]
    _install(name, cache_dir=cache_dir)  # again: GraphMend's wrapper inside is used
    assert importlib.util.spec_from_file_location is audited
    assert isinstance(importlib.util.spec_from_file_location(name, path).loader, GraphMendLoader)


def test_a_module_loaded_with_source_file_loader_load_module_is_claimed(
    tmp_path, cache_dir, monkeypatch
):
    # transformers 4.40 loads trust_remote_code modules with
    # SourceFileLoader(name, path).load_module(), which consults neither
    # sys.meta_path nor importlib.util.spec_from_file_location.
    path = tmp_path / "remote_model.py"
    path.write_text(MODULE)
    claimed, unclaimed, later = (f"gm_remote_{os.getpid()}_{arm}" for arm in ("a", "b", "c"))
    for name in (claimed, unclaimed, later):
        monkeypatch.delitem(sys.modules, name, raising=False)
    _install(claimed, later, cache_dir=cache_dir)
    module = _load_module_as_transformers_4_40_does(claimed, path)
    assert isinstance(module.__loader__, GraphMendLoader)
    assert module.__spec__.loader is module.__loader__ and sys.modules[claimed] is module
    assert hasattr(module, "_@gm_rt")
    assert module.shout(3) == 3
    plain = _load_module_as_transformers_4_40_does(unclaimed, path)
    assert type(plain.__loader__) is importlib.machinery.SourceFileLoader
    graphmend.uninstall()
    assert "load_module" not in vars(importlib.machinery.SourceFileLoader)
    after = _load_module_as_transformers_4_40_does(later, path)
    assert type(after.__loader__) is importlib.machinery.SourceFileLoader


def test_a_spec_whose_given_loader_names_another_file_runs_that_file(tmp_path, cache_dir):
    # spec_from_file_location(name, a.py, loader=SourceFileLoader(name, b.py)): Python runs
    # b.py, the loader's file; the claimed spec had GraphMend's loader run a.py instead.
    spec_file, loader_file = tmp_path / "a.py", tmp_path / "b.py"
    spec_file.write_text("WHO = 'a'\n")
    loader_file.write_text("WHO = 'b'\n")
    name = f"gm_given_loader_{os.getpid()}"
    _install(name, cache_dir=cache_dir)
    loader = importlib.machinery.SourceFileLoader(name, str(loader_file))
    spec = importlib.util.spec_from_file_location(name, str(spec_file), loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.WHO == "b"
    assert spec.loader is loader


def test_installing_again_puts_back_a_hook_taken_out_of_meta_path(
    write_module, cache_dir, monkeypatch
):
    # A harness that restores sys.meta_path drops the finder; install() with the same
    # settings returned the installation as it was, claiming nothing.
    name = write_module(MODULE)
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    saved = list(sys.meta_path)
    _install(name, cache_dir=cache_dir)
    sys.meta_path[:] = saved
    installation = _install(name, cache_dir=cache_dir)
    assert installation.active and sys.meta_path.count(installation.finder) == 1
    assert isinstance(importlib.import_module(name).__loader__, GraphMendLoader)


def test_resources_of_a_claimed_package(tmp_path, monkeypatch, cache_dir):
    package = tmp_path / "pkgs" / "gm_resources_pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("import torch\n")
    (package / "data.txt").write_text("payload")
    monkeypatch.syspath_prepend(str(package.parent))
    _install("gm_resources_pkg", cache_dir=cache_dir)
    module = importlib.import_module("gm_resources_pkg")
    assert isinstance(module.__loader__, GraphMendLoader)
    assert importlib.resources.files(module).joinpath("data.txt").read_text() == "payload"
    sys.modules.pop("gm_resources_pkg")


def test_unclaimed_names_namespace_packages_and_extensions_are_left_alone(
    tmp_path, monkeypatch, write_module, cache_dir
):
    name = write_module(MODULE)
    namespace = tmp_path / "ns" / "gm_namespace_pkg"
    namespace.mkdir(parents=True)
    (namespace / "inner.py").write_text("import torch\nVALUE = 1\n")
    monkeypatch.syspath_prepend(str(namespace.parent))
    # The standard library is never claimed; a third-party extension stands in for it.
    _install("gm_namespace_pkg", "safetensors._safetensors_rust", cache_dir=cache_dir)
    assert not isinstance(importlib.import_module(name).__loader__, GraphMendLoader)
    package = importlib.import_module("gm_namespace_pkg")
    assert not isinstance(package.__loader__, GraphMendLoader)
    inner = importlib.import_module("gm_namespace_pkg.inner")
    assert isinstance(inner.__loader__, GraphMendLoader)
    finder = next(entry for entry in sys.meta_path if isinstance(entry, GraphMendFinder))
    safetensors = importlib.import_module("safetensors")
    extension = "safetensors._safetensors_rust"
    assert finder.matcher.matches(extension)
    assert finder.find_spec(extension, safetensors.__path__) is None  # not source


@pytest.mark.parametrize(
    "source",
    [
        "import torch\ndef f(:\n    pass\n",
        # errors the compiler finds, not the parser: GraphMend warned that it could not
        # rewrite the module and imported it unchanged, then the import failed
        "import torch\nreturn 5\n",
        "import torch\ndef f():\n    nonlocal x\n",
        "import torch\ndef f():\n    x = 1\n    global x\n",
    ],
    ids=["parser", "return-outside-function", "nonlocal-unbound", "global-after-use"],
)
def test_syntax_error_is_exactly_the_one_python_raises(write_module, cache_dir, source):
    plain = write_module(source)
    claimed = write_module(source)
    with pytest.raises(SyntaxError) as expected:
        importlib.import_module(plain)
    _install(claimed, cache_dir=cache_dir)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(SyntaxError) as raised:
            importlib.import_module(claimed)
    assert [str(warning.message) for warning in caught] == []  # no GraphMend warning either
    assert type(raised.value) is type(expected.value)
    assert (raised.value.msg, raised.value.lineno, raised.value.offset, raised.value.text) == (
        expected.value.msg,
        expected.value.lineno,
        expected.value.offset,
        expected.value.text,
    )
    assert raised.value.filename.endswith(f"{claimed}.py")


@pytest.mark.xfail(
    strict=True,
    reason="Python's import drops its own frames from a syntax error's traceback only "
    "where they run up to _call_with_frames_removed unbroken (import.c, "
    "remove_importlib_frames); GraphMendLoader.get_code, which compiles the source "
    "Python's way when it falls back, sits between them, so the traceback keeps "
    "_find_and_load ... exec_module and importer.py's get_code: the same error and "
    "lines, five more frames",
)
def test_a_syntax_errors_traceback_has_the_frames_python_shows(write_module, cache_dir):
    source = "import torch\ndef f(:\n    pass\n"
    plain, claimed = write_module(source), write_module(source)

    def frames(name: str) -> list[str]:
        with pytest.raises(SyntaxError) as raised:
            exec(f"import {name}", {})  # an import statement, as a program imports
        return [frame.name for frame in traceback.extract_tb(raised.value.__traceback__)]

    expected = frames(plain)
    _install(claimed, cache_dir=cache_dir)
    assert frames(claimed) == expected


def test_non_utf8_source_with_a_coding_cookie(write_module, cache_dir, capsys):
    source = (
        "# -*- coding: latin-1 -*-\n"
        "import torch\n\n"
        "def greet(x):\n"
        '    print("café", x)\n'
        '    return "café"\n'
    )
    name = write_module(source, encoding="latin-1")
    installation = _install(name, cache_dir=cache_dir)
    module = importlib.import_module(name)
    assert module.greet(1) == "café"
    assert capsys.readouterr().out == "café 1\n"
    assert installation.finder.rewriter.build(
        name, module.__file__, Path(module.__file__).read_bytes()
    ).summary == {"defer": {"rewritten": 1}}


@pytest.mark.parametrize("step", ["parse", "rewrite"])
def test_a_module_the_rewrite_cannot_handle_loads_unchanged_with_one_warning(
    write_module, cache_dir, monkeypatch, capsys, step
):
    # A long chain such as `1 + 1 + ... + 1` (about 2960 terms on Python 3.11) compiles,
    # but parsing it to an AST a few frames deeper, in the hook, hits the recursion limit.
    name = write_module(MODULE)

    def broken(*args, **kwargs):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(f"graphmend.pipeline.{step}", broken)
    _install(name, cache_dir=cache_dir)
    with pytest.warns(
        GraphMendWarning, match=rf"could not rewrite {name} \((parsing failed: )?RecursionError"
    ) as caught:
        module = importlib.import_module(name)
    assert len(caught) == 1
    assert module.shout(2) == 2  # the original code runs
    assert capsys.readouterr().out == "value 2\n"


def test_warnings_made_errors_never_fail_the_import(write_module, cache_dir, monkeypatch, capsys):
    # python -W error, pytest's filterwarnings = error: GraphMend's own warning about
    # the import must not become the import's exception.
    name = write_module(MODULE)

    def broken(*args, **kwargs):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr("graphmend.pipeline.rewrite", broken)
    _install(name, cache_dir=cache_dir)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        module = importlib.import_module(name)
    assert module.shout(2) == 2
    captured = capsys.readouterr()
    assert captured.out == "value 2\n"
    assert f"graphmend could not rewrite {name} (RecursionError" in captured.err


# A compiler warning in a branch that the rewrites copy into generated functions.
COMPILER_WARNING = """
import torch

def pick(x, k):
    if x.sum() > 0:
        y = x * 2 if k is 1 else x
    else:
        y = x - 1
    return y
"""


def _literal_is_warning() -> str:
    """This Python's wording of its warning for ``k is 1`` (3.12 names the literal's type)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compile("k is 1", "<probe>", "eval")
    return str(caught[0].message)


def _compiler_warnings(name: str) -> list[tuple[type[Warning], str, int]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        importlib.import_module(name)
    return [(w.category, str(w.message), w.lineno) for w in caught]


def test_a_compiler_warning_is_issued_once_as_python_issues_it(write_module, cache_dir, capsys):
    plain = write_module(COMPILER_WARNING)
    claimed = write_module(COMPILER_WARNING)
    expected = _compiler_warnings(plain)
    _install(claimed, cache_dir=cache_dir)
    assert _compiler_warnings(claimed) == expected == [(SyntaxWarning, _literal_is_warning(), 6)]
    assert "_@gm_rt" in vars(sys.modules[claimed])
    assert capsys.readouterr().err == ""


def _warnings_of_each_import(name: str, times: int) -> list[int]:
    """How many warnings each of ``times`` fresh imports of ``name`` issues."""
    counts = []
    for _ in range(times):
        sys.modules.pop(name, None)
        counts.append(len(_compiler_warnings(name)))
    return counts


@pytest.mark.parametrize("pyc", ["never written", "valid"])
def test_compiler_warnings_are_issued_when_python_compiles_the_source(
    write_module, cache_dir, monkeypatch, pyc
):
    # Python issues them when it compiles the source: on every import where it writes
    # no .pyc (PYTHONDONTWRITEBYTECODE, a read-only __pycache__), never where a valid
    # .pyc exists (pip compiles one at install). GraphMend issued them on a cold
    # import only, whatever the .pyc: once where Python warns every time, and where
    # Python is silent.
    monkeypatch.setattr(sys, "dont_write_bytecode", pyc == "never written")
    plain = write_module(COMPILER_WARNING)
    claimed = write_module(COMPILER_WARNING)
    if pyc == "valid":
        for name in (plain, claimed):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                py_compile.compile(importlib.util.find_spec(name).origin, doraise=True)
    expected = _warnings_of_each_import(plain, 2)
    assert expected == ([1, 1] if pyc == "never written" else [0, 0])
    _install(claimed, cache_dir=cache_dir)
    assert _warnings_of_each_import(claimed, 2) == expected  # cold, then from the cache
    assert isinstance(sys.modules[claimed].__loader__, GraphMendLoader)
    assert "_@gm_rt" in vars(sys.modules[claimed])


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="Python 3.12 left find_module out")
def test_a_module_a_finder_with_find_module_alone_serves_is_that_finders(
    write_module, cache_dir, monkeypatch
):
    # Python 3.11 still asks such a finder (PEP 302) in its turn; GraphMend, first on
    # sys.meta_path, asked only the finders with find_spec, and the file on disk was
    # imported in place of what that finder gives
    name = write_module("WHO = 'the file on disk'\n")

    class LegacyFinder:
        def find_module(self, fullname, path=None):
            return self if fullname == name else None

        def load_module(self, fullname):
            module = sys.modules.setdefault(fullname, ModuleType(fullname))
            module.__loader__ = self
            module.WHO = "the legacy finder"
            return module

    monkeypatch.setattr(sys, "meta_path", [LegacyFinder(), *sys.meta_path])
    _install(name, cache_dir=cache_dir)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ImportWarning)
        assert importlib.import_module(name).WHO == "the legacy finder"


@pytest.mark.parametrize("line", [1, 3])
def test_a_byte_its_encoding_cannot_decode_in_a_comment_is_no_fallback(
    write_module, cache_dir, line
):
    # Python imports it (the compiler skips comments); the rewrite decoded the text and
    # fell back with a warning on every import
    lines = [b"import torch", b"def f(x):", b"    print('x', x)", b"    return x"]
    lines.insert(line - 1, b"# caf\xe9")
    name = write_module("")
    Path(importlib.util.find_spec(name).origin).write_bytes(b"\n".join(lines) + b"\n")
    _install(name, cache_dir=cache_dir)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no GraphMendWarning
        module = importlib.import_module(name)
    assert isinstance(module.__loader__, GraphMendLoader) and hasattr(module, "_@gm_rt")


def test_a_claimed_module_another_loader_serves_gets_a_debug_line(
    tmp_path, cache_dir, monkeypatch, capsys
):
    # typeguard's and beartype's import hooks, or a zip archive: Python's machinery
    # loads the module, which GRAPHMEND_LOG=debug did not say
    name = f"gm_zipped_{os.getpid()}"
    archive = tmp_path / "modules.zip"
    with zipfile.ZipFile(archive, "w") as written:
        written.writestr(f"{name}.py", MODULE)
    monkeypatch.syspath_prepend(str(archive))
    config = Config(packages=(name,), cache_dir=cache_dir, debug=True)
    graphmend.activation.install_config(config)
    module = importlib.import_module(name)
    assert not isinstance(module.__loader__, GraphMendLoader)
    assert capsys.readouterr().err == (
        f"graphmend: {name}: left alone: its loader (zipimport.zipimporter) does not load "
        f"{archive / name}.py as Python's source loader; loaded as Python would\n"
    )


def test_a_cold_rewrite_reports_its_time(write_module, cache_dir):
    # GRAPHMEND_LOG=debug: "rewritten (...) in 12.3 ms"
    name = write_module(COMPILER_WARNING)
    path = importlib.util.find_spec(name).origin
    rewriter = ModuleRewriter(Config(packages=(name,), cache_dir=cache_dir))
    outcome = rewriter.build(name, path, Path(path).read_bytes())
    assert (outcome.status, outcome.reason, outcome.warns) == (Status.REWRITTEN, "", True)
    assert outcome.seconds > 0


def _nudge() -> None:
    warnings.warn("shown once", UserWarning, stacklevel=1)


def test_a_cold_import_leaves_the_record_of_warnings_shown_as_it_was(write_module, cache_dir):
    # The "default" action shows a warning once per place; a cold import must not make
    # Python forget that it was shown.  A first claimed import loads what rewritten code
    # imports (sympy's import adds a filter, which makes Python forget it too).
    first, name = write_module(COMPILER_WARNING), write_module(COMPILER_WARNING)
    _install(first, name, cache_dir=cache_dir)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        importlib.import_module(first)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        _nudge()
        importlib.import_module(name)
        _nudge()
    assert [str(w.message) for w in caught] == ["shown once", _literal_is_warning()]


def test_a_cold_rewrite_leaves_other_threads_warnings_alone():
    # While a claimed module compiles, another thread's warning meets the filters in
    # force, and a catch_warnings block that thread enters meanwhile and leaves after
    # puts back the filters and showwarning in force.  GraphMend swapped both for every
    # thread: the warning was held, then swallowed under "error", and the block put
    # back the swapped ones, which dropped every later warning of the process.
    raised = []
    block = warnings.catch_warnings()

    def elsewhere() -> None:
        try:
            warnings.warn_explicit("in another thread", UserWarning, "other.py", 8)
        except UserWarning:
            raised.append("raised")
        block.__enter__()

    def step() -> str:
        warnings.warn_explicit("about mine", SyntaxWarning, "mine.py", 3)
        thread = threading.Thread(target=elsewhere)
        thread.start()
        thread.join()
        return "compiled"

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        filters, shown, entries = warnings.filters, warnings.showwarning, list(warnings.filters)
        assert pipeline._quietly(step, "mine.py") == ("compiled", True)
        block.__exit__(None, None, None)
        assert (warnings.filters, warnings.showwarning) == (filters, shown)
        assert warnings.filters == entries
    assert raised == ["raised"]


def test_the_filter_for_a_claimed_file_leaves_no_copy_behind():
    # a catch_warnings block entered while the filter is in place (by another thread)
    # copies it; it stayed in force there, and Python's own compile of the file, after a
    # warned rewrite, raised SyntaxError for its warning: the import failed
    def for_mine() -> list[tuple]:
        return [entry for entry in warnings.filters if "mine" in getattr(entry[3], "pattern", "")]

    block = warnings.catch_warnings()
    with pipeline._warnings_about("mine.py", "error"):
        block.__enter__()
    try:
        assert for_mine() == []
    finally:
        block.__exit__(None, None, None)
    assert for_mine() == []


def test_a_compiler_warning_made_an_error_is_pythons_syntax_error(write_module, cache_dir, capsys):
    plain = write_module(COMPILER_WARNING)
    claimed = write_module(COMPILER_WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(SyntaxError) as expected:
            importlib.import_module(plain)
        _install(claimed, cache_dir=cache_dir)
        with pytest.raises(SyntaxError) as raised:
            importlib.import_module(claimed)
    assert (raised.value.msg, raised.value.lineno, raised.value.text) == (
        expected.value.msg,
        expected.value.lineno,
        expected.value.text,
    )
    assert capsys.readouterr().err == ""  # no "graphmend could not rewrite"


@pytest.mark.parametrize("collecting", [True, False])
@pytest.mark.parametrize("fails", [False, True])
def test_the_garbage_collector_is_paused_while_rewriting_and_restored(
    write_module, cache_dir, monkeypatch, collecting, fails
):
    name = write_module(MODULE)
    seen = []
    original = pipeline.rewrite

    def observed(*args, **kwargs):
        seen.append(gc.get_threshold()[0])
        if fails:
            raise RecursionError("maximum recursion depth exceeded")
        return original(*args, **kwargs)

    monkeypatch.setattr("graphmend.pipeline.rewrite", observed)
    installation = _install(name, cache_dir=cache_dir)
    path = Path(importlib.util.find_spec(name).origin)
    thresholds = gc.get_threshold()
    (gc.enable if collecting else gc.disable)()
    try:
        outcome = installation.finder.rewriter.build(name, str(path), path.read_bytes())
        assert (seen, gc.isenabled(), gc.get_threshold()) == ([0], collecting, thresholds)
    finally:
        gc.enable()
    assert outcome.status is (Status.FELL_BACK if fails else Status.REWRITTEN)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
def test_a_child_forked_during_a_rewrite_collects_garbage():
    # the pause is the process's: a child forked while another thread rewrote (a
    # DataLoader worker) kept the collector off for good
    reading, writing = os.pipe()
    thresholds = gc.get_threshold()
    with collector_paused():
        assert gc.get_threshold()[0] == 0
        child = os.fork()
        if child == 0:
            os.write(writing, b"1" if gc.get_threshold() == thresholds else b"0")
            os._exit(0)
    os.waitpid(child, 0)
    assert os.read(reading, 1) == b"1"
    assert gc.get_threshold() == thresholds


def test_the_programs_switch_of_the_collector_stays_the_programs():
    # the pause was gc.disable(): another thread's gc.isenabled() read False during a
    # rewrite, and its gc.disable() then was undone when the rewrite ended
    assert gc.isenabled()
    thresholds = gc.get_threshold()
    try:
        with collector_paused():
            assert gc.isenabled()
            gc.disable()  # another thread's, while a module is rewritten
        assert (gc.isenabled(), gc.get_threshold()) == (False, thresholds)
        with collector_paused():
            gc.set_threshold(500, 20, 20)  # thresholds another thread set meanwhile
        assert gc.get_threshold() == (500, 20, 20)
    finally:
        gc.enable()
        gc.set_threshold(*thresholds)


def test_pytest_assertion_rewriting_and_graphmend_work_in_one_process(write_module, cache_dir):
    # This module was rewritten by pytest's own meta-path hook; a GraphMend hook
    # installed in the same process claims its own modules and leaves pytest's.
    _install(write_module(MODULE), cache_dir=cache_dir)
    hook_types = {type(finder).__name__ for finder in sys.meta_path}
    assert {"AssertionRewritingHook", "GraphMendFinder"} <= hook_types
    value = [1, 2]
    with pytest.raises(AssertionError) as raised:
        assert value == [1, 3]
    assert "[1, 2] == [1, 3]" in str(raised.value)  # pytest's rewritten message


def test_compiled_claimed_module_runs_as_one_graph(write_module, cache_dir, capsys):
    from helpers.graphs import compile_and_run

    name = write_module(MODULE)
    _install(name, cache_dir=cache_dir)
    module = importlib.import_module(name)
    compiled = compile_and_run(module.shout, torch.ones(2), fullgraph=True)
    assert compiled.graphs == 1
    assert capsys.readouterr().out == "value tensor([1., 1.])\n"


WITHOUT_TORCH = """
import logging

logger = logging.getLogger("gm_config")


class Config:
    return_dict = True

    @property
    def use_return_dict(self):
        logger.warning("use_return_dict is deprecated")
        return self.return_dict


def scale(x, config):
    return x * 2 if config.use_return_dict else x
"""


def test_a_module_without_torch_is_rewritten_for_the_torch_code_that_calls_it(
    write_module, cache_dir, caplog
):
    # A configuration read in forward (transformers 5.x warns on `config.use_return_dict`):
    # the module never imports torch, but its code is traced when torch code calls it.
    from helpers.graphs import compile_and_run

    plain = importlib.import_module(write_module(WITHOUT_TORCH))
    with pytest.raises(torch._dynamo.exc.Unsupported):
        compile_and_run(plain.scale, torch.ones(2), plain.Config(), fullgraph=True)
    name = write_module(WITHOUT_TORCH)
    _install(name, cache_dir=cache_dir)
    module = importlib.import_module(name)
    caplog.clear()
    compiled = compile_and_run(module.scale, torch.ones(2), module.Config(), fullgraph=True)
    assert compiled.graphs == 1
    assert torch.equal(compiled.result, torch.full((2,), 2.0))
    assert [record.getMessage() for record in caplog.records] == ["use_return_dict is deprecated"]


DEFERRED_AT_MODULE_LEVEL = '''
"""A module whose output calls are deferred: their functions are defined at import."""
import logging
import torch

logger = logging.getLogger(__name__)


def step(x):
    print("step", x.shape)
    logger.warning("step")
    return x + 1
'''


def _lines_run(import_module: Callable[[], object], name: str) -> list[int]:
    """The lines of ``name``'s file that the tracer (coverage.py, pdb) sees run while
    ``import_module`` runs, in order."""
    lines: list[int] = []

    def tracer(frame: FrameType, event: str, arg: object) -> object:
        if frame.f_code.co_filename.endswith(f"{name}.py"):
            if event == "line":
                lines.append(frame.f_lineno)
            return tracer
        return None

    sys.settrace(tracer)
    try:
        import_module()
    finally:
        sys.settrace(None)
    return lines


@pytest.mark.parametrize("source", [DEFERRED_AT_MODULE_LEVEL, WITHOUT_TORCH])
def test_importing_a_rewritten_module_runs_only_the_lines_python_runs(
    write_module, cache_dir, source
):
    # The generated definitions lay on the lines of the calls they defer: coverage.py
    # counted those lines run by the import, and pdb stepped onto them.
    plain = write_module(source)
    expected = _lines_run(lambda: importlib.import_module(plain), plain)
    name = write_module(source)
    _install(name, cache_dir=cache_dir)
    assert set(_lines_run(lambda: importlib.import_module(name), name)) == set(expected)
    if source is DEFERRED_AT_MODULE_LEVEL:  # ordered too where the module imports torch
        del sys.modules[name]
        assert _lines_run(lambda: importlib.import_module(name), name) == expected


LATE_TORCH = """
import logging
import sys

import graphmend

logging.basicConfig(format="%(message)s", stream=sys.stdout)
graphmend.install([{name!r}])
import {name} as module

print("torch imported:", "torch" in sys.modules)
print("eager", module.Config().use_return_dict)
import importlib.util

importlib.util.find_spec("torch")  # as transformers' is_torch_available: no import yet
import torch

graphs = []


def count(graph, example_inputs):
    graphs.append(graph)
    return graph.forward


compiled = torch.compile(module.scale, backend=count, fullgraph=True)
print("compiled", compiled(torch.ones(2), module.Config()).tolist(), "graphs", len(graphs))
"""


def test_a_module_without_torch_does_not_import_it_and_binds_it_once_imported(
    write_module, cache_dir, tmp_path
):
    from helpers.processes import run_python

    name = write_module(WITHOUT_TORCH)
    script = LATE_TORCH.format(name=name)
    path = os.pathsep.join([str(tmp_path / "modules"), *sys.path])
    env = {"GRAPHMEND_CACHE_DIR": str(cache_dir), "PYTHONPATH": path}
    expected = [
        "torch imported: False",
        "use_return_dict is deprecated",
        "eager True",
        "use_return_dict is deprecated",  # run after the graph, by the compiled call
        "compiled [2.0, 2.0] graphs 1",
    ]
    for _ in ("rewritten", "from the cache"):
        completed = run_python("-c", script, env=env, timeout=300)
        assert completed.returncode == 0, completed.stderr[-3000:]
        assert completed.stdout.splitlines() == expected


# importlib's LazyLoader runs a module at its first attribute access: torch's own import
# makes one (inspect.getmodule looks at every module's __file__), so the module runs while
# torch is half imported, where GraphMend's runtime cannot be imported yet.
LAZY_BEFORE_TORCH = """
import importlib.util, sys
spec = importlib.util.find_spec({name!r})
spec.loader = importlib.util.LazyLoader(spec.loader)
module = importlib.util.module_from_spec(spec)
sys.modules[{name!r}] = module
spec.loader.exec_module(module)
import torch
print(module.shout(3))
"""


def test_a_module_run_while_torch_is_being_imported_loads_as_python_would(
    write_module, cache_dir, tmp_path
):
    from helpers.processes import python_path, run_python

    name = write_module(MODULE)
    env = {
        "GRAPHMEND": "1",
        "GRAPHMEND_PACKAGES": name,
        "GRAPHMEND_CACHE_DIR": str(cache_dir),
        "GRAPHMEND_LOG": "debug",
        "PYTHONPATH": python_path(tmp_path / "modules"),
    }
    result = run_python("-c", LAZY_BEFORE_TORCH.format(name=name), env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == ["value 3", "3"]
    assert f"graphmend: {name}: torch is being imported; loaded as Python would" in result.stderr


def test_torch_being_imported_by_another_thread_leaves_this_threads_modules_rewritten(
    write_module, cache_dir, monkeypatch
):
    # Only torch's own import (its module code on this thread's stack) keeps a module as it
    # is: a thread that imports a model while another imports torch waits for torch.
    monkeypatch.setattr(torch.__spec__, "_initializing", True, raising=False)
    name = write_module(MODULE)
    _install(name, cache_dir=cache_dir)
    module = importlib.import_module(name)
    assert hasattr(module, "_@gm_rt")


def test_the_runtime_imports_nothing_that_torch_does_not():
    """What a rewritten module imports, GraphMend's runtime, brings in no module that
    torch does not: it imported sympy (and ``fractions``, ``decimal``, mpmath), a quarter
    of a second for every program, and a user's ``fractions.py`` beside the script was
    taken for the standard one, an ``ImportError`` where plain Python ran (found by
    helper audit_cli)."""
    from helpers.processes import python_path, run_python

    probe = (
        "import sys, torch\n"
        "before = set(sys.modules)\n"
        "import graphmend.runtime\n"
        "print(sorted(m for m in set(sys.modules) - before if m.split('.')[0] != 'graphmend'))\n"
    )
    result = run_python("-c", probe, env={"PYTHONPATH": python_path()})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
