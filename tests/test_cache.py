"""The content-keyed bytecode cache: hits, corruption, trust, modes, read-only use, writers.

Attacks by another user (which need root) are in ``test_cache_security.py``.
"""

from __future__ import annotations

import errno
import json
import marshal
import os
import shutil
import stat
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import graphmend
from graphmend import GraphMendWarning
from graphmend import cache as cache_module
from graphmend.cache import (
    Access,
    BytecodeCache,
    fingerprint_still_holds,
    graphmend_fingerprint,
)
from graphmend.cli import main as cli_main
from graphmend.config import Config
from graphmend.rewriter import ModuleRewriter, Status
from helpers.processes import python_path, run_python

SOURCE = b"import torch\n\ndef f(x):\n    print('x is', x)\n    return x\n"


@pytest.fixture
def module_file(tmp_path: Path) -> Path:
    path = tmp_path / "src" / "cached_module.py"
    path.parent.mkdir()
    path.write_bytes(SOURCE)
    return path


def _build(cache_dir: Path, path: Path, **settings: object):
    rewriter = ModuleRewriter(Config(packages=("cached_module",), cache_dir=cache_dir, **settings))  # type: ignore[arg-type]
    return rewriter.build("cached_module", str(path), path.read_bytes())


def _entries(cache_dir: Path) -> list[Path]:
    return sorted(cache_dir.rglob("*.gmc"))


def test_second_build_is_a_hit_with_the_same_code(cache_dir, module_file):
    first = _build(cache_dir, module_file)
    second = _build(cache_dir, module_file)
    assert (first.status, second.status) == (Status.REWRITTEN, Status.CACHE_HIT)
    assert marshal.dumps(second.code) == marshal.dumps(first.code)
    assert second.summary == first.summary == {"defer": {"rewritten": 1}}


@pytest.mark.parametrize(
    "name",
    [
        # transformers_modules.<org>.<repo>.<commit>.<module>: longer than a file name
        ".".join(["transformers_modules", "org", "r" * 80, "c" * 40, "modeling_long"]),
        "plugins.a\0b",  # any string names a module (spec_from_file_location)
        "plugins/../../outside",
        "plugins.*",
    ],
)
def test_any_module_name_gets_an_entry_of_its_own_in_the_cache(cache_dir, module_file, name):
    # the name was the entry's file name as it is: too long for a file name it was
    # never cached (ENAMETOOLONG, silently), a NUL failed the import (ValueError)
    rewriter = ModuleRewriter(
        Config(packages=("plugins", "transformers_modules"), cache_dir=cache_dir)
    )
    outcomes = [rewriter.build(name, str(module_file), SOURCE).status for _ in range(2)]
    assert outcomes == [Status.REWRITTEN, Status.CACHE_HIT]
    (entry,) = _entries(cache_dir)
    assert entry.parent.parent == cache_dir and len(entry.name) < 120
    other = rewriter.build("plugins.other", str(module_file), SOURCE)
    assert other.status is Status.REWRITTEN and len(_entries(cache_dir)) == 2


def test_a_name_the_file_system_cannot_encode_breaks_no_import(tmp_path, cache_dir, module_file):
    # Under an ASCII locale a non-ASCII identifier (a trust_remote_code module's name) was
    # the entry's file name as it is: os.open raised UnicodeEncodeError out of the import.
    # A cache_dir the file system cannot name is refused at install(), as a NUL is.
    script = f"""
import importlib.util, graphmend
from graphmend.config import ConfigError
try:
    graphmend.install(["plugins"], cache_dir="/tmp/cach\\u00e8")
except ConfigError as error:
    print("refused:", error)
graphmend.install(["plugins"], cache_dir={str(cache_dir)!r})
for attempt in ("cold", "warm"):
    spec = importlib.util.spec_from_file_location("plugins.mod\\u00e8le", {str(module_file)!r})
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    print(attempt, type(spec.loader).__name__, module.f(1))
"""
    ascii_locale = {"LC_ALL": "C", "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0"}
    done = run_python("-c", script, env={**ascii_locale, "PYTHONIOENCODING": "utf-8"})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("refused: cache_dir='/tmp/cach") and "(ascii)" in lines[0]
    assert lines[1:] == ["x is 1", "cold GraphMendLoader 1", "x is 1", "warm GraphMendLoader 1"]
    (entry,) = _entries(cache_dir)
    assert entry.name.isascii()


def test_code_nested_too_deeply_to_marshal_is_built_but_not_stored(cache_dir, module_file):
    """``marshal`` refuses code nested this deeply: its ``ValueError`` escaped the import,
    which Python's own loader makes with no ``.pyc`` (``PYTHONDONTWRITEBYTECODE``, a
    script) (found by helper audit_cache)."""
    module_file.write_bytes(SOURCE + b"F = " + b"lambda: " * 1000 + b"0\n")
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(20000)  # for the parser and compile, as the user's program set it
    try:
        built = _build(cache_dir, module_file)
    finally:
        sys.setrecursionlimit(limit)
    assert built.status == Status.REWRITTEN
    assert _entries(cache_dir) == []


