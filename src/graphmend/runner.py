"""``python -m graphmend run``: run a script or a module as plain ``python`` would, rewritten.

``sys.argv``, ``sys.path[0]``, the ``__main__`` module and the exit status are
what ``python script.py`` / ``python -m module`` give; the script itself is
rewritten too, unless a ``!`` pattern excludes its module's name (``__main__``; a
module run with ``-m`` is claimed by its own name).

The run's settings go into ``os.environ`` (``GRAPHMEND=1`` and every
``GRAPHMEND_*`` variable, as coverage.py does with ``COVERAGE_PROCESS_START``),
so every child Python process, DataLoader workers and process pools with the
spawn or forkserver context included, installs the same hook at startup through
``graphmend_hook.pth``; forked children inherit the installed hook anyway.
"""

from __future__ import annotations

import builtins
import importlib.machinery
import importlib.util
import linecache
import marshal
import os
import pkgutil
import runpy
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import graphmend
from graphmend.activation import Installation, install_config
from graphmend.compiling import CODING_COMMENT, check_script_encoding, compile_source
from graphmend.config import Config
from graphmend.notices import write_stderr
from graphmend.patterns import reserved
from graphmend.rewriter import ModuleRewriter

T = TypeVar("T")

#: GraphMend's package directory (with its separator: ``graphmend_tools/`` beside it is
#: none of it): the frames dropped from the top of an uncaught error's traceback.  Not
#: runpy's, which ``python -m`` shows (on Python 3.10, where it is not frozen, they were
#: taken for GraphMend's own).
_OWN_DIR = os.path.join(Path(graphmend.__file__).parent, "")


class ScriptError(Exception):
    """A script that cannot be opened; reported as ``python`` reports it, exit status 2."""


def run_path(path: str, args: list[str], config: Config) -> None:
    """Execute what ``python path`` executes: a script, the ``__main__`` module of a
    directory or zip file, or (``-``) the program read from standard input."""
    if path == "-":
        run_stdin(args, config)
        return
    absolute = _absolute(path)
    if pkgutil.get_importer(absolute) is None:
        run_script(path, args, config)
        return
    # As the interpreter does: the directory or archive goes first on sys.path (even under
    # -P), and its ``__main__`` module runs as ``python -m __main__`` would.
    _install(config.with_more_packages(["__main__"]))
    sys.argv = [path, *args]
    if getattr(sys.flags, "safe_path", False):
        sys.path.insert(0, absolute)
    else:
        sys.path[0] = absolute
    _run_as_main("__main__", alter_argv=False)


def run_script(
    path: str, args: list[str], config: Config | None, *, name: str = "__main__"
) -> dict[str, object]:
    """Execute ``path`` as module ``name`` (``__main__``: as ``python path`` would), with
    the hook installed (none when ``config`` is ``None``); returns the module's namespace."""
    absolute = _absolute(path)
    try:
        with open(absolute, "rb") as handle:
            source = handle.read()
    except OSError as error:
        raise ScriptError(
            f"can't open file {absolute!r}: [Errno {error.errno}] {error.strerror}"
        ) from None
    compiled = _is_compiled(absolute, source)
    machinery = importlib.machinery
    loader = machinery.SourcelessFileLoader if compiled else machinery.SourceFileLoader
    # The interpreter resolves symbolic links: a linked script imports its neighbours.
    return _run_source(
        _Program(name, absolute, source, compiled, loader(name, absolute)),
        [path, *args],
        os.path.dirname(os.path.realpath(absolute)),
        config,
    )


def run_stdin(args: list[str], config: Config) -> None:
    """Execute what ``python -`` executes: the program read from standard input, named
    ``<stdin>``, with the current directory first on ``sys.path``."""
    # a closed standard input (python - <&-) is an empty program; an interrupt while
    # reading is reported as the interpreter reports it, without GraphMend's frames
    source = report_uncaught(lambda: sys.stdin.buffer.read() if sys.stdin else b"")
    program = _Program("__main__", "<stdin>", source, False, importlib.machinery.BuiltinImporter)
    _run_source(program, ["-", *args], "", config)


