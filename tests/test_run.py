"""python -m graphmend run: the script or module sees what plain python gives it."""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import signal
import subprocess
import sys
import textwrap
import traceback
import zipfile
from pathlib import Path
from unittest.mock import ANY

import pytest

import graphmend
from graphmend import runner
from helpers.processes import python_path, run_python

IDENTITY = textwrap.dedent(
    """
    import sys
    import torch
    print(sys.argv)
    print(sys.path[0])
    print(__name__, __file__, __spec__, __package__, type(__loader__).__name__)
    print(sys.modules["__main__"].__dict__ is globals())
    print(dir(sys.modules["__main__"]))

    def shout(x):
        print("shout", x)
        return x * 2

    if __name__ == "__main__":
        compiled = torch.compile(shout, backend="eager", fullgraph=True)
        try:
            print(compiled(torch.ones(1)))
        except Exception as error:
            print("fullgraph failed:", type(error).__name__)
        sys.exit(int(sys.argv[-1]) if sys.argv[-1].isdigit() else 0)
    """
)


@pytest.fixture
def project(tmp_path: Path, cache_dir: Path) -> Path:
    (tmp_path / "proj" / "pkg").mkdir(parents=True)
    (tmp_path / "proj" / "script.py").write_text(IDENTITY)
    (tmp_path / "proj" / "pkg" / "__init__.py").write_text("")
    (tmp_path / "proj" / "pkg" / "__main__.py").write_text(IDENTITY)
    (tmp_path / "proj" / "pkg" / "tool.py").write_text(IDENTITY)
    return tmp_path / "proj"


def _lines(result):
    """Output lines with the loader (GraphMend's or Python's, and its address) normalised."""
    return [
        re.sub(
            r"<[\w.]*\.(SourceFileLoader|GraphMendLoader) object at 0x[0-9a-f]+>|"
            r"\b(SourceFileLoader|GraphMendLoader)\b",
            "<loader>",
            line,
        )
        for line in result.stdout.splitlines()
    ]


def test_script_sees_what_plain_python_gives_it(project):
    plain = run_python("script.py", "a", "--flag", "3", cwd=project)
    mended = run_python("-m", "graphmend", "run", "script.py", "a", "--flag", "3", cwd=project)
    assert plain.returncode == mended.returncode == 3
    assert _lines(plain)[:5] == _lines(mended)[:5]
    assert _lines(plain)[5:] == ["fullgraph failed: Unsupported"]
    # The script's own module is rewritten: its print no longer breaks the graph.
    assert _lines(mended)[5:] == ["shout tensor([1.])", "tensor([2.])"]


def test_module_sees_what_python_dash_m_gives_it(project):
    for module in ("pkg.tool", "pkg"):
        plain = run_python("-m", module, "x", "0", cwd=project)
        mended = run_python("-m", "graphmend", "run", "-m", module, "x", "0", cwd=project)
        assert plain.returncode == mended.returncode == 0, mended.stderr
        assert _lines(plain)[:5] == _lines(mended)[:5]
        assert _lines(mended)[5:] == ["shout tensor([1.])", "tensor([2.])"]


def test_a_program_from_standard_input_sees_what_python_dash_gives_it(project):
    plain = run_python("-", "a", "3", cwd=project, stdin=IDENTITY)
    mended = run_python("-m", "graphmend", "run", "-", "a", "3", cwd=project, stdin=IDENTITY)
    assert plain.returncode == mended.returncode == 3, mended.stderr
    assert _lines(plain)[:5] == _lines(mended)[:5]
    assert _lines(mended)[5:] == ["shout tensor([1.])", "tensor([2.])"]


COMMAND = """
import sys, torch
print(sys.argv, repr(sys.path[0]), dir(sys.modules["__main__"]), __name__, __spec__)
print(__loader__)
def shout(x):
    print("shout", x)
    return x * 2
print(torch.compile(shout, backend="eager", fullgraph=True)(torch.ones(1)))
"""