def test_key_follows_content_not_mtime(cache_dir, module_file):
    _build(cache_dir, module_file)
    os.utime(module_file, (1, 1))
    assert _build(cache_dir, module_file).status is Status.CACHE_HIT
    module_file.write_bytes(SOURCE + b"# edited\n")
    assert _build(cache_dir, module_file).status is Status.REWRITTEN


def test_key_covers_settings_and_path(cache_dir, module_file, tmp_path):
    _build(cache_dir, module_file)
    assert _build(cache_dir, module_file, rewrites=()).status is Status.UNCHANGED
    copy = tmp_path / "elsewhere" / "cached_module.py"
    copy.parent.mkdir()
    shutil.copy(module_file, copy)
    outcome = _build(cache_dir, copy)
    assert outcome.status is Status.REWRITTEN
    assert outcome.code.co_filename == str(copy)


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: data[:10],
        lambda data: data[: len(data) // 2],
        lambda data: b"XXXX" + data[4:],
        lambda data: data[:-5] + bytes(5),
        lambda data: b"",
    ],
    ids=["short-header", "truncated", "bad-magic", "flipped-payload", "empty"],
)
def test_corrupt_entry_is_ignored_and_rebuilt(cache_dir, module_file, damage):
    _build(cache_dir, module_file)
    (entry,) = _entries(cache_dir)
    entry.write_bytes(damage(entry.read_bytes()))
    assert _build(cache_dir, module_file).status is Status.REWRITTEN
    assert _build(cache_dir, module_file).status is Status.CACHE_HIT


def test_an_entry_replaces_those_of_earlier_versions_of_its_file(cache_dir, module_file, tmp_path):
    # One entry per file, settings and interpreter, as CPython keeps one .pyc per source:
    # an upgraded package does not leave its old entries behind for ever.
    elsewhere = tmp_path / "elsewhere" / "cached_module.py"  # the module in another venv
    elsewhere.parent.mkdir()
    elsewhere.write_bytes(SOURCE)
    _build(cache_dir, module_file)
    _build(cache_dir, elsewhere)
    _build(cache_dir, module_file, rewrites=("defer",))
    module_file.write_bytes(SOURCE + b"# edited\n")
    assert _build(cache_dir, module_file).status is Status.REWRITTEN
    assert len(_entries(cache_dir)) == 3  # the edited file's, elsewhere's, other settings'
    assert _build(cache_dir, elsewhere).status is Status.CACHE_HIT
    module_file.write_bytes(SOURCE)
    assert _build(cache_dir, module_file).status is Status.REWRITTEN  # its entry was removed


def test_two_releases_of_graphmend_keep_an_entry_each(cache_dir, module_file, monkeypatch):
    # trust_remote_code modules live in Hugging Face's cache, which every environment
    # shares: two environments with different GraphMend releases import the same file.
    def build_under(release: str):
        monkeypatch.setattr(graphmend, "__version__", release)
        graphmend_fingerprint.cache_clear()
        return _build(cache_dir, module_file).status

    try:
        assert build_under("1.0") is Status.REWRITTEN
        assert build_under("2.0") is Status.REWRITTEN
        assert (build_under("1.0"), build_under("2.0")) == (Status.CACHE_HIT, Status.CACHE_HIT)
        assert len(_entries(cache_dir)) == 2
    finally:
        monkeypatch.undo()
        graphmend_fingerprint.cache_clear()


@pytest.fixture
def graphmend_checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A copy of GraphMend's package, which the fingerprint reads instead of its own."""
    copy = tmp_path / "checkout" / "graphmend"
    shutil.copytree(Path(graphmend.__file__).parent, copy, ignore=shutil.ignore_patterns("*.pyc"))
    monkeypatch.setattr(graphmend, "__file__", str(copy / "__init__.py"))
    graphmend_fingerprint.cache_clear()
    fingerprint_still_holds.cache_clear()
    yield copy
    monkeypatch.undo()
    graphmend_fingerprint.cache_clear()
    fingerprint_still_holds.cache_clear()


def test_an_editors_lock_file_beside_graphmends_modules_breaks_no_import(
    cache_dir, module_file, graphmend_checkout
):
    # Emacs locks a file it edits with a dangling symbolic link ``.#name.py`` beside it:
    # in an editable checkout of GraphMend, hashing it failed every claimed import.
    before = graphmend_fingerprint()
    (graphmend_checkout / ".#cache.py").symlink_to("user@host.1234:1700000000")
    graphmend_fingerprint.cache_clear()
    assert graphmend_fingerprint() == before
    assert _build(cache_dir, module_file).status is Status.REWRITTEN
    assert len(_entries(cache_dir)) == 1


def test_code_rewritten_after_graphmend_changed_on_disk_is_not_stored(
    cache_dir, module_file, graphmend_checkout
):
    # A process keys its entries with the fingerprint read at its first claimed import
    # (a hit), and loads the rewrites at its first miss: after an upgrade in between, the
    # new release's code was stored under the old release's key, which processes of the
    # old release then loaded (found by helper hhook)
    graphmend_fingerprint()  # the first claimed import
    with (graphmend_checkout / "pipeline.py").open("a") as pipeline:
        pipeline.write("# another release\n")
    assert _build(cache_dir, module_file).status is Status.REWRITTEN
    assert _entries(cache_dir) == []
    graphmend_fingerprint.cache_clear()  # a process started after the upgrade
    fingerprint_still_holds.cache_clear()
    assert _build(cache_dir, module_file).status is Status.REWRITTEN
    assert len(_entries(cache_dir)) == 1


