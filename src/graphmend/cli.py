"""Command line: ``python -m graphmend run | report | explain | diff | cache | check``."""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from collections.abc import Callable, Sequence

from graphmend import __version__
from graphmend.cache import SHARED, Access, BytecodeCache
from graphmend.config import Config, ConfigError
from graphmend.discovery import DiscoveryError, discover
from graphmend.import_closure import imported_modules
from graphmend.notices import command_line, flush, write_stderr
from graphmend.patterns import ModuleMatcher, PatternError
from graphmend.rewriter import ModuleRewriter, Status
from graphmend.runner import ScriptError, run_command, run_module, run_path

_RUN_USAGE = """\
usage: {prog} run [-p PATTERN]... [--] script.py [args...]
       {prog} run [-p PATTERN]... -m module [args...]
       {prog} run [-p PATTERN]... -c command [args...]
       {prog} run [-p PATTERN]... - [args...]      (the program from standard input)

Run a script or module as plain python would, with the import hook installed.
The script (or module) itself is rewritten too, unless a '!' pattern excludes
it ('!__main__' for a script, -c, - or a directory). The settings go into the
environment (GRAPHMEND=1, GRAPHMEND_PACKAGES, ...), so child Python processes
(multiprocessing with spawn or forkserver, subprocesses) install the hook too.

options:
  -p, --packages PATTERN  also claim modules matching PATTERN, or with '!PATTERN'
                          never claim them (repeatable; added to the default
                          scope or GRAPHMEND_PACKAGES)
  -h, --help              show this help and exit
"""


_REPORT_USAGE = """\
usage: {prog} report [--compare] [--json] [-p PATTERN]... script.py[:FUNCTION] [args...]

Run a script with GraphMend and report each graph break that remains in the calls
it compiles: its line, its kind, and what GraphMend decided there (not in scope,
not a candidate, declined and why, or rewritten but a check failed while tracing,
with the values it saw), with what you can do about it.

Without :FUNCTION the script runs as python would run it, eagerly: each callable
it passes to torch.compile is reported on its first call. With :FUNCTION the
script is loaded without running its __main__ block, and FUNCTION() returns
(model, args) or (model, args, kwargs).

options:
  --compare               run the script again without GraphMend, in a fresh
                          process, and report the breaks removed and the graph
                          counts before and after
  --json                  print JSON instead of text; what the script prints
                          goes to stderr
  -p, --packages PATTERN  also claim modules matching PATTERN ('!PATTERN' never)
  -h, --help              show this help and exit
"""


class UsageError(Exception):
    """Bad command-line usage; reported with exit status 2."""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m graphmend`` and the ``graphmend`` script."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    return with_errors_reported(lambda: _command(arguments, program_name()))


def _command(arguments: list[str], prog: str) -> int:
    """The command ``arguments`` name, run; its exit status."""
    if arguments and arguments[0] == "run":
        return _run(arguments[1:], prog)
    if arguments and arguments[0] == "report":
        return _quiet_when_the_reader_leaves(lambda: _report(arguments[1:], prog))
    return _quiet_when_the_reader_leaves(lambda: _dispatch(_parser(prog).parse_args(arguments)))


def with_errors_reported(action: Callable[[], int]) -> int:
    """``action()``, a command of GraphMend's; a usage, setting or script error it raises
    is reported in one line on stderr, exit status 2."""
    try:
        with command_line(sys.argv[0]):
            return action()
    except (UsageError, ConfigError, PatternError, DiscoveryError) as error:
        write_stderr(f"graphmend: error: {error}\n")
        return 2
    except ScriptError as error:
        write_stderr(f"graphmend: {error}\n")
        return 2