def test_a_command_sees_what_python_dash_c_gives_it(project):
    plain = run_python("-c", COMMAND, "a", "-p", cwd=project)
    mended = run_python("-m", "graphmend", "run", "-c", COMMAND, "a", "-p", cwd=project)
    assert plain.returncode == 1 and "Unsupported" in plain.stderr  # print breaks
    assert mended.returncode == 0, mended.stderr
    assert _lines(plain)[:2] == _lines(mended)[:2]
    assert _lines(mended)[2:] == ["shout tensor([1.])", "tensor([2.])"]
    failing = run_python("-m", "graphmend", "run", "-c", "1/0", cwd=project)
    assert failing.returncode == 1
    assert failing.stderr == run_python("-c", "1/0", cwd=project).stderr


@pytest.mark.parametrize(
    "arguments",
    [["-cimport sys; print(sys.argv)", "a"], ["-mgm_joined", "a"]],
    ids=["-cCOMMAND", "-mMODULE"],
)
def test_a_flag_joined_to_its_value_runs_as_with_python(project, arguments):
    # python takes -mpkg and -c'...'; run refused them as unknown options
    (project / "gm_joined.py").write_text("import sys\nprint(sys.argv[1:])\n")
    plain = run_python(*arguments, cwd=project)
    mended = run_python("-m", "graphmend", "run", *arguments, cwd=project)
    assert plain.returncode == mended.returncode == 0, mended.stderr
    assert mended.stdout == plain.stdout


@pytest.mark.parametrize("cookie", ["# coding: latin-1", "#!python\n# vim: fileencoding=bogus"])
def test_a_command_is_utf_8_whatever_its_coding_comment_says(project, cookie):
    # python -c ignores a coding comment: 'é' is one character, and no encoding is looked up.
    command = f"{cookie}\nprint('\u00e9', len('\u00e9'))\n1 / 0"
    plain = run_python("-c", command, cwd=project)
    mended = run_python("-m", "graphmend", "run", "-c", command, cwd=project)
    assert plain.stdout == "\u00e9 1\n" and plain.returncode == 1
    assert (mended.returncode, mended.stdout, mended.stderr) == (1, plain.stdout, plain.stderr)


@pytest.mark.parametrize("name", [".relative", "not a name", "!excluded", "glob*"])
def test_a_name_that_is_no_module_name_is_refused_as_python_refuses_it(project, name):
    plain = run_python("-m", name, cwd=project)
    mended = run_python("-m", "graphmend", "run", "-m", name, cwd=project)
    assert (mended.returncode, mended.stderr) == (plain.returncode, plain.stderr) == (1, ANY)


def test_a_double_dash_ends_the_options(project):
    (project / "-dash.py").write_text(IDENTITY)
    plain = run_python("--", "-dash.py", "-p", "0", cwd=project)
    mended = run_python("-m", "graphmend", "run", "--", "-dash.py", "-p", "0", cwd=project)
    assert plain.returncode == mended.returncode == 0, mended.stderr
    assert _lines(plain)[:5] == _lines(mended)[:5]
    assert _lines(mended)[5:] == ["shout tensor([1.])", "tensor([2.])"]


def test_linked_script_directory_and_zip_run_as_with_python(project, tmp_path):
    (project / "neighbour.py").write_text("")
    (project / "script.py").write_text("import neighbour\n" + IDENTITY)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "linked.py").symlink_to(project / "script.py")
    (project / "app").mkdir()
    (project / "app" / "__main__.py").write_text(IDENTITY)
    with zipfile.ZipFile(project / "app.zip", "w") as archive:
        archive.write(project / "app" / "__main__.py", "__main__.py")
    for target in (str(tmp_path / "bin" / "linked.py"), "app"):
        plain = run_python(target, "0", cwd=project)
        mended = run_python("-m", "graphmend", "run", target, "0", cwd=project)
        assert plain.returncode == mended.returncode == 0, mended.stderr
        assert _lines(plain)[:5] == _lines(mended)[:5]
        assert _lines(mended)[5:] == ["shout tensor([1.])", "tensor([2.])"]
        assert mended.stderr == plain.stderr
    plain = run_python("app.zip", "0", cwd=project)  # zipped code is left as it is
    mended = run_python("-m", "graphmend", "run", "app.zip", "0", cwd=project)
    assert (_lines(mended), mended.stderr) == (_lines(plain), plain.stderr)


