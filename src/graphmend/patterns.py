"""Module-name patterns: which dotted module names GraphMend claims.

A pattern is either a dotted name (``mypkg.models``), which matches that module
and everything below it, or a glob (``transformers.models.*``,
``*.modeling_*``) matched against the whole dotted name, where ``*`` also
crosses dots.  A pattern starting with ``!`` is an exclusion: a name it matches
is never claimed, whatever the other patterns say.  Names are rejected on their
first component before any regular expression runs, because the import hook
asks about every import in the process.

Some modules are never claimed (:func:`reserved`): GraphMend's own, and
everything its runtime imports, because rewriting them would make GraphMend
import itself (or torch) half-initialised.  A pattern that names one of them is
an error.
"""

from __future__ import annotations

import fnmatch
import re
import sys
from collections.abc import Iterable

_GLOB_CHARS = frozenset("*?[")
EXCLUDE = "!"

# A component of a glob: name characters, ``*``, ``?`` and closed bracket
# expressions such as ``[a-z]`` or ``[!_]``.
_GLOB_COMPONENT = re.compile(r"(?:[\w*?]|\[!?[\w-]+\])+")

#: Top-level packages GraphMend never claims besides the standard library:
#: GraphMend itself and its startup shim, torch (with ``functorch`` and
#: ``torchgen`` from the same wheel), and the packages torch imports while a
#: program imports and compiles: its declared dependencies and theirs (what
#: ``import torch`` and an Inductor compile put in ``sys.modules`` on torch
#: 2.13, setuptools' vendored packages included), and the optional ones it
#: imports when they are installed (triton, CUDA bindings, optree, einops).
RESERVED_PACKAGES: frozenset[str] = frozenset(
    {
        "graphmend",
        "graphmend_hook",
        "torch",
        "functorch",
        "torchgen",
        "triton",
        "numpy",
        "sympy",
        "mpmath",
        "networkx",
        "jinja2",
        "markupsafe",
        "filelock",
        "fsspec",
        "typing_extensions",
        "packaging",
        "tqdm",
        "setuptools",
        "pkg_resources",
        "_distutils_hack",
        "jaraco",
        "more_itertools",
        "backports",
        "nvidia",
        "cuda",
        "optree",
        "opt_einsum",
        "einops",
    }
)

_RESERVED_ROOTS: frozenset[str] = RESERVED_PACKAGES | frozenset(sys.stdlib_module_names)


class PatternError(ValueError):
    """A module pattern that cannot be a dotted module name or a glob over one."""


def is_glob(pattern: str) -> bool:
    """Whether ``pattern`` uses glob characters (``*``, ``?``, ``[``)."""
    return any(char in _GLOB_CHARS for char in pattern)


def reserved(name: str) -> bool:
    """Whether the module ``name`` is one GraphMend never claims."""
    return name.partition(".")[0] in _RESERVED_ROOTS


def _check(pattern: str) -> str:
    cleaned = pattern.strip()
    if not cleaned or cleaned == EXCLUDE:
        raise PatternError(f"empty module pattern {pattern!r}")
    body = cleaned[1:] if cleaned.startswith(EXCLUDE) else cleaned
    components = body.split(".")
    if not all(
        _GLOB_COMPONENT.fullmatch(part) if is_glob(part) else part.isidentifier()
        for part in components
    ):
        raise PatternError(
            f"invalid module pattern {pattern!r}: use a dotted module name such as "
            "'mypkg.models', a glob such as 'transformers.models.*', or either after "
            "'!' to exclude"
        )
    if body is cleaned:
        _check_not_reserved(cleaned, components[0])
    return cleaned


def _check_not_reserved(pattern: str, root: str) -> None:
    """Refuse a pattern that names a reserved package or matches one.

    A glob is refused when it matches a reserved top-level name (``*``,
    ``t*``) or its first component does (``?orch.*``); a first component of
    stars alone (``*.modeling_*``) stands for any prefix, not a package, and
    the finder refuses reserved names whatever the patterns.
    """
    if not is_glob(root):
        hits = [root] if root in _RESERVED_ROOTS else []
    else:
        hits = sorted(
            (
                name
                for name in _RESERVED_ROOTS
                if fnmatch.fnmatchcase(name, pattern)
                or (root.strip("*") and fnmatch.fnmatchcase(name, root))
            ),
            key=lambda name: (
                name not in ("graphmend", "torch"),
                name not in RESERVED_PACKAGES,
                name,
            ),
        )
    if hits:
        shown = ", ".join(hits[:3]) + (f" and {len(hits) - 3} more" if len(hits) > 3 else "")
        raise PatternError(
            f"module pattern {pattern!r} would claim {shown}: GraphMend never rewrites "
            "itself, torch, the packages torch imports or the standard library"
        )


def _regex_for(pattern: str) -> str:
    if is_glob(pattern):
        return fnmatch.translate(pattern)
    return re.escape(pattern) + r"(?:\..+)?\Z"


def _regex(patterns: Iterable[str]) -> re.Pattern[str] | None:
    joined = "|".join(f"(?:{_regex_for(pattern)})" for pattern in patterns)
    return re.compile(joined) if joined else None


def _root(pattern: str) -> str:
    return pattern.split(".", 1)[0]


class ModuleMatcher:
    """Decides quickly whether a dotted module name is claimed by a set of patterns."""

    def __init__(self, patterns: Iterable[str]) -> None:
        checked = tuple(dict.fromkeys(_check(p) for p in patterns))
        #: The inclusion patterns.
        self.patterns: tuple[str, ...] = tuple(p for p in checked if not p.startswith(EXCLUDE))
        #: The exclusion patterns, without their ``!``.
        self.exclusions: tuple[str, ...] = tuple(p[1:] for p in checked if p.startswith(EXCLUDE))
        roots = {_root(pattern) for pattern in self.patterns}
        # Only when every pattern starts with a literal package can names be
        # rejected by their first component alone.
        self._roots: frozenset[str] | None = (
            None if any(is_glob(root) for root in roots) else frozenset(roots)
        )
        self._regex = _regex(self.patterns)
        self._excluded = _regex(self.exclusions)

    def matches(self, name: str) -> bool:
        """Whether ``name`` is claimed: some pattern matches it and no exclusion does."""
        if self._regex is None:
            return False
        if self._roots is not None and name.partition(".")[0] not in self._roots:
            return False
        if self._regex.match(name) is None:
            return False
        return not self.excludes(name)

    def excludes(self, name: str) -> bool:
        """Whether an exclusion pattern matches ``name``."""
        return self._excluded is not None and self._excluded.match(name) is not None

    def roots(self) -> tuple[str, ...]:
        """Top-level packages named literally by the patterns (glob roots excluded)."""
        return tuple(
            dict.fromkeys(
                _root(pattern) for pattern in self.patterns if not is_glob(_root(pattern))
            )
        )

    def __repr__(self) -> str:
        shown = [*self.patterns, *(EXCLUDE + p for p in self.exclusions)]
        return f"ModuleMatcher({shown!r})"