def _quiet_when_the_reader_leaves(action: Callable[[], int]) -> int:
    """``action()``, GraphMend's own output; where its reader went away (``| head``),
    stop quietly with status 1, as diff and grep do."""
    try:
        status = action()
        flush(sys.stdout)  # here, not at exit: buffered output meets the closed pipe now
        return status
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def program_name() -> str:
    """How this command was invoked: ``python -m graphmend``, or the script's name."""
    invoked = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return "python -m graphmend" if invoked in ("", "__main__.py") else invoked


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Rewrite PyTorch model code at import so torch.compile captures one graph.",
    )
    parser.add_argument("--version", action="version", version=f"graphmend {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser("run", help="run a script or module with the hook (see 'run -h')")
    commands.add_parser(
        "report",
        help="run a script and explain each graph break that remains (see 'report -h')",
    )
    commands.add_parser(
        "check",
        help="report the settings, the hook, the cache and torch; exit 1 on any problem",
        description="Report the effective settings (and where each came from), whether the "
        "hook is active in this environment, the cache directory and torch. Exit status: 0 "
        "when nothing is a problem, 1 otherwise (for container health checks).",
    )
    cache = commands.add_parser("cache", help="inspect, clear or warm the bytecode cache")
    actions = cache.add_subparsers(dest="action", required=True, metavar="ACTION")
    actions.add_parser("info", help="where the cache is, how many entries, their size")
    actions.add_parser("clear", help="delete every entry")
    warm = actions.add_parser(
        "warm",
        help="rewrite and store every module matching PATTERN, and the modules of the "
        "scope they import, without running them",
        description="Rewrite and store every module matching PATTERN, and every module of "
        "the scope (GRAPHMEND_PACKAGES, else the default) that they import, found from "
        "their import statements; nothing is imported or run. Directories it creates are "
        "readable by everyone (0755), so that other users can read a cache warmed at "
        "image build time.",
    )
    warm.add_argument("patterns", nargs="+", metavar="PATTERN")
    warm.add_argument(
        "--no-imports",
        action="store_true",
        help="warm only the modules matching PATTERN, not the modules of the scope they import",
    )
    explain = commands.add_parser(
        "explain",
        parents=[_targets_parser()],
        help="list every candidate site of some modules and what was decided, without importing",
        description="List every candidate site of some modules and what was decided. A "
        "candidate site is a statement whose condition may need tensor data, in a function "
        "TorchDynamo may trace: conditions on Python values (flags, isinstance(), shapes, "
        "dtypes, kwargs.get(...)) are not listed, and neither is code in a class's __init__ "
        "or __init_subclass__, which runs when the model is built, before torch.compile "
        "traces it (the functions defined in them are listed).",
        epilog=_TARGETS_EPILOG,
    )
    explain.add_argument(
        "--declined-only", action="store_true", help="list only the sites left as they were"
    )
    diff = commands.add_parser(
        "diff",
        parents=[_targets_parser()],
        help="show the rewritten functions of some modules as a diff, without importing",
        epilog=_TARGETS_EPILOG,
    )
    diff.add_argument(
        "-U", "--context", type=int, default=3, metavar="N", help="lines of context (default 3)"
    )
    return parser


_TARGETS_EPILOG = """\
TARGET is a module name (a package stands for everything below it), a glob over
module names ('transformers.models.*.modeling_bart*') or a path to a .py file;
'!PATTERN' leaves out the modules PATTERN matches ('!*.modeling_tf_*').
Nothing is imported or run. Exit status: 0 when every target was read, 1 when
some could not be (reported on stderr; the others are still shown), 2 for usage
errors.
"""


def _targets_parser() -> argparse.ArgumentParser:
    """The arguments ``explain`` and ``diff`` share."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument(
        "targets",
        nargs="+",
        metavar="TARGET",
        help="module name, glob over module names, or .py file",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.add_argument(
        "--rewrites",
        metavar="A,B",
        help="comma-separated rewrites to apply (default: GRAPHMEND_REWRITES, else all)",
    )
    return parser


def _dispatch(options: argparse.Namespace) -> int:
    if options.command in ("explain", "diff"):
        return _explain_or_diff(options)
    if options.command == "check":
        from graphmend.check import check

        return check()
    config = Config.from_env()
    if options.action == "info":
        return _cache_info(config)
    if options.action == "clear":
        return _cache_clear(config)
    return _cache_warm(config, options.patterns, follow_imports=not options.no_imports)


def _explain_or_diff(options: argparse.Namespace) -> int:
    from graphmend.diffing import diff
    from graphmend.explain import chosen_rewrites, explain

    rewrites = chosen_rewrites(options.rewrites)
    if options.command == "diff" and options.context < 0:
        raise UsageError("--context must be 0 or more")
    if options.command == "explain":
        return explain(
            options.targets, rewrites, as_json=options.json, declined_only=options.declined_only
        )
    return diff(options.targets, rewrites, as_json=options.json, context=options.context)


def _run(arguments: list[str], prog: str) -> int:
    options = _leading_options(arguments, "run", prog, flags=("-m", "-c"))
    if options is None:
        return _quiet_when_the_reader_leaves(
            lambda: print(_RUN_USAGE.format(prog=prog), end="") or 0
        )
    extra, flags, rest = options
    for flag, run, needs in (("-m", run_module, "a module name"), ("-c", run_command, "a command")):
        if flag in flags:
            if not rest:
                raise UsageError(f"{flag} needs {needs}")
            run(rest[0], rest[1:], _run_config(extra))
            return 0
    if not rest:
        raise UsageError(f"run needs a script or -m module (see '{prog} run -h')")
    run_path(rest[0], rest[1:], _run_config(extra))
    return 0


def _report(arguments: list[str], prog: str) -> int:
    from graphmend.report_script import report_script

    options = _leading_options(arguments, "report", prog, flags=("--compare", "--json"))
    if options is None:
        print(_REPORT_USAGE.format(prog=prog), end="")
        return 0
    extra, flags, rest = options
    if not rest:
        raise UsageError(f"report needs a script (see '{prog} report -h')")
    return report_script(
        rest[0],
        rest[1:],
        _run_config(extra),
        compare="--compare" in flags,
        as_json="--json" in flags,
    )


def _leading_options(
    arguments: list[str], command: str, prog: str, *, flags: tuple[str, ...]
) -> tuple[list[str], set[str], list[str]] | None:
    """The ``-p PATTERN`` options and ``flags`` before the script, and what follows
    (from ``-m``'s module or ``-c``'s command on, when a flag); ``None`` for ``-h``."""
    extra: list[str] = []
    seen: set[str] = set()
    index = 0
    while index < len(arguments):
        argument = arguments[index]
        if argument in ("-h", "--help"):
            return None
        if argument in ("-p", "--packages"):
            if index + 1 >= len(arguments):
                raise UsageError(f"{argument} needs a PATTERN")
            extra.append(arguments[index + 1])
            index += 2
        elif argument.startswith("--packages="):
            extra.append(argument.split("=", 1)[1])
            index += 1
        elif argument.startswith("-p") and len(argument) > 2:
            extra.append(argument[2:])
            index += 1
        elif argument == "--":  # the end of the options: the script follows
            index += 1
            break
        elif argument in flags:
            seen.add(argument)
            index += 1
            if argument in ("-m", "-c"):
                break
        elif argument[:2] in ("-m", "-c") and argument[:2] in flags:
            # joined, as python takes them: -mpkg, -c'print(1)'
            seen.add(argument[:2])
            return extra, seen, [argument[2:], *arguments[index + 1 :]]
        elif argument.startswith("-") and argument != "-":  # "-": standard input
            raise UsageError(f"unknown option {argument!r} (see '{prog} {command} -h')")
        else:
            break
    return extra, seen, arguments[index:]


def _run_config(extra: list[str]) -> Config:
    return Config.from_env().with_more_packages(extra)


def _cache_info(config: Config) -> int:
    """Print where the cache is and what it holds; 1 when that cannot be read, or is
    not used (what ``access`` says)."""
    cache = BytecodeCache(config.cache_dir)
    check = cache.check()
    state = "on" if config.cache_enabled else "off (GRAPHMEND_CACHE=0)"
    print(f"directory: {cache.directory}")
    print(f"state:     {state}")
    print(f"access:    {check.access.value}" + (f" ({check.reason})" if check.reason else ""))
    try:
        info = cache.info()
    except OSError as error:
        print(f"entries:   unknown ({error.filename} cannot be listed: {error.strerror})")
        return 1
    if check.access is Access.UNUSABLE:
        print("entries:   not counted (the cache is not used: see access)")
        return 1
    print(f"entries:   {info.entries}")
    print(f"size:      {_human_size(info.size_bytes)}")
    for problem in info.distrusted:  # another interpreter's directory
        print(f"not counted: {problem}")
    return 0


def _cache_clear(config: Config) -> int:
    """Delete every entry; 1, each reason on stderr, when some could not be deleted."""
    cleared = BytecodeCache(config.cache_dir).clear()
    plural = "y" if cleared.removed == 1 else "ies"
    print(f"removed {cleared.removed} entr{plural} from {config.cache_dir}")
    for problem in cleared.problems:
        write_stderr(f"graphmend: error: {problem}\n")
    return 1 if cleared.problems else 0


def _cache_warm(config: Config, patterns: list[str], *, follow_imports: bool) -> int:
    if not config.cache_enabled:
        raise UsageError("the cache is off (GRAPHMEND_CACHE=0); nothing to warm")
    matching = discover(ModuleMatcher(patterns))
    if not matching:
        raise UsageError(f"no modules on sys.path match {' '.join(patterns)}")
    cache = BytecodeCache(config.cache_dir)
    check, problems = cache.check(), []
    if check.access is not Access.READ_WRITE or not cache.create_directories(SHARED, problems):
        reason = check.reason or "; ".join(problems) or "its directories cannot be created"
        raise UsageError(f"cannot warm the cache in {config.cache_dir}: {reason}")
    imported = imported_modules(matching, ModuleMatcher(config.packages)) if follow_imports else []
    modules = matching + imported
    rewriter = ModuleRewriter(config)
    progress = _Progress(len(modules))
    statuses: Counter[Status] = Counter()
    for module in modules:
        try:
            source = module.path.read_bytes()
        except OSError as error:
            progress.show(module.name, f"unreadable: {error}")
            statuses[Status.FELL_BACK] += 1
            continue
        outcome = rewriter.build(module.name, str(module.path), source)
        statuses[outcome.status] += 1
        progress.show(module.name, outcome.describe())
    progress.finish()
    summary = ", ".join(f"{count} {status.value}" for status, count in statuses.most_common())
    what = f"{_modules(len(matching))} matching {' '.join(patterns)}"
    if follow_imports:
        what += f" and {_modules(len(imported))} of the scope they import"
    print(f"warmed {what} into {config.cache_dir}: {summary}")
    return 1 if statuses[Status.FELL_BACK] else 0


def _modules(count: int) -> str:
    return f"{count} module{'' if count == 1 else 's'}"


class _Progress:
    """One line per module, or a single updating line on a terminal."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.done = 0
        self.live = sys.stderr is not None and sys.stderr.isatty()

    def show(self, name: str, message: str) -> None:
        self.done += 1
        line = f"[{self.done:>{len(str(self.total))}}/{self.total}] {name}: {message}"
        write_stderr("\r\033[K" + line[:200] if self.live else line + "\n", flush=True)

    def finish(self) -> None:
        if self.live:
            write_stderr("\n")


def _human_size(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