def test_a_path_with_dots_is_kept_as_python_keeps_it(project):
    # python makes the path absolute without resolving "..": __file__, sys.argv[0],
    # sys.path[0] of a directory, tracebacks.
    (project / "app").mkdir()
    (project / "app" / "__main__.py").write_text(IDENTITY)
    for target in ("./../script.py", "../app"):
        plain = run_python(target, "0", cwd=project / "pkg")
        mended = run_python("-m", "graphmend", "run", target, "0", cwd=project / "pkg")
        assert plain.returncode == mended.returncode == 0, mended.stderr
        assert _lines(plain)[:5] == _lines(mended)[:5]


def test_a_compiled_script_runs_as_with_python(project):
    # `python script.pyc` runs the bytecode (a sourceless deployment): nothing to rewrite.
    compiled = "import py_compile; py_compile.compile('script.py', cfile='script.pyc')"
    assert run_python("-c", compiled, cwd=project).returncode == 0
    plain = run_python("script.pyc", "0", cwd=project)
    mended = run_python("-m", "graphmend", "run", "script.pyc", "0", cwd=project)
    assert plain.returncode == 0, plain.stderr
    assert (mended.returncode, _lines(mended), mended.stderr) == (0, _lines(plain), plain.stderr)


@pytest.mark.parametrize("payload", [b"", b"garbage", b"\xff\xff", b"\xe9\x05\x00\x00\x00"])
def test_a_compiled_script_with_bad_code_fails_as_with_python(project, payload):
    # The magic number of this interpreter, then what marshal cannot read or is no code.
    header = importlib.util.MAGIC_NUMBER + bytes(12)
    (project / "bad.pyc").write_bytes(header + payload)
    plain = run_python("bad.pyc", cwd=project)
    mended = run_python("-m", "graphmend", "run", "bad.pyc", cwd=project)
    assert plain.stderr == "RuntimeError: Bad code object in .pyc file\n"
    assert (mended.returncode, mended.stderr) == (plain.returncode, plain.stderr) == (1, ANY)


def test_the_launchers_own_names_survive_the_run(project):
    # A launcher (a console script, `python -c`) still reads its globals after main().
    (project / "quiet.py").write_text("value = 1\n")
    launcher = "import sys\nfrom graphmend.cli import main\nstatus = main(['run', '-m', 'quiet'])\n"
    result = run_python("-c", launcher + "sys.exit(status + 4)", cwd=project)
    assert result.returncode == 4, result.stderr


UNCAUGHT = "def boom():\n    raise KeyError('gone')\n\nboom()\n"
LAST_VALUE = "import atexit, sys\natexit.register(lambda: print(repr(sys.last_value)))\n"
FAILING_HOOK = (
    "import sys\n\ndef hook(kind, value, traceback):\n"
    "    print('handling', sys.exc_info()[0])\n    raise RuntimeError('hook failed')\n\n"
    "sys.excepthook = hook\n"
)