def run_command(command: str, args: list[str], config: Config) -> None:
    """Execute what ``python -c command`` executes: ``command``, named ``<string>``, in a
    ``__main__`` without ``__file__``, with the current directory first on ``sys.path``."""
    loader = importlib.machinery.BuiltinImporter
    try:
        encoded = command.encode("utf-8")
    except UnicodeEncodeError as error:  # bytes the locale cannot decode (surrogates)
        write_stderr(
            "Unable to decode the command from the command line:\n"
            f"{type(error).__name__}: {error}\n"
        )
        raise SystemExit(1) from None
    source = _cookie_ignored(encoded)
    if sys.version_info >= (3, 13):
        _register_command_lines(command)
    program = _Program("__main__", "<string>", source, False, loader, has_file=False, text=command)
    _run_source(program, ["-c", *args], "", config)


def _register_command_lines(command: str) -> None:
    """Give tracebacks the lines of ``-c``'s command, as the interpreter does from Python
    3.13 on (``linecache``'s entry for ``<string>``, which it writes before running it)."""
    linecache.cache["<string>"] = (
        len(command),
        None,
        [line + "\n" for line in command.splitlines()],
        "<string>",
    )


def _cookie_ignored(source: bytes) -> bytes:
    """``source`` as ``python -c`` reads its command, as UTF-8 whatever a coding comment
    in its first two lines says: such a comment is emptied (the lines stay as they are)."""
    lines = source.split(b"\n", 2)
    for index, line in enumerate(lines[:2]):
        if CODING_COMMENT.match(line):
            lines[index] = b"#"
    return b"\n".join(lines)


@dataclass(frozen=True)
class _Program:
    """What a ``__main__``-like module runs: its name, file name, bytes and loader."""

    name: str
    filename: str
    source: bytes
    compiled: bool  # a .pyc: run as it is, never rewritten
    loader: object
    has_file: bool = True  # ``__file__`` and ``__cached__`` set (not for ``-c``)
    #: ``-c``'s command, which the interpreter compiles as text (a coding comment is
    #: ignored, and a byte order mark is a character, which it refuses)
    text: str | None = None


def _run_source(
    program: _Program, argv: list[str], path0: str, config: Config | None
) -> dict[str, object]:
    """Run ``program`` in a fresh module as the interpreter runs a script: ``argv`` as
    ``sys.argv``, ``path0`` as ``sys.path[0]`` (not under ``-P``), the hook installed
    (none when ``config`` is ``None``) and the program rewritten unless a ``!`` pattern
    excludes its module, as a directory's ``__main__``; returns the module's namespace."""
    rewriter = _program_rewriter(program, config) if config is not None else None
    main = _fresh_main(program.name)
    if program.has_file:
        main.__dict__.update(__file__=program.filename, __cached__=None)
    main.__loader__ = program.loader
    sys.argv = argv
    if not getattr(sys.flags, "safe_path", False):  # Python 3.11+: -P
        sys.path[0] = path0

    def execute() -> None:
        # Compiled first as the interpreter compiles it, every run (a script has no .pyc):
        # its warnings, and a syntax error reported as the interpreter reports it.
        plain = _script_code(program.filename, program.text or program.source, program.compiled)
        code = (
            rewriter.code_for(program.name, program.filename, program.source) if rewriter else None
        )
        exec(code or plain, main.__dict__)

    run_main(execute)
    return main.__dict__


def _program_rewriter(program: _Program, config: Config) -> ModuleRewriter | None:
    """Install the hook; its rewriter for ``program``, or ``None`` where ``program`` is
    not to be rewritten (a ``.pyc``, or a module a ``!`` pattern excludes: ``!__main__``)."""
    finder = _install(config).finder
    left_as_written = program.compiled or finder.matcher.excludes(program.name)
    return None if left_as_written else finder.rewriter