def test_graphmend_source_that_cannot_be_read_turns_the_cache_off_not_the_import(
    cache_dir, module_file, monkeypatch
):
    def unreadable() -> str:
        raise PermissionError(13, "Permission denied", "graphmend/pipeline.py")

    monkeypatch.setattr("graphmend.cache.graphmend_fingerprint", unreadable)
    rewriter = ModuleRewriter(Config(packages=("cached_module",), cache_dir=cache_dir))
    with pytest.warns(GraphMendWarning, match="its own source cannot be read") as caught:
        outcomes = [rewriter.build("cached_module", str(module_file), SOURCE) for _ in range(2)]
    assert [outcome.status for outcome in outcomes] == [Status.REWRITTEN, Status.REWRITTEN]
    assert len(caught) == 1
    assert _entries(cache_dir) == []


def test_entry_of_another_key_under_the_same_name_is_not_used(cache_dir, module_file):
    _build(cache_dir, module_file)
    (entry,) = _entries(cache_dir)
    other_key = BytecodeCache.key(b"other source", str(module_file), "rewrites=defer")
    # The expected file name with another key inside: a name collision never loads.
    data = bytearray(entry.read_bytes())
    data[4:36] = other_key
    entry.write_bytes(bytes(data))
    assert _build(cache_dir, module_file).status is Status.REWRITTEN


def test_unwritable_cache_is_read_but_never_written(cache_dir, module_file, monkeypatch):
    _build(cache_dir, module_file)
    edited = module_file.with_name("cached_module.py")

    def read_only(*args, **kwargs):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr("graphmend.cache.tempfile.NamedTemporaryFile", read_only)
    assert _build(cache_dir, module_file).status is Status.CACHE_HIT
    edited.write_bytes(SOURCE + b"# new\n")
    outcome = _build(cache_dir, edited)
    assert outcome.status is Status.REWRITTEN and outcome.code is not None
    assert len(_entries(cache_dir)) == 1
    assert not list(cache_dir.rglob("*.tmp"))


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_read_only_directory(cache_dir, module_file):
    _build(cache_dir, module_file)
    for directory in [cache_dir, *cache_dir.iterdir()]:
        directory.chmod(0o555)
    try:
        assert _build(cache_dir, module_file).status is Status.CACHE_HIT
        module_file.write_bytes(SOURCE + b"# new\n")
        assert _build(cache_dir, module_file).status is Status.REWRITTEN
    finally:
        for directory in [cache_dir, *cache_dir.iterdir()]:
            directory.chmod(0o755)


def test_cache_directory_that_is_a_file_means_no_cache(tmp_path, module_file):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    with pytest.warns(GraphMendWarning, match="not-a-directory is not a directory"):
        outcome = _build(blocker, module_file)
    assert outcome.status is Status.REWRITTEN and outcome.code is not None
    assert BytecodeCache(blocker).check().access is Access.UNUSABLE


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc, where mkdir fails")
def test_a_cache_directory_that_cannot_be_created_is_one_warning(module_file):
    # An operator's typo or an unwritable volume: every process would rewrite at every
    # start, and nothing said why.
    cache_dir = Path("/proc/self/graphmend-cache")
    with pytest.warns(GraphMendWarning, match="graphmend-cache cannot be created"):
        outcome = _build(cache_dir, module_file)
    assert outcome.status is Status.REWRITTEN and outcome.code is not None


posix_modes = pytest.mark.skipif(sys.platform == "win32", reason="POSIX owners and modes")


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@posix_modes
@pytest.mark.parametrize("umask", [0o022, 0o002, 0o000])
def test_directories_the_hook_creates_are_private(tmp_path, module_file, umask):
    # Missing parents too (a new ~/.cache): os.makedirs would make them 0777 less the umask.
    home = tmp_path / "home"
    home.mkdir()
    cache_dir = home / ".cache" / "graphmend"
    previous = os.umask(umask)
    try:
        _build(cache_dir, module_file)
    finally:
        os.umask(previous)
    (entry,) = _entries(cache_dir)
    assert {_mode(path) for path in (cache_dir.parent, cache_dir, entry.parent)} == {0o700}


@posix_modes
@pytest.mark.parametrize(
    ("source_mode", "entry_mode"),
    [(0o644, 0o644), (0o640, 0o640), (0o600, 0o600), (0o444, 0o644), (0o666, 0o644)],
)
def test_entries_get_the_read_bits_of_their_source(cache_dir, module_file, source_mode, entry_mode):
    module_file.chmod(source_mode)
    _build(cache_dir, module_file)
    (entry,) = _entries(cache_dir)
    assert _mode(entry) == entry_mode