@pytest.mark.parametrize(
    "source",
    [
        "import torch\ndef f(:\n    pass\n",
        pytest.param(
            "import torch\nx = 1 \0 + 2\n",
            marks=pytest.mark.xfail(
                sys.version_info < (3, 11),
                reason="Python 3.10's file reader ends a line at a null byte and joins the "
                "next line to it; GraphMend compiles the source as 3.11+ does, which "
                "refuses null bytes",
                strict=True,
            ),
        ),
        UNCAUGHT,
        LAST_VALUE + UNCAUGHT,
        FAILING_HOOK + UNCAUGHT,
        "import sys\ndel sys.excepthook\n" + UNCAUGHT,
        "import sys\nsys.excepthook = lambda *error: sys.exit(1)\n" + UNCAUGHT,
    ],
    ids=[
        "syntax error",
        "null byte",
        "uncaught exception",
        "atexit reads sys.last_value",
        "excepthook fails",
        "excepthook missing",
        "excepthook exits",
    ],
)
def test_a_failing_script_exits_1_with_what_python_prints(project, source):
    (project / "failing.py").write_text(source)
    plain = run_python("failing.py", cwd=project)
    mended = run_python("-m", "graphmend", "run", "failing.py", cwd=project)
    assert plain.returncode == mended.returncode == 1
    assert (mended.stdout, mended.stderr) == (plain.stdout, plain.stderr)
    assert "graphmend" not in mended.stderr


@pytest.mark.parametrize(
    "source",
    ["x = 41\nraise ValueError('oops')\n", "x = 42\n", "import sys\nx = 43\nsys.exit(3)\n"],
    ids=["uncaught exception", "success", "exit"],
)
def test_the_prompt_of_python_dash_i_follows_as_after_the_script(project, source):
    # python -i shows a SystemExit from the main module and goes on to the prompt: the
    # SystemExit(1) GraphMend raised after the script's error was shown with its frames
    # and replaced the error pdb.pm() debugs (found by helper hhook)
    (project / "inspected.py").write_text(source)
    probe = "import sys\nprint('last', type(getattr(sys, 'last_value', None)).__name__, x)\n"
    plain = run_python("-i", "inspected.py", cwd=project, stdin=probe)
    mended = run_python("-i", "-m", "graphmend", "run", "inspected.py", cwd=project, stdin=probe)
    assert mended.returncode == plain.returncode
    assert (mended.stdout, mended.stderr) == (plain.stdout, plain.stderr)


def test_pdb_debugs_an_uncaught_error_post_mortem(project):
    (project / "debugged.py").write_text("x = 41\nraise ValueError('oops')\n")
    commands = "c\np x\nq\nq\n"
    plain = run_python("-m", "pdb", "debugged.py", cwd=project, stdin=commands)
    mended = run_python(
        "-m", "pdb", "-m", "graphmend", "run", "debugged.py", cwd=project, stdin=commands
    )
    for result in (plain, mended):
        assert "Entering post mortem debugging" in result.stdout
        assert "(Pdb) 41" in result.stdout


@pytest.mark.parametrize(
    ("source", "status"),
    [
        (b"print('ran')\n# caf\xe9\n", 1),  # no encoding declared: python refuses it
        (b"# -*- coding: utf-8 -*-\nprint('ran')\n# caf\xe9\n", 0),  # declared: it runs
        (b"print('ran')\n# coding: latin-1\n# caf\xe9\n", 1),  # a declaration after code
        (b"print('ran')\r# caf\xe9\r", 1),  # lines ended by \r
        (b"# caf\xe9\nprint('ran')\n", 1),  # on line 1
        # a BOM and a latin-1 declaration: python names no line, compile names line 0
        (b"\xef\xbb\xbf# -*- coding: latin-1 -*-\nprint('ran')\n", 1),
    ],
    ids=["undeclared", "declared", "declared-after-code", "carriage-returns", "first-line", "bom"],
)
@pytest.mark.parametrize("how", ["script", "stdin"])
def test_a_script_not_in_utf8_runs_or_fails_as_with_python(project, source, status, how):
    # run compiled the bytes, as an import does, which skips comments: a script python
    # refuses ran, and exited 0; with a declaration, the rewrite fell back with a warning
    (project / "latin.py").write_bytes(source)
    arguments = ["latin.py"] if how == "script" else ["-"]
    stdin = None if how == "script" else source
    environment = {**os.environ, "PYTHONPATH": python_path()}
    plain, mended = (
        subprocess.run(
            [sys.executable, *prefix, *arguments],
            input=stdin,
            capture_output=True,
            cwd=project,
            env=environment,
        )
        for prefix in ([], ["-m", "graphmend", "run"])
    )
    assert plain.returncode == mended.returncode == status
    assert (mended.stdout, mended.stderr) == (plain.stdout, plain.stderr)