def _absolute(path: str) -> str:
    """``path`` made absolute as the interpreter makes a script's: joined to the current
    directory, ``..`` and ``.`` kept (``os.path.abspath`` would resolve them); as it is
    where the current directory cannot be read (deleted), as the interpreter keeps it."""
    if os.path.isabs(path):
        return path
    try:
        return os.path.join(os.getcwd(), path)
    except OSError:
        return path


def _is_compiled(path: str, data: bytes) -> bool:
    """Whether ``python path`` runs ``data`` as bytecode (a ``.pyc``, or its magic number)."""
    return path.endswith(".pyc") or data[:2] == importlib.util.MAGIC_NUMBER[:2]


def _script_code(path: str, data: bytes | str, compiled: bool) -> types.CodeType:
    """The code of a script as the interpreter makes it: compiled (its bytes, or ``-c``'s
    text), or read from a ``.pyc``."""
    if isinstance(data, str):
        return compile_source(data, path)
    if not compiled:
        check_script_encoding(data, path)
        try:
            return compile_source(data, path)
        except SyntaxError as error:
            if error.lineno != 0:
                raise
            # an encoding the interpreter's reader refuses (a BOM with a latin-1 coding
            # comment): it names no file and line 0, as compile does
            raise SyntaxError(error.msg) from None
    if data[:4] != importlib.util.MAGIC_NUMBER:
        raise RuntimeError("Bad magic number in .pyc file")
    try:
        code = marshal.loads(data[16:])  # after the magic number, flags and source stamp
    except (EOFError, ValueError, TypeError):
        code = None  # the interpreter says no more than that either
    if not isinstance(code, types.CodeType):
        raise RuntimeError("Bad code object in .pyc file")
    return code


def run_module(module: str, args: list[str], config: Config) -> None:
    """Execute ``module`` as ``python -m module`` would, with the hook claiming it.

    A module GraphMend never claims (``torch.distributed.run``, a standard
    library tool) runs as it is; the processes it starts get the hook.  A name that
    is no module name (``.relative``) is left to ``runpy`` to refuse, as Python does.
    """
    claimable = not reserved(module) and all(part.isidentifier() for part in module.split("."))
    _install(config.with_more_packages([module]) if claimable else config)
    sys.argv = [module, *args]
    _run_as_main(module, alter_argv=True)


def _fresh_main(name: str) -> types.ModuleType:
    """A module as the interpreter makes ``__main__`` (none of GraphMend's names in it),
    registered in ``sys.modules``."""
    main = types.ModuleType(name)
    main.__builtins__ = builtins  # type: ignore[attr-defined]
    if sys.version_info < (3, 14):  # the interpreter's __main__ has it until PEP 649
        main.__annotations__ = {}
    sys.modules[name] = main
    return main


def _run_as_main(module: str, *, alter_argv: bool) -> None:
    """``runpy``'s ``python -m`` in a fresh ``__main__`` module (the one ``python -m
    graphmend`` runs in keeps its names, and the module sees only its own)."""
    _fresh_main("__main__")
    run_as_main: Callable[..., object] = runpy._run_module_as_main  # type: ignore[attr-defined]
    run_main(lambda: run_as_main(module, alter_argv=alter_argv))


def _install(config: Config) -> Installation:
    """Install the hook here, and in every child process through the environment."""
    os.environ.update(config.environment())
    return install_config(config)


def report_uncaught(run: Callable[[], T]) -> T:
    """``run()``; an exception it raises is shown as the interpreter shows a script's
    uncaught one (without GraphMend's frames), then ``SystemExit(1)``."""
    try:
        result = run()
    except SystemExit:
        raise
    except KeyboardInterrupt as error:
        # The interpreter reports it and exits as SIGINT does, after the atexit handlers;
        # it should report it as it does for the script.
        sys.excepthook = _reporting_once(getattr(sys, "excepthook", None), error)
        raise
    except BaseException as error:
        uncaught = error
    else:
        return result
    _report(uncaught)
    raise SystemExit(1)