@posix_modes
@pytest.mark.parametrize("writable", [0o020, 0o002, 0o022])
@pytest.mark.parametrize("which", ["cache-dir", "tag-dir"])
def test_directory_others_can_write_is_not_used(cache_dir, module_file, which, writable):
    _build(cache_dir, module_file)
    (entry,) = _entries(cache_dir)
    directory = cache_dir if which == "cache-dir" else entry.parent
    directory.chmod(0o700 | writable)
    with pytest.warns(GraphMendWarning, match=rf"{directory} \(owner .*can write it") as caught:
        first = _build(cache_dir, module_file)
        second = _build(cache_dir, module_file)
    assert (first.status, second.status) == (Status.REWRITTEN, Status.REWRITTEN)
    assert first.code is not None
    assert len(caught) == 1  # once per directory and process
    assert f"mode {0o700 | writable:04o}" in str(caught[0].message)
    assert _entries(cache_dir) == [entry]
    assert BytecodeCache(cache_dir).check().access is Access.UNUSABLE
    assert BytecodeCache(cache_dir).info().entries == 0
    assert BytecodeCache(cache_dir).clear().removed == 0
    assert entry.exists()


@posix_modes
@pytest.mark.parametrize("writable", [0o020, 0o002])
def test_entry_others_can_write_is_not_used_but_replaced(cache_dir, module_file, writable):
    _build(cache_dir, module_file)
    (entry,) = _entries(cache_dir)
    entry.chmod(0o644 | writable)
    with pytest.warns(GraphMendWarning, match=rf"{entry} \(owner .*can write it"):
        assert _build(cache_dir, module_file).status is Status.REWRITTEN
    assert _mode(entry) == 0o644
    assert _build(cache_dir, module_file).status is Status.CACHE_HIT


@posix_modes
def test_symlinked_entry_is_not_followed(cache_dir, module_file, tmp_path):
    _build(cache_dir, module_file)
    (entry,) = _entries(cache_dir)
    elsewhere = tmp_path / "elsewhere.gmc"
    entry.rename(elsewhere)
    entry.symlink_to(elsewhere)
    assert _build(cache_dir, module_file).status is Status.REWRITTEN


def test_check_says_whether_the_cache_can_be_read_and_written(cache_dir, module_file):
    assert BytecodeCache(cache_dir).check().access is Access.READ_WRITE  # created when needed
    _build(cache_dir, module_file)
    assert BytecodeCache(cache_dir).check().access is Access.READ_WRITE
    assert BytecodeCache(cache_dir / "a" / "b").check().access is Access.READ_WRITE


def test_cache_off_writes_nothing(cache_dir, module_file):
    assert _build(cache_dir, module_file, cache_enabled=False).status is Status.REWRITTEN
    assert _build(cache_dir, module_file, cache_enabled=False).status is Status.REWRITTEN
    assert not cache_dir.exists()


LOADED = textwrap.dedent(
    """
    import json, sys
    import cached_module
    print(json.dumps(sorted(name for name in sys.modules if name.startswith("graphmend."))))
    """
)
ANALYSIS_AND_REWRITES = ("graphmend.pipeline", "graphmend.rewrites", "graphmend.analysis")


def test_warm_import_loads_no_analysis_or_rewrite_code(cache_dir, module_file):
    env = {
        "GRAPHMEND": "1",
        "GRAPHMEND_PACKAGES": "cached_module",
        "GRAPHMEND_CACHE_DIR": str(cache_dir),
        "GRAPHMEND_LOG": "debug",
        "PYTHONPATH": python_path(module_file.parent),
    }
    loaded = {}
    for arm in ("cold", "warm"):
        result = run_python("-c", LOADED, env=env)
        assert result.returncode == 0, result.stderr
        assert ("cached_module: cache hit" in result.stderr) == (arm == "warm")
        loaded[arm] = [
            name
            for name in json.loads(result.stdout.splitlines()[-1])
            if name.startswith(ANALYSIS_AND_REWRITES)
        ]
    assert "graphmend.pipeline" in loaded["cold"]
    assert loaded["warm"] == []


GUARDED = b"""import torch

def f(x):
    if x.sum() < 0:
        raise GmError("negative")
    return x + 1
"""


@pytest.mark.parametrize(
    "binding",
    ["builtins.GmError = ValueError", "builtins.GmError = type('GmError', (ValueError,), {})"],
    ids=["an-interpreter-class", "a-class-of-the-program"],
)
def test_code_rewritten_under_other_builtins_is_not_reused(cache_dir, module_file, binding):
    # T3 lowers `raise GmError(...)` only where GmError is a builtin exception class: a
    # program (or IPython, gettext) may add names to builtins, which other processes lack.
    module_file.write_bytes(GUARDED)
    env = {
        "GRAPHMEND": "1",
        "GRAPHMEND_PACKAGES": "cached_module",
        "GRAPHMEND_CACHE_DIR": str(cache_dir),
        "PYTHONPATH": python_path(module_file.parent),
    }
    first = run_python("-c", f"import builtins; {binding}; import cached_module", env=env)
    assert first.returncode == 0, first.stderr
    compiled = "torch.compile(cached_module.f, backend='eager')(torch.ones(2))"
    second = run_python("-c", f"import torch, cached_module; print({compiled})", env=env)
    assert second.returncode == 0, second.stderr[-2000:]
    assert "tensor([2., 2.])" in second.stdout


CONCURRENT = textwrap.dedent(
    """
    import sys, time
    start = float(sys.argv[1])
    while time.time() < start:
        time.sleep(0.001)
    import torch
    import concurrent_target
    print(concurrent_target.f(torch.ones(1)).sum().item())
    """
)