@pytest.mark.parametrize(
    "arguments",
    [["-"], ["-c", b"print(1) #\xe9"], ["-c", b"\xef\xbb\xbfprint(1)"]],
    ids=["closed standard input", "a command the locale cannot decode", "a byte order mark"],
)
def test_what_python_cannot_read_is_reported_as_python_reports_it(project, arguments):
    # run - read sys.stdin.buffer of a closed standard input (None): GraphMend's own
    # traceback, where python runs an empty program; an undecodable command ran, and one
    # starting with a byte order mark (compiled as bytes, where python compiles text)
    environment = {**os.environ, "PYTHONPATH": python_path()}
    plain, mended = (
        subprocess.run(
            [sys.executable, *prefix, *arguments],
            stdin=subprocess.DEVNULL if arguments == ["-"] else None,
            capture_output=True,
            cwd=project,
            env=environment,
            close_fds=True,
            **({"preexec_fn": lambda: os.close(0)} if arguments == ["-"] else {}),
        )
        for prefix in ([], ["-m", "graphmend", "run"])
    )
    assert (mended.returncode, mended.stdout, mended.stderr) == (
        plain.returncode,
        plain.stdout,
        plain.stderr,
    )


@pytest.mark.xfail(
    strict=True,
    reason="a warning whose stacklevel points above the script's top frame is attributed "
    "by the interpreter to the next frame down: in plain python there is none ('sys:1'), "
    "under 'graphmend run' it is the runner's (runner.py); the warnings module walks the "
    "real stack (sys._getframe) and offers no way to hide frames before Python 3.12's "
    "skip_file_prefixes, which only the caller of warn() can pass",
)
def test_a_warning_pointing_above_the_script_is_attributed_as_with_python(project):
    (project / "above.py").write_text("import warnings\nwarnings.warn('above', stacklevel=2)\n")
    plain = run_python("above.py", cwd=project)
    mended = run_python("-m", "graphmend", "run", "above.py", cwd=project)
    assert plain.stderr == "sys:1: UserWarning: above\n"
    assert mended.stderr == plain.stderr


WARNING_SCRIPT = textwrap.dedent(
    """
    import torch

    def step(x, k):
        if x.sum() > 0:
            y = x * 2 + k
        else:
            y = x - 1
        assert k is not 2
        return y

    print(step(torch.ones(2), 1))
    """
)


def test_a_script_warns_and_fails_to_compile_as_with_python_every_run(project):
    # python compiles a script at every run (no .pyc): its compiler warnings show every
    # time, and under -W error it never runs, whatever GraphMend's cache holds.
    (project / "warns.py").write_text(WARNING_SCRIPT)
    for flags in (["-W", "always"], ["-W", "always"], ["-W", "error"]):
        plain = run_python(*flags, "warns.py", cwd=project)
        mended = run_python(*flags, "-m", "graphmend", "run", "warns.py", cwd=project)
        assert (mended.returncode, mended.stderr) == (plain.returncode, plain.stderr)
        assert "SyntaxWarning" in plain.stderr or "SyntaxError" in plain.stderr
        assert mended.stdout == plain.stdout


INTERRUPTED = textwrap.dedent(
    """
    import atexit
    import sys

    atexit.register(lambda: print("atexit ran", file=sys.stderr))

    def wait():
        raise KeyboardInterrupt

    wait()
    """
)