def run_main(run: Callable[[], object]) -> None:
    """``run()``, the user's ``__main__``, ended as the interpreter ends it
    (:func:`report_uncaught`).  Under ``python -i`` an uncaught exception (``SystemExit``
    and ``KeyboardInterrupt`` included) is shown and not raised, as after ``python -i
    script.py``: the prompt follows in the script's namespace, and ``pdb.pm()`` debugs
    the script's error.  Under a debugger (``python -m pdb -m graphmend run``) it is
    raised as it is, for the debugger's post-mortem."""
    if debugged():
        run()
    elif sys.flags.inspect:
        try:
            run()
        except BaseException as error:
            _report(error)
    else:
        report_uncaught(run)


def debugged() -> bool:
    """Whether a ``bdb`` debugger (``pdb``) runs GraphMend: a frame below is its ``run``."""
    bdb = sys.modules.get("bdb")
    frame = sys._getframe(1)
    while bdb is not None and frame is not None:
        if isinstance(frame.f_locals.get("self"), bdb.Bdb):
            return True
        frame = frame.f_back
    return False


def _report(uncaught: BaseException) -> None:
    """Show ``uncaught`` as the interpreter shows an uncaught exception, with no exception
    being handled (the hook sees none in ``sys.exc_info()``), and without GraphMend's own
    frames on top; ``sys.last_value`` and its kin set as it sets them."""
    _drop_own_frames(uncaught)
    sys.last_type, sys.last_value = type(uncaught), uncaught  # an atexit handler may read them
    sys.last_traceback = uncaught.__traceback__
    if sys.version_info >= (3, 12):
        sys.last_exc = uncaught
    _show_uncaught(uncaught, getattr(sys, "excepthook", None))


def _show_uncaught(error: BaseException, hook: Callable[..., object] | None) -> None:
    """Show ``error`` with ``hook`` as the interpreter does (``PyErr_Print``), and as it
    does when the hook is missing or fails; a ``SystemExit`` from the hook ends the program."""
    if hook is None:
        write_stderr("sys.excepthook is missing\n")
        sys.__excepthook__(type(error), error, error.__traceback__)
        return
    try:
        hook(type(error), error, error.__traceback__)
    except SystemExit:
        raise
    except BaseException as failure:
        _drop_own_frames(failure)
        write_stderr("Error in sys.excepthook:\n")
        sys.__excepthook__(type(failure), failure, failure.__traceback__)
        write_stderr("\nOriginal exception was:\n")
        sys.__excepthook__(type(error), error, error.__traceback__)


def _drop_own_frames(error: BaseException) -> None:
    """Drop GraphMend's own frames from the top of the traceback of ``error``, caught
    here, so that it starts at the script's first frame."""
    traceback = error.__traceback__
    while traceback is not None and traceback.tb_frame.f_code.co_filename.startswith(_OWN_DIR):
        traceback = traceback.tb_next
    error.with_traceback(traceback)


def _reporting_once(
    hook: Callable[..., object] | None, error: BaseException
) -> Callable[..., object]:
    """An excepthook that puts ``hook`` back (or none, when it is ``None``) and shows
    what it is given with ``hook``; ``error`` without the frames above the script's,
    which the interpreter added on its way out."""
    _drop_own_frames(error)
    traceback = error.__traceback__

    def excepthook(kind: type[BaseException], value: BaseException, tb: object) -> None:
        if hook is None:
            del sys.excepthook
        else:
            sys.excepthook = hook
        if value is error:
            error.with_traceback(traceback)
        _show_uncaught(value, hook)

    return excepthook