def test_concurrent_cold_writers_never_see_a_torn_entry(tmp_path, cache_dir):
    import subprocess
    import sys
    import time

    source_dir = tmp_path / "concurrent"
    source_dir.mkdir()
    body = "".join(
        f"\ndef g{i}(x):\n    print('g{i}', x)\n    return x * {i}\n" for i in range(300)
    )
    (source_dir / "concurrent_target.py").write_text(
        "import torch\n" + body + "\ndef f(x):\n    return g7(x)\n"
    )
    (source_dir / "driver.py").write_text(CONCURRENT)
    env = {
        **os.environ,
        "GRAPHMEND": "1",
        "GRAPHMEND_PACKAGES": "concurrent_target",
        "GRAPHMEND_CACHE_DIR": str(cache_dir),
        "GRAPHMEND_LOG": "debug",
        "PYTHONPATH": python_path(source_dir),
    }
    start = str(time.time() + 8)
    children = [
        subprocess.Popen(
            [sys.executable, str(source_dir / "driver.py"), start],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(6)
    ]
    outputs = [child.communicate(timeout=300) for child in children]
    for child, (stdout, stderr) in zip(children, outputs, strict=True):
        assert child.returncode == 0, stderr[-2000:]
        assert "g7 tensor([1.])" in stdout and stdout.strip().endswith("7.0")
        assert "GraphMendWarning" not in stderr
    assert len(_entries(cache_dir)) == 1
    assert not list(cache_dir.rglob("*.tmp"))
    after = run_python(str(source_dir / "driver.py"), "0", env=env)
    assert "concurrent_target: cache hit" in after.stderr


def test_cli_info_warm_clear(tmp_path, cache_dir, monkeypatch, capsys):
    package = tmp_path / "pkgs" / "gm_warm_pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "a.py").write_bytes(SOURCE)
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "b.py").write_bytes(SOURCE)
    (package / "sub" / "data.txt").write_text("not python")
    monkeypatch.syspath_prepend(str(package.parent))
    monkeypatch.setenv("GRAPHMEND_CACHE_DIR", str(cache_dir))

    assert cli_main(["cache", "warm", "gm_warm_pkg"]) == 0
    captured = capsys.readouterr()
    assert "[4/4]" in captured.err
    assert "warmed 4 modules" in captured.out
    assert len(_entries(cache_dir)) == 4

    assert cli_main(["cache", "warm", "gm_warm_pkg.sub.*"]) == 0
    assert "1 cache hit" in capsys.readouterr().out

    assert cli_main(["cache", "info"]) == 0
    info = capsys.readouterr().out
    assert f"directory: {cache_dir}" in info and "entries:   4" in info

    # An import after warming is served from the cache.
    rewriter = ModuleRewriter(Config.from_env())
    path = package / "a.py"
    assert rewriter.build("gm_warm_pkg.a", str(path), path.read_bytes()).status is Status.CACHE_HIT

    assert cli_main(["cache", "clear"]) == 0
    assert "removed 4 entries" in capsys.readouterr().out
    assert _entries(cache_dir) == []


def test_cli_warm_reports_what_it_cannot_do(monkeypatch, capsys):
    assert cli_main(["cache", "warm", "*.modeling_*"]) == 2
    assert "top-level package is a glob" in capsys.readouterr().err
    assert cli_main(["cache", "warm", "no_such_package_anywhere"]) == 2
    assert "no modules on sys.path match" in capsys.readouterr().err
    monkeypatch.setenv("GRAPHMEND_CACHE", "0")
    assert cli_main(["cache", "warm", "graphmend"]) == 2
    assert "cache is off" in capsys.readouterr().err