@pytest.mark.parametrize("hook", ["", "import sys\ndel sys.excepthook\n"], ids=["", "no hook"])
@pytest.mark.parametrize("as_module", [False, True], ids=["script", "module"])
def test_an_interrupted_script_ends_with_what_python_prints(project, as_module, hook):
    # Ctrl-C: the traceback of the script alone, then the atexit handlers, then the
    # exit by SIGINT, as with plain python.
    (project / "interrupted.py").write_text(hook + INTERRUPTED)
    target = ["-m", "interrupted"] if as_module else ["interrupted.py"]
    plain = run_python(*target, cwd=project)
    mended = run_python("-m", "graphmend", "run", *target, cwd=project)
    assert plain.returncode == mended.returncode == -signal.SIGINT
    assert mended.stderr == plain.stderr
    assert "graphmend" not in mended.stderr


def test_packages_option_adds_patterns(project, cache_dir):
    (project / "uses_pkg.py").write_text(
        "import pkg.tool\nprint(type(pkg.tool.__loader__).__name__)\n"
    )
    plain = run_python("-m", "graphmend", "run", "uses_pkg.py", cwd=project)
    extra = run_python("-m", "graphmend", "run", "-p", "pkg.*", "uses_pkg.py", cwd=project)
    assert plain.stdout.splitlines()[-1] == "SourceFileLoader"
    assert extra.stdout.splitlines()[-1] == "GraphMendLoader"


def test_exclusions_in_packages_option(project, cache_dir):
    (project / "uses_pkg.py").write_text(
        "import pkg.tool\nprint(type(pkg.tool.__loader__).__name__)\n"
    )
    excluded = run_python(
        "-m", "graphmend", "run", "-p", "pkg.*", "-p", "!pkg.tool", "uses_pkg.py", cwd=project
    )
    assert excluded.returncode == 0, excluded.stderr
    assert excluded.stdout.splitlines()[-1] == "SourceFileLoader"


REWRITTEN_OR_NOT = textwrap.dedent(
    """
    import torch

    def shout(x):
        print("shout")
        return x

    try:
        torch.compile(shout, backend="eager", fullgraph=True)(torch.ones(1))
        print("rewritten")
    except Exception:
        print("as written")
    """
)


@pytest.mark.parametrize(
    "program",
    [["excluded.py"], ["-c", REWRITTEN_OR_NOT], ["-"], ["excluded_dir"]],
    ids=["script", "command", "stdin", "directory"],
)
def test_an_exclusion_of_main_leaves_the_program_as_written(project, program):
    # run -p '!__main__' script.py rewrote the script all the same (-c and - too), where
    # a '!' pattern excludes what it matches whatever the others say, as it did for a
    # directory's __main__.py
    (project / "excluded.py").write_text(REWRITTEN_OR_NOT)
    (project / "excluded_dir").mkdir()
    (project / "excluded_dir" / "__main__.py").write_text(REWRITTEN_OR_NOT)
    stdin = REWRITTEN_OR_NOT if program == ["-"] else None
    result = run_python(
        "-m", "graphmend", "run", "-p", "!__main__", *program, cwd=project, stdin=stdin
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "as written\n"


CHILDREN = textwrap.dedent(
    """
    import concurrent.futures
    import multiprocessing
    import subprocess
    import sys

    import torch.utils.data

    PROBE = (
        "import claimed, graphmend.importer; "
        "print(isinstance(claimed.__loader__, graphmend.importer.GraphMendLoader))"
    )

    def probe():
        import claimed
        import graphmend.importer

        return isinstance(claimed.__loader__, graphmend.importer.GraphMendLoader)

    class Probes(torch.utils.data.Dataset):
        def __len__(self):
            return 1

        def __getitem__(self, index):
            return probe()

    if __name__ == "__main__":
        for method in ("spawn", "forkserver"):
            context = multiprocessing.get_context(method)
            with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
                print(method, pool.submit(probe).result())
        child = subprocess.run(
            [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True
        )
        print("subprocess", child.stdout.strip())
        workers = torch.utils.data.DataLoader(
            Probes(), num_workers=1, multiprocessing_context="spawn", batch_size=None
        )
        print("dataloader worker", next(iter(workers)))
    """
)


@pytest.mark.skipif(sys.platform == "win32", reason="forkserver is POSIX only")
def test_child_processes_install_the_hook_too(project):
    (project / "claimed.py").write_text("def f(x):\n    print(x)\n    return x\n")
    (project / "children.py").write_text(CHILDREN)
    result = run_python("-m", "graphmend", "run", "-p", "claimed", "children.py", cwd=project)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "spawn True",
        "forkserver True",
        "subprocess True",
        "dataloader worker True",
    ]


