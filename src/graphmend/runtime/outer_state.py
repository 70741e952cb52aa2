"""What ``torch.cond``'s branches change outside them that TorchDynamo does not put back.

TorchDynamo traces the two branches of a ``torch.cond`` one after the other, and
refuses a branch that changes what exists outside it through its side-effect table
(a list appended to, a list iterator advanced).  Two changes escape that (torch 2.13):

* Iterators advanced in place without the table: a generator traced by TorchDynamo
  (``LocalGeneratorObjectVariable``), a range iterator, ``enumerate``.  The second
  branch starts where the first left off: with ``it = gen()`` (2, then 3) before an
  ``if`` whose rest reads ``k = next(it)``, the else branch of continuation's ``cond``
  computed ``x * 3`` where the original computes ``x * 2`` (plain ``torch.cond`` of
  two such branches gives the same wrong value).
* An attribute of an object made before the ``cond`` set to a constant: TorchDynamo
  lets a branch do it if the branch sets it back (a flag flipped and restored), then
  drops the branch's stores; with ``BOX.v = 3 if y is None else 4`` and ``BOX.v``
  already 4, the else branch's store was dropped unchecked, and ``BOX.v`` stayed 4
  where the original sets 3.
* A hook registered on a tensor (``x.register_hook(fn)``,
  ``register_post_accumulate_grad_hook``): TorchDynamo registers it after the graph
  from its side-effect table, which ``torch.cond`` puts back after each branch, so the
  hook was silently lost (the caller's gradient came out unscaled), and one on a tensor
  that does not require grad no longer raised the original's ``RuntimeError``.

:class:`OuterState` watches all three while a ``cond`` is traced: any keeps the break.
An iterator or object a branch makes itself (``for i, layer in enumerate(layers)``)
is made anew in each branch, and may change.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: The methods by which TorchDynamo advances an iterator's variable (2.5: ``next_variable``).
_ADVANCING = ("tp_iternext_impl", "next_variable", "gen_send_ex2", "_setup_exception")

#: Generator methods that finish it.
_FINISHING = frozenset({"close", "throw"})


class OuterState:
    """While open (a ``with`` block), notes the first change to what was made before it
    opened: :attr:`changed` says what it was (``None``: nothing changed)."""

    def __init__(self) -> None:
        self.changed: str | None = None
        self._made: list[Any] = []  # held, so that their ids stay theirs
        self._made_ids: set[int] = set()
        self._saved: list[tuple[type, str, Any]] = []

    def __enter__(self) -> OuterState:
        try:
            self._watch()
        except BaseException:
            self.__exit__()  # what was wrapped before the failure is put back
            raise
        return self

    def _watch(self) -> None:
        from torch._dynamo.side_effects import SideEffects

        self._wrap(SideEffects, "store_attr", self._noting_store)
        self._wrap(SideEffects, "register_hook", self._noting_hook)
        roots = _iterator_classes()
        for root in roots:
            self._wrap(root, "__init__", self._noting_made)
        for cls in _with_subclasses(roots):
            for name in _ADVANCING:
                if name in vars(cls):
                    self._wrap(cls, name, self._noting_advance)
            if "call_method" in vars(cls) and cls.__name__ == "LocalGeneratorObjectVariable":
                self._wrap(cls, "call_method", self._noting_finish)

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

    def _noting_store(self, method: Any) -> Any:
        def store_attr(effects: Any, item: Any, name: str, *args: Any, **kwargs: Any) -> Any:
            if self.changed is None and not _made_in_this_branch(item):
                self.changed = f"stores attribute {name!r} of an object made before the if"
            return method(effects, item, name, *args, **kwargs)

        return store_attr

    def _noting_hook(self, method: Any) -> Any:
        def register_hook(effects: Any, tensor: Any, hook: Any, handle: Any, name: str) -> Any:
            if self.changed is None:
                self.changed = f"calls {name}() on a tensor, which torch.cond does not keep"
            return method(effects, tensor, hook, handle, name)

        return register_hook

    def _note(self, variable: Any) -> None:
        if self.changed is None and id(variable) not in self._made_ids:
            self.changed = f"advances a {_type_name(variable)} made before the if"


def _made_in_this_branch(item: Any) -> bool:
    """Whether TorchDynamo made ``item``'s variable in the branch it traces (a store to
    it needs no putting back)."""
    from torch._dynamo.variables.base import is_side_effect_safe

    # 2.5 names it mutable_local: without it, every store there was taken for an outer one
    mutation = getattr(item, "mutation_type", None) or getattr(item, "mutable_local", None)
    return mutation is not None and is_side_effect_safe(mutation)


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