def test_cli_warm_reports_a_module_too_deep_to_parse_as_not_warmed(
    tmp_path, cache_dir, monkeypatch, capsys
):
    # reading its imports, ast.parse's RecursionError ended cache warm in a traceback
    (tmp_path / "gm_too_deep.py").write_text("x = " + " + ".join(["1"] * 10_000) + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert cli_main(["cache", "warm", "gm_too_deep"]) == 1
    captured = capsys.readouterr()
    # Python 3.10's parser takes it, and the rewrite's own recursion fails
    failed = "parsing failed: RecursionError" if sys.version_info >= (3, 11) else "RecursionError"
    assert f"gm_too_deep: fell back to the original code: {failed}" in captured.err
    assert "warmed 1 module matching gm_too_deep" in captured.out and "1 fell back" in captured.out
    assert _entries(cache_dir) == []


SCOPE_PACKAGE = {
    "__init__.py": "",
    "models/__init__.py": "",
    "models/m/__init__.py": "from . import modeling_m\n",
    "models/m/modeling_m.py": """
        import os
        import gm_scope_pkg.layers.attn
        from ...shared import helper
        from ...lazy import thing
        from ..missing import anything
        from gm_scope_pkg.common import submodule, not_a_module
        from gm_scope_pkg import outside

        def f():
            from gm_scope_pkg import in_function
        """,
    "shared.py": "from .deep import *\nhelper = 1\n",
    "deep.py": "from ..... import beyond_the_top\n",
    "layers/__init__.py": "",
    "layers/attn.py": "",
    "common/__init__.py": "",
    "common/submodule.py": "",
    "in_function.py": "",
    "lazy/__init__.py": """
        from typing import TYPE_CHECKING
        if TYPE_CHECKING:
            from .impl import thing
        """,
    "lazy/impl.py": "thing = 1\n",
    "lazy/other.py": "",
    "outside.py": "from gm_scope_pkg import behind_outside\n",
    "behind_outside.py": "",
    "unrelated.py": "",
}
SCOPE = (
    "gm_scope_pkg.models.*,gm_scope_pkg.shared,gm_scope_pkg.deep,gm_scope_pkg.layers.*,"
    "gm_scope_pkg.common.*,gm_scope_pkg.in_function,gm_scope_pkg.behind_outside,"
    "gm_scope_pkg.unrelated,gm_scope_pkg.lazy.*"
)


def test_cli_warm_follows_imports_into_the_scope(tmp_path, cache_dir, monkeypatch, capsys):
    for relative, source in SCOPE_PACKAGE.items():
        path = tmp_path / "pkgs" / "gm_scope_pkg" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path / "pkgs"))
    monkeypatch.setenv("GRAPHMEND_PACKAGES", SCOPE)

    assert cli_main(["cache", "warm", "gm_scope_pkg.models.m"]) == 0
    out = capsys.readouterr().out
    assert "warmed 2 modules matching gm_scope_pkg.models.m and 6 modules of the scope" in out
    warmed = {path.name.split(".", 1)[1].rsplit(".", 2)[0] for path in _entries(cache_dir)}
    assert warmed == {
        "models.m",
        "models.m.modeling_m",
        "layers.attn",
        "shared",
        "deep",
        "common.submodule",
        "in_function",
        "lazy.impl",
    }
    assert not any(name.startswith("gm_scope_pkg") for name in sys.modules)

    assert cli_main(["cache", "clear"]) == 0
    assert cli_main(["cache", "warm", "--no-imports", "gm_scope_pkg.models.m"]) == 0
    assert "warmed 2 modules matching gm_scope_pkg.models.m into" in capsys.readouterr().out
    assert len(_entries(cache_dir)) == 2


@posix_modes
def test_cli_warm_makes_a_cache_others_can_read(tmp_path, monkeypatch, capsys):
    (tmp_path / "pkgs").mkdir()
    (tmp_path / "pkgs" / "gm_warm_one.py").write_bytes(SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path / "pkgs"))
    cache_dir = tmp_path / "opt" / "graphmend-cache"  # /opt/graphmend-cache, /opt made too
    monkeypatch.setenv("GRAPHMEND_CACHE_DIR", str(cache_dir))
    previous = os.umask(0o077)
    try:
        assert cli_main(["cache", "warm", "gm_warm_one"]) == 0
    finally:
        os.umask(previous)
    (entry,) = _entries(cache_dir)
    assert {_mode(path) for path in (cache_dir.parent, cache_dir, entry.parent)} == {0o755}
    assert cli_main(["cache", "info"]) == 0
    assert "access:    read-write\n" in capsys.readouterr().out


def test_cli_warm_says_once_why_the_cache_cannot_be_created(tmp_path, monkeypatch, capsys, recwarn):
    # a warning from the import hook's path, then an error without the reason
    (tmp_path / "pkgs").mkdir()
    (tmp_path / "pkgs" / "gm_warm_three.py").write_bytes(SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path / "pkgs"))
    cache_dir = tmp_path / "cache"
    monkeypatch.setenv("GRAPHMEND_CACHE_DIR", str(cache_dir))

    def refused(directory, mode):  # as mkdir in /proc, which the checks cannot foresee
        raise OSError(errno.ENOENT, os.strerror(errno.ENOENT), str(directory))

    monkeypatch.setattr(graphmend.cache, "_make_directory", refused)
    assert cli_main(["cache", "warm", "gm_warm_three"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"graphmend: error: cannot warm the cache in {cache_dir}: "
        f"{cache_dir} cannot be created (No such file or directory)"
    ]
    assert not [w for w in recwarn if issubclass(w.category, GraphMendWarning)]


@posix_modes
def test_cli_warm_refuses_a_cache_others_can_write(tmp_path, cache_dir, monkeypatch, capsys):
    (tmp_path / "pkgs").mkdir()
    (tmp_path / "pkgs" / "gm_warm_two.py").write_bytes(SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path / "pkgs"))
    cache_dir.mkdir(mode=0o700)
    cache_dir.chmod(0o777)
    assert cli_main(["cache", "warm", "gm_warm_two"]) == 2
    err = capsys.readouterr().err
    assert f"cannot warm the cache in {cache_dir}" in err and "others can write it" in err


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX named pipes")
def test_a_named_pipe_in_place_of_an_entry_does_not_hang_the_import(cache_dir, module_file):
    # Opening a pipe to read it waits for a writer: the import hung.  It is not a file, so
    # the module is rewritten again.
    assert _build(cache_dir, module_file).code is not None
    (entry,) = _entries(cache_dir)
    entry.unlink()
    os.mkfifo(entry, 0o644)
    built = []
    worker = threading.Thread(target=lambda: built.append(_build(cache_dir, module_file)))
    worker.daemon = True
    worker.start()
    worker.join(timeout=30)
    try:
        assert not worker.is_alive(), "the build waits on the pipe"
        assert built[0].code is not None
    finally:
        if worker.is_alive():  # a writer lets the blocked open go on
            os.close(os.open(entry, os.O_WRONLY | os.O_NONBLOCK))
            worker.join()