def test_a_reserved_module_runs_unclaimed_and_its_children_get_the_hook(project):
    (project / "claimed.py").write_text("def f(x):\n    print(x)\n    return x\n")
    probe = "import claimed, sys; print(type(claimed.__loader__).__name__)"
    # As torchrun would: python -m graphmend run -m torch.distributed.run train.py
    result = run_python(
        "-m", "graphmend", "run", "-p", "claimed", "-m", "timeit", "-n1", "-r1",
        f"import subprocess, sys; subprocess.run([sys.executable, '-c', {probe!r}])",
        cwd=project,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "GraphMendLoader"


def test_missing_script_is_one_line_and_exit_2_as_with_python(project):
    plain = run_python("missing.py", cwd=project)
    mended = run_python("-m", "graphmend", "run", "missing.py", "arg", cwd=project)
    assert plain.returncode == mended.returncode == 2
    assert mended.stderr == f"graphmend: can't open file {str(project / 'missing.py')!r}: " + (
        "[Errno 2] No such file or directory\n"
    )
    assert mended.stderr.split(": ", 1)[1] == plain.stderr.split(": ", 1)[1]


def _run_in_deleted_directory(
    directory: Path, *arguments: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run Python with ``arguments`` (our environment updated by ``env``) in
    ``directory``, made for it and deleted as it starts."""
    directory.mkdir()

    def enter_and_delete() -> None:
        os.chdir(directory)
        os.rmdir(directory)

    return subprocess.run(
        [sys.executable, *arguments],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": python_path(), **(env or {})},
        preexec_fn=enter_and_delete,
    )


@pytest.mark.skipif(sys.platform == "win32", reason="a working directory cannot be deleted")
def test_a_relative_script_in_a_deleted_directory_is_refused_as_python_refuses_it(tmp_path):
    # os.getcwd() raised FileNotFoundError: GraphMend's traceback, exit status 1
    plain = _run_in_deleted_directory(tmp_path / "plain", "where.py")
    mended = _run_in_deleted_directory(tmp_path / "mended", "-m", "graphmend", "run", "where.py")
    assert plain.returncode == mended.returncode == 2
    assert mended.stderr == "graphmend: can't open file 'where.py': " + (
        "[Errno 2] No such file or directory\n"
    )
    assert mended.stderr.split(": ", 1)[1] == plain.stderr.split(": ", 1)[1]


@pytest.mark.skipif(sys.platform == "win32", reason="a working directory cannot be deleted")
def test_a_relative_cache_dir_in_a_deleted_directory_is_a_bad_setting(project, tmp_path):
    # Path.absolute() raised FileNotFoundError: GraphMend's traceback from run, and "the
    # import hook was not installed: [Errno 2] No such file or directory" at startup
    script = project / "where.py"  # no torch: its libraries cannot load from there
    script.write_text("import sys\nprint(sys.argv, sys.path[0], __file__)\n")
    setting = {"GRAPHMEND_CACHE_DIR": "cache"}
    mended = _run_in_deleted_directory(
        tmp_path / "run", "-m", "graphmend", "run", str(script), env=setting
    )
    at_startup = _run_in_deleted_directory(
        tmp_path / "startup", str(script), env={"GRAPHMEND": "1", **setting}
    )
    problem = (
        "GRAPHMEND_CACHE_DIR='cache': a relative path needs the working directory, which "
        "cannot be read (No such file or directory)\n"
    )
    assert (mended.returncode, mended.stdout) == (2, "")
    assert mended.stderr == f"graphmend: error: {problem}"
    assert at_startup.returncode == 0 and at_startup.stdout.startswith("[")
    assert at_startup.stderr == f"graphmend: the import hook was not installed: {problem}"


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ([], "run needs a script or -m module"),
        (["-p"], "-p needs a PATTERN"),
        (["-m"], "-m needs a module name"),
        (["--bogus", "x.py"], "unknown option '--bogus'"),
        (["-p", "bad pattern!", "x.py"], "invalid module pattern"),
    ],
)
def test_usage_errors_exit_2(arguments, message):
    result = run_python("-m", "graphmend", "run", *arguments)
    assert result.returncode == 2
    assert message in result.stderr


def test_help_and_version():
    assert "usage: python -m graphmend run" in run_python("-m", "graphmend", "run", "-h").stdout
    assert run_python("-m", "graphmend", "--help").stdout.startswith("usage: python -m graphmend ")
    assert run_python("-m", "graphmend", "--version").stdout.startswith("graphmend ")


def test_console_script_help_names_the_console_script():
    script = Path(sys.executable).with_name("graphmend")
    if not script.exists():
        pytest.skip("the graphmend console script is not installed next to this interpreter")
    for arguments, usage in [
        (["--help"], "usage: graphmend "),
        (["run", "-h"], "usage: graphmend run"),
    ]:
        result = subprocess.run([str(script), *arguments], capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith(usage)
    bogus = subprocess.run([str(script), "run", "--bogus", "x.py"], capture_output=True, text=True)
    assert "(see 'graphmend run -h')" in bogus.stderr


def test_a_script_in_a_directory_named_like_graphmends_package_keeps_its_traceback(
    capsys, monkeypatch
):
    # Frames of files under GraphMend's package are dropped from the top of an uncaught
    # error's traceback; a script in graphmend_tools/ beside it is none of them (its whole
    # traceback was dropped: "ValueError: boom" alone).
    for name in ("last_type", "last_value", "last_traceback", "last_exc"):
        monkeypatch.setattr(sys, name, None, raising=False)
    script = str(Path(graphmend.__file__).parent.parent / "graphmend_tools" / "train.py")
    code = compile("def fail():\n    raise ValueError('boom')\nfail()\n", script, "exec")
    with pytest.raises(SystemExit):
        runner.report_uncaught(functools.partial(exec, code, {}))
    assert sys.last_value is not None
    frames = traceback.extract_tb(sys.last_value.__traceback__)
    assert [(frame.filename, frame.name) for frame in frames] == [
        (script, "<module>"),
        (script, "fail"),
    ]
    assert capsys.readouterr().err.startswith("Traceback (most recent call last):")


def test_a_script_that_cannot_be_rewritten_is_named_by_its_path(tmp_path):
    # The warning named the script "__main__" and was attributed to "<frozen runpy>:88",
    # a frame of python -m, where the user has no line to look at.
    script = tmp_path / "model_script.py"
    script.write_text("import torch\nprint('ran', torch.ones(1).item())\n")
    launcher = f"""
import runpy, sys
import graphmend.pipeline

def broken(*args, **kwargs):
    raise RecursionError("maximum recursion depth exceeded")

graphmend.pipeline.rewrite = broken
sys.argv = ["graphmend", "run", {str(script)!r}]
runpy.run_module("graphmend", run_name="__main__", alter_sys=True)
"""
    child = run_python("-c", launcher, env={"GRAPHMEND_CACHE": "0"})
    assert child.returncode == 0, child.stderr
    assert child.stdout == "ran 1.0\n"
    assert child.stderr == (
        f"graphmend could not rewrite {script} (RecursionError: maximum recursion depth "
        "exceeded); it runs unchanged\n"
    )
