"""The builtins the rewrites rely on, and what they see of them in this process.

A name bound nowhere in a module is a builtin.  T3 lowers ``raise Name(...)`` only
when ``Name`` is a builtin exception class, and T2 takes a builtin callable as
having the same value after the graph.  Programs add names to :mod:`builtins`
(IPython's ``display``, gettext's ``_``, ``builtins.Oops = ValueError``), so two
processes can see different builtins, and the cache shares rewritten code between
processes.  The rewrites therefore count only classes of the ``builtins`` module and
builtin functions, which those additions are not (so that a notebook and a script
share entries), and :func:`fingerprint`, part of the cache key, covers the rest.
"""

from __future__ import annotations

import builtins
import types


def interpreter_builtin(name: str) -> object | None:
    """``builtins.<name>`` when it is a class or function the interpreter defines, else None.

    Looked up in the module's namespace, not with ``getattr``: attributes of the module
    object (``__class__``, the module type; ``__dir__``, a builtin method) are no builtins,
    and ``__class__`` in a method is the method's own cell."""
    value = vars(builtins).get(name)
    if isinstance(value, type):
        return value if value.__module__ == "builtins" else None
    return value if isinstance(value, types.BuiltinFunctionType) else None


def fingerprint() -> str:
    """The builtins :func:`interpreter_builtin` finds here, each with its kind."""
    kinds = []
    for name in sorted(vars(builtins)):
        value = interpreter_builtin(name)
        if value is not None:
            exception = isinstance(value, type) and issubclass(value, BaseException)
            kinds.append(f"{name}:{'exception' if exception else 'callable'}")
    return ",".join(kinds)
