"""Code for claimed modules: from the cache, or rewritten, or exactly as Python would load it.

This is where the contract "never break an import" is kept: any failure in
analysis, rewriting, compiling or the cache leaves the module to Python's own
loader, with one warning that names the module and the reason.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from types import CodeType

from graphmend.cache import BytecodeCache, fingerprint_still_holds
from graphmend.collector_pause import collector_paused
from graphmend.config import Config
from graphmend.directives import skipped_module
from graphmend.findings import describe_summary, summarize
from graphmend.notices import warn, write_stderr
from graphmend.post_import import importing_here


class Status(str, Enum):
    """What happened to a claimed module (the word ``GRAPHMEND_LOG=debug`` prints)."""

    CACHE_HIT = "cache hit"
    REWRITTEN = "rewritten"
    UNCHANGED = "unchanged"
    LEFT_ALONE = "left alone"
    FELL_BACK = "fell back"
    SYNTAX_ERROR = "syntax error"


@dataclass(frozen=True)
class Outcome:
    """What happened to one module, and the code to run (``None``: let Python load it)."""

    status: Status
    code: CodeType | None
    summary: dict[str, dict[str, int]] = field(default_factory=dict)
    reason: str = ""
    seconds: float = 0.0
    warns: bool = False  # compiling the original source issues warnings

    def describe(self) -> str:
        """One line for the debug log."""
        if self.status is Status.FELL_BACK:
            return f"fell back to the original code: {self.reason}"
        if self.status is Status.SYNTAX_ERROR:
            return "syntax error; left to Python to report"
        if self.status is Status.LEFT_ALONE:
            return f"{self.reason}; loaded as Python would"
        timing = f" in {self.seconds * 1000:.1f} ms" if self.status is not Status.CACHE_HIT else ""
        return f"{self.status.value} ({describe_summary(self.summary)}){timing}"


class ModuleRewriter:
    """Turns a claimed module's source into code, using the cache when it can."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.cache = BytecodeCache(config.cache_dir) if config.cache_enabled else None
        self._warned: set[str] = set()

    def code_for(
        self,
        module_name: str,
        filename: str,
        source: bytes,
        *,
        compile_as_python: Callable[[], object] | None = None,
    ) -> CodeType | None:
        """The code to execute for a module, or ``None`` to load it as Python would.

        ``compile_as_python``: Python's own loader of the module, called when compiling
        the source issues warnings (``"is" with a literal``): Python issues them when it
        compiles the source, and it does not where a valid ``.pyc`` exists; a filter that
        makes one an error raises its ``SyntaxError`` there, as Python's import does.
        """
        outcome = self.build(module_name, filename, source)
        if self.config.debug:
            write_stderr(f"graphmend: {module_name}: {outcome.describe()}\n")
        if outcome.status is Status.FELL_BACK and module_name not in self._warned:
            self._warned.add(module_name)
            script = module_name == "__main__"
            warn(
                f"graphmend could not rewrite {filename if script else module_name} "
                f"({outcome.reason}); it {'runs' if script else 'was imported'} unchanged"
            )
        if outcome.code is not None and outcome.warns and compile_as_python is not None:
            compile_as_python()
        return outcome.code

    def build(self, module_name: str, filename: str, source: bytes) -> Outcome:
        """Produce (or read back) the code for one module and say what happened."""
        skipped = skipped_module(source)  # a byte search, before the cache
        if skipped is not None:
            reason = f"{skipped.reason} (line {skipped.lineno})"
            return Outcome(Status.LEFT_ALONE, None, reason=reason)
        if importing_here("torch"):
            # Run by torch's own import (importlib's LazyLoader, inspect.getmodule): the
            # runtime that rewritten code imports needs all of torch.
            return Outcome(Status.LEFT_ALONE, None, reason="torch is being imported")
        started = time.perf_counter()
        cache = self.cache  # read once: another thread's import may turn it off
        key = self._cache_key(filename, source)
        if cache is not None and key is not None:
            entry = cache.load(module_name, key)
            if entry is not None:
                return Outcome(Status.CACHE_HIT, entry.code, entry.summary, warns=entry.warns)
        with collector_paused():
            outcome = self._rewrite(filename, source, started)
        if (
            outcome.code is not None
            and cache is not None
            and key is not None
            and fingerprint_still_holds()
        ):
            cache.store(module_name, key, outcome.code, outcome.summary, warns=outcome.warns)
        return outcome

    def _cache_key(self, filename: str, source: bytes) -> bytes | None:
        """The cache key of a module's code; ``None`` when there is no cache, or when the
        key cannot be computed (GraphMend's own source cannot be read: the cache is then
        turned off for this process, with a warning)."""
        if self.cache is None:
            return None
        try:
            return self.cache.key(source, filename, self.config.settings_key())
        except OSError as error:
            self.cache = None
            warn(
                f"graphmend does not use its cache: its own source cannot be read "
                f"({_describe(error)}). Modules are rewritten without the cache."
            )
            return None

    def _rewrite(self, filename: str, source: bytes, started: float) -> Outcome:
        # Only now, on a miss: a warm import loads none of the analysis and rewrites.
        from graphmend.pipeline import compile_noting_warnings, parse_quietly, rewrite

        try:
            tree, parser_warned = parse_quietly(source, filename)
        except SyntaxError:
            # Python's own loader raises the very same error, with its usual traceback.
            return Outcome(Status.SYNTAX_ERROR, None)
        except Exception as error:  # a RecursionError: the hook parses deeper in the stack
            return Outcome(Status.FELL_BACK, None, reason=f"parsing failed: {_describe(error)}")
        try:
            result = rewrite(source, filename, self.config.rewrites_to_run(), tree=tree)
        except Exception as error:
            return Outcome(Status.FELL_BACK, None, reason=_describe(error))
        try:
            code, compiler_warned = compile_noting_warnings(result.tree, filename)
        except Exception as error:
            if isinstance(error, SyntaxError) and _compiler_refuses(source, filename):
                return Outcome(Status.SYNTAX_ERROR, None)  # the user's: 'return' outside function
            return Outcome(Status.FELL_BACK, None, reason=f"compiling failed: {_describe(error)}")
        status = Status.REWRITTEN if result.changed else Status.UNCHANGED
        summary = summarize(result.findings)
        seconds = time.perf_counter() - started
        return Outcome(
            status, code, summary, seconds=seconds, warns=parser_warned or compiler_warned
        )


def _compiler_refuses(source: bytes, filename: str) -> bool:
    """Whether Python's compiler, not only the parser, rejects the original source (a
    ``return`` outside a function, a ``nonlocal`` of no binding): Python's own loader then
    raises the error, as without GraphMend."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Python's loader gives them, once
        try:
            compile(source, filename, "exec", dont_inherit=True)
        except SyntaxError:
            return True
    return False


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"
