"""Iterators that ``torch.cond``'s branches advance, which TorchDynamo does not put back.

TorchDynamo traces the two branches of a ``torch.cond`` one after the other, and
refuses a branch that changes what exists outside it through its side-effect table
(a list appended to, an attribute stored, a list iterator advanced).  Some
iterators are advanced in place without that table (torch 2.13): a generator
traced by TorchDynamo (``LocalGeneratorObjectVariable``), a range iterator,
``enumerate``.  The second branch then starts where the first left off::

    it = gen()                  # yields 2, then 3
    if x.sum() > 0: ...         # continued: the rest reads next(it)
    k = next(it)

Both branches of continuation's ``cond`` read 2 and 3: the else branch computed
``x * 3`` where the original computes ``x * 2`` (plain ``torch.cond`` of two such
branches gives the same wrong value).  :class:`OuterIterators` watches such
advances while a ``cond`` is traced: one of an iterator made before it keeps the
break.  An iterator a branch makes itself (``for i, layer in enumerate(layers)``)
is made anew in each branch, and may advance.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: The methods by which TorchDynamo advances an iterator's variable (2.5: ``next_variable``).
_ADVANCING = ("tp_iternext_impl", "next_variable", "gen_send_ex2", "_setup_exception")

#: Generator methods that finish it.
_FINISHING = frozenset({"close", "throw"})


class OuterIterators:
    """While open (a ``with`` block), notes the first iterator advanced that was made
    before it opened: :attr:`advanced` names its type (``None``: none was)."""

    def __init__(self) -> None:
        self.advanced: str | None = None
        self._made: list[Any] = []  # held, so that their ids stay theirs
        self._made_ids: set[int] = set()
        self._saved: list[tuple[type, str, Any]] = []

    def __enter__(self) -> OuterIterators:
        roots = _iterator_classes()
        for root in roots:
            self._wrap(root, "__init__", self._noting_made)
        for cls in _with_subclasses(roots):
            for name in _ADVANCING:
                if name in vars(cls):
                    self._wrap(cls, name, self._noting_advance)
            if "call_method" in vars(cls) and cls.__name__ == "LocalGeneratorObjectVariable":
                self._wrap(cls, "call_method", self._noting_finish)
        return self

    def __exit__(self, *_exception: object) -> None:
        for cls, name, original in reversed(self._saved):
            if original is None:
                delattr(cls, name)
            else:
                setattr(cls, name, original)
        self._saved.clear()

    def _wrap(self, cls: type, name: str, make: Callable[[Any], Any]) -> None:
        self._saved.append((cls, name, vars(cls).get(name)))
        setattr(cls, name, make(getattr(cls, name)))

    def _noting_made(self, method: Any) -> Any:
        def init(variable: Any, *args: Any, **kwargs: Any) -> None:
            method(variable, *args, **kwargs)
            if id(variable) not in self._made_ids:
                self._made.append(variable)
                self._made_ids.add(id(variable))

        return init

    def _noting_advance(self, method: Any) -> Any:
        def advance(variable: Any, *args: Any, **kwargs: Any) -> Any:
            self._note(variable)
            return method(variable, *args, **kwargs)

        return advance

    def _noting_finish(self, method: Any) -> Any:
        def call_method(variable: Any, tx: Any, name: str, *args: Any, **kwargs: Any) -> Any:
            if name in _FINISHING:
                self._note(variable)
            return method(variable, tx, name, *args, **kwargs)

        return call_method

    def _note(self, variable: Any) -> None:
        if self.advanced is None and id(variable) not in self._made_ids:
            self.advanced = _type_name(variable)


def _iterator_classes() -> list[type]:
    """TorchDynamo's variables of iterators and generators on this release (raises
    ``ImportError`` where it has none)."""
    from torch._dynamo.variables import functions
    from torch._dynamo.variables import iter as iterators

    roots = [iterators.IteratorVariable]
    generator = getattr(functions, "LocalGeneratorObjectVariable", None)
    return roots if generator is None else [*roots, generator]


def _with_subclasses(roots: list[type]) -> list[type]:
    found: list[type] = []
    pending = list(roots)
    while pending:
        cls = pending.pop()
        if cls not in found:
            found.append(cls)
            pending.extend(cls.__subclasses__())
    return found


def _type_name(variable: Any) -> str:
    try:
        return variable.python_type().__name__
    except Exception:  # a variable that cannot tell: named by its class
        return type(variable).__name__