def test_a_directory_in_place_of_an_entry_breaks_no_import(cache_dir, module_file):
    # os.open takes a directory; reading it raised IsADirectoryError out of the import.
    assert _build(cache_dir, module_file).code is not None
    (entry,) = _entries(cache_dir)
    entry.unlink()
    entry.mkdir()
    built = _build(cache_dir, module_file)
    assert built.status is Status.REWRITTEN and built.code is not None
    # cache clear stopped at it ("3 cannot be listed"), leaving every other entry
    assert BytecodeCache(cache_dir).clear().problems == (
        f"{entry} is not an entry of GraphMend's cache; it was left as it is",
    )


@pytest.mark.parametrize(
    "meta",
    [
        {"summary": {"T1": [1, 2]}, "warns": False},
        {"summary": [1, 2], "warns": False},
        {"summary": {"T1": {"rewritten": "1"}}, "warns": False},
        {"summary": {}, "warns": 1},
        {"summary": {}},
        [],
    ],
    ids=["counts-a-list", "summary-a-list", "count-a-string", "warns-an-int", "no-warns", "a-list"],
)
def test_an_entry_whose_metadata_is_not_graphmends_is_rebuilt(cache_dir, module_file, meta):
    # A checksum that holds proves no writer: a summary of another shape was accepted, and
    # GRAPHMEND_LOG=debug then failed the import describing it.
    path = str(module_file)
    cache = BytecodeCache(cache_dir)
    settings = Config(packages=("cached_module",), cache_dir=cache_dir).settings_key()
    key = BytecodeCache.key(SOURCE, path, settings)
    code = compile(SOURCE, path, "exec")
    assert cache.store("cached_module", key, code, {})
    (entry,) = _entries(cache_dir)
    data = entry.read_bytes()
    magic, stored_key, _, meta_length = cache_module._HEADER.unpack_from(data)
    code_bytes = data[cache_module._HEADER.size + meta_length :]

    def rewrite_entry(metadata: object) -> None:
        payload = json.dumps(metadata).encode() + code_bytes
        header = cache_module._HEADER.pack(
            magic, stored_key, cache_module._checksum(payload), len(json.dumps(metadata))
        )
        entry.write_bytes(header + payload)

    rewrite_entry({"summary": {"defer": {"rewritten": 1}}, "warns": False})  # as store writes
    assert cache.load("cached_module", key) is not None
    rewrite_entry(meta)
    assert cache.load("cached_module", key) is None
    assert _build(cache_dir, module_file).status is Status.REWRITTEN


@posix_modes
def test_cli_clear_leaves_a_cache_others_can_write_and_says_so(cache_dir, module_file, capsys):
    # Its entries are never used, and never touched: "removed 0 entries" and exit 0 read
    # as an empty cache where entries are still there.
    assert _build(cache_dir, module_file).code is not None
    (entry,) = _entries(cache_dir)
    cache_dir.chmod(0o777)
    try:
        assert cli_main(["cache", "clear"]) == 1
        out, err = capsys.readouterr()
        assert out == f"removed 0 entries from {cache_dir}\n"
        assert "others can write it" in err and "nothing in it was removed" in err
        assert entry.exists()
    finally:
        cache_dir.chmod(0o700)


@posix_modes
def test_cli_info_on_a_cache_others_can_write_counts_nothing_and_says_so(
    cache_dir, module_file, capsys, recwarn
):
    # It printed "entries: 0" beside its entries, warned that modules are rewritten
    # without the cache (info rewrites nothing), and exited 0 where clear exits 1.
    assert _build(cache_dir, module_file).code is not None
    cache_dir.chmod(0o777)
    try:
        assert cli_main(["cache", "info"]) == 1
        out, err = capsys.readouterr()
        assert "access:    unusable (" in out and "others can write it" in out
        assert "entries:   not counted (the cache is not used: see access)" in out
        assert err == "" and not [w for w in recwarn if w.category is GraphMendWarning]
    finally:
        cache_dir.chmod(0o700)


@posix_modes
def test_cli_info_counts_this_interpreters_entries_beside_another_it_does_not_trust(
    cache_dir, module_file, capsys
):
    # The distrusted directory of another interpreter made info count nothing, exit 1.
    assert _build(cache_dir, module_file).code is not None
    other = cache_dir / "cpython-39"
    other.mkdir(mode=0o700)
    other.chmod(0o777)
    assert cli_main(["cache", "info"]) == 0
    out = capsys.readouterr().out
    assert "access:    read-write" in out and "entries:   1" in out
    assert f"not counted: {other} (" in out and "others can write it" in out


@pytest.mark.parametrize(
    "command", [["check"], ["cache", "info"], ["cache", "clear"], ["run", "-h"]]
)
@pytest.mark.parametrize("unbuffered", ["1", ""], ids=["unbuffered", "buffered"])
def test_cli_output_whose_reader_is_gone_stops_quietly(cache_dir, command, unbuffered):
    # writing to a pipe nobody reads (| head) printed GraphMend's traceback with
    # BrokenPipeError unbuffered (PYTHONUNBUFFERED=1, as container images set it), and
    # "Exception ignored" at exit buffered
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "graphmend", *command],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            env={
                **os.environ,
                "PYTHONUNBUFFERED": unbuffered,
                "GRAPHMEND_CACHE_DIR": str(cache_dir),
                "PYTHONPATH": python_path(),
            },
        )
    finally:
        os.close(write_end)
    assert (result.returncode, result.stderr) == (1, "")


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
@pytest.mark.parametrize(
    "command",
    [
        ["check"],
        ["cache", "info"],
        ["cache", "warm", "gm_closed_out"],
        ["cache", "warm", "gm_no_such_module"],
    ],
)
def test_cli_output_to_a_closed_stream_is_dropped(tmp_path, monkeypatch, capsys, stream, command):
    # Python sets sys.stdout or sys.stderr to None when started with it closed (>&-,
    # 2>&-): check and cache warm ended in GraphMend's AttributeError, and an error meant
    # for a closed stderr was printed on stdout
    (tmp_path / "gm_closed_out.py").write_bytes(SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    cli_main(command)  # the cache warmed: the runs below say the same
    capsys.readouterr()
    status, expected = cli_main(command), capsys.readouterr()
    monkeypatch.setattr(sys, stream, None)
    assert cli_main(command) == status
    written = capsys.readouterr()
    assert written.out == ("" if stream == "stdout" else expected.out)
    assert written.err == ("" if stream == "stderr" else expected.err)


def test_cli_clear_removes_only_graphmends_entries(tmp_path, monkeypatch, capsys):
    # GRAPHMEND_CACHE_DIR naming a directory of the user's own (a home, a project): every
    # file ending in .gmc one level down was deleted as an entry, and every one named as
    # a temporary file (".*.gmc.*.tmp"), through symbolic links too, silently
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    own = {
        home / "project" / "level.gmc": b"the user's own data",
        home / "project" / ".report.gmc.final.tmp": b"a draft",
        elsewhere / ".notes.gmc.v2.tmp": b"notes",
        home / "python" / "mine.gmc": b"GMC1 a format of the user's own",
    }
    for path, data in own.items():
        path.parent.mkdir(parents=True, mode=0o700, exist_ok=True)
        path.write_bytes(data)
    (home / "linked").symlink_to(elsewhere)
    home.chmod(0o700)
    module = tmp_path / "cached_module.py"
    module.write_bytes(SOURCE)
    assert _build(home, module).status is Status.REWRITTEN
    (entry,) = [path for path in _entries(home) if path not in own]
    leftover = entry.parent / f".{entry.name}.a1b2c3d4.tmp"  # a writer stopped at its start
    leftover.touch()
    emptied = entry.parent / f"{entry.name[:-36]}{'0' * 32}.gmc"  # by a crash, say
    emptied.touch()
    monkeypatch.setenv("GRAPHMEND_CACHE_DIR", str(home))
    assert cli_main(["cache", "clear"]) == 1
    out, err = capsys.readouterr()
    assert out == f"removed 2 entries from {home}\n"
    mine = home / "python" / "mine.gmc"
    assert err.splitlines() == [
        f"graphmend: error: {mine} is not an entry of GraphMend's cache; it was left as it is"
    ]
    assert {path: path.read_bytes() for path in own} == own
    assert not entry.exists() and not leftover.exists() and not emptied.exists()


#: Runs a command without root's power to ignore file modes (as root, through setpriv).
AS_A_USER = (
    ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
    if hasattr(os, "geteuid") and os.geteuid() == 0
    else []
)


def _cache_command(action: str, cache_dir: Path) -> subprocess.CompletedProcess[str]:
    command = [*AS_A_USER, sys.executable, "-m", "graphmend", "cache", action]
    environment = {**os.environ, "GRAPHMEND_CACHE_DIR": str(cache_dir)}
    return subprocess.run(command, env=environment, capture_output=True, text=True)


@posix_modes
@pytest.mark.skipif(AS_A_USER != [] and not shutil.which("setpriv"), reason="needs setpriv")
def test_cli_info_and_clear_say_what_they_cannot_read_or_remove(cache_dir, module_file):
    assert _build(cache_dir, module_file).code is not None
    (entry,) = _entries(cache_dir)
    try:
        entry.parent.chmod(0o500)  # entries can be read, none removed
        cleared = _cache_command("clear", cache_dir)
        assert (cleared.returncode, cleared.stdout) == (1, f"removed 0 entries from {cache_dir}\n")
        assert f"graphmend: error: {entry} cannot be removed (Permission denied)" in cleared.stderr
        assert entry.exists()
        cache_dir.chmod(0o300)  # nothing can be listed
        info = _cache_command("info", cache_dir)
        assert info.returncode == 1, info.stderr
        unknown = f"entries:   unknown ({cache_dir} cannot be listed: Permission denied)"
        assert unknown in info.stdout
        cleared = _cache_command("clear", cache_dir)
        assert cleared.returncode == 1
        assert f"{cache_dir} cannot be listed (Permission denied)" in cleared.stderr
    finally:
        cache_dir.chmod(0o700)
        entry.parent.chmod(0o700)
