"""Tests of a tensor built from Python values, decided from those values.

Code that builds a tensor from a list of Python booleans and then branches on its
items breaks the graph at every such branch: TorchDynamo sees a tensor, not the
values it was built from (transformers 4.4x-4.5x ``HybridCache.__init__``, run
inside ``forward`` when no cache is given)::

    self.is_sliding = torch.tensor([bool((i + 1) % k) for i in range(n)], dtype=torch.bool)
    for i in range(n):
        shape = global_shape if not self.is_sliding[i] else sliding_shape

This rewrite keeps the list and the tensor in two injected locals where the tensor
is made, and makes each test of an item ask
:func:`graphmend.runtime.from_python.item_from_python`::

    self.is_sliding = (made := torch.tensor((values := [...]), dtype=torch.bool))
    ...
        sliding = item_from_python(self.is_sliding, i, made, values)  # in the test, as written

Eagerly that is ``self.is_sliding[i]``; while tracing it is ``values[i]`` only where
that has the item's truth for certain (the same tensor, built from booleans, an index
in range), else the item as before.  Statically a site is declined where anything
could update the tensor after it is made: a read other than by such tests, a nested
scope or ``locals()`` that sees it, and for an attribute (``self.flags``) a call that
is not to torch, a builtin or a method of a list or dict stored there, or that is
handed ``self``.  Code the original ran only after its break must be traceable too:
``torch._dynamo.mark_static_address(t)`` (which TorchDynamo refuses to trace) is made
after the graph, on the tensor the graph gives, and a site followed by any other
``torch._dynamo`` or ``torch.compiler`` call is declined.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from graphmend.analysis.bindings import is_attribute_chain
from graphmend.analysis.purity import qualified_name
from graphmend.findings import Decision
from graphmend.rewrites.common import (
    FRAME_INTROSPECTION,
    Decline,
    ModuleContext,
    is_generated,
    is_left_alone,
    load,
    runtime_call,
    store,
)

_NESTED_SCOPES = (
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.Lambda,
    ast.ClassDef,
    ast.ListComp,
    ast.SetComp,
    ast.DictComp,
    ast.GeneratorExp,
)
_BLOCKS = ("body", "orelse", "finalbody")
_TRIES = tuple(getattr(ast, name) for name in ("Try", "TryStar") if hasattr(ast, name))
_DISPLAYS = (ast.List, ast.Dict, ast.Set)
#: The values a tensor is made of: a new sequence, which nothing else can change.
_NEW_SEQUENCES = (ast.List, ast.Tuple, ast.ListComp)
#: Methods of a list, dict or set, which change only the container.
_CONTAINER_METHODS = frozenset(
    "append extend insert pop remove clear add discard update setdefault".split()
)
#: Modules of functions that TorchDynamo may refuse to trace (``forbid_in_graph``).
_TRACER_MODULES = ("torch._dynamo.", "torch.compiler.", "torch._C._dynamo.")
_MARK_STATIC = "torch._dynamo.mark_static_address"


@dataclass
class _Made:
    """A statement ``target = torch.tensor(values, ...)`` and the tests of its items after it."""

    statement: ast.Assign
    later: list[ast.stmt]  # of its block: where its tests are
    after: list[ast.stmt]  # what else may run later: after its block, its loops again
    containers: frozenset[str]  # locals holding a list, dict or set made in the function
    tests: list[tuple[ast.AST, str, ast.Subscript]] = field(default_factory=list)


class FromPythonRewrite:
    """Decide tests of a tensor's items from the Python values it was built from."""

    name = "from_python"

    def __init__(self, module: ModuleContext) -> None:
        self.module = module

    def run(self, tree: ast.Module) -> None:
        """Rewrite every function of the module in place, recording a finding per site."""
        if "tensor" in self.module.text:
            self._visit(tree.body, (), [])

    def _visit(
        self, block: list[ast.stmt], functions: tuple[ast.AST, ...], names: list[str]
    ) -> None:
        for statement in block:
            if is_left_alone(statement) or is_generated(statement):
                continue
            if isinstance(statement, ast.ClassDef):
                self._visit(statement.body, functions, [*names, statement.name])
            elif isinstance(statement, ast.FunctionDef):
                inner = (*functions, statement)
                qualname = [*names, statement.name]
                self._rewrite_function(statement, inner, ".".join(qualname))
                self._visit(statement.body, inner, [*qualname, "<locals>"])
            elif not isinstance(statement, ast.AsyncFunctionDef):
                for nested in _blocks_of(statement):
                    self._visit(nested, functions, names)

    def _rewrite_function(
        self, function: ast.FunctionDef, functions: tuple[ast.AST, ...], qualname: str
    ) -> None:
        called = self._called(functions)
        for made in self._tensors_made(function, functions):
            _find_tests(made)
            if not made.tests:
                continue
            try:
                _check_kept(made, called)
            except Decline as decline:
                self._record(made.statement, qualname, Decision.DECLINED, str(decline))
                continue
            self._rewrite(made, called)
            self._record(
                made.statement,
                qualname,
                Decision.REWRITTEN,
                "tests of its items are decided from the Python values it is made of",
            )

    def _called(self, functions: tuple[ast.AST, ...]) -> Callable[[ast.Call], str | None]:
        """What a call of the function calls, through the module's imports."""
        return lambda call: qualified_name(call.func, self.module.scopes, functions)

    def _tensors_made(
        self, function: ast.FunctionDef, functions: tuple[ast.AST, ...]
    ) -> Iterator[_Made]:
        containers = _local_containers(function)
        for block, after in _statement_blocks(function.body, []):
            for index, statement in enumerate(block):
                if self._makes_tensor(statement, functions):
                    assert isinstance(statement, ast.Assign)
                    yield _Made(statement, block[index + 1 :], after, containers)

    def _makes_tensor(self, statement: ast.stmt, functions: tuple[ast.AST, ...]) -> bool:
        if not (isinstance(statement, ast.Assign) and len(statement.targets) == 1):
            return False
        target, call = statement.targets[0], statement.value
        return (
            (
                isinstance(target, ast.Name)
                or (isinstance(target, ast.Attribute) and is_attribute_chain(target))
            )
            and isinstance(call, ast.Call)
            and len(call.args) == 1
            and isinstance(call.args[0], _NEW_SEQUENCES)
            and all(keyword.arg is not None for keyword in call.keywords)
            and qualified_name(call.func, self.module.scopes, functions) == "torch.tensor"
        )

    def _rewrite(self, made: _Made, called: Callable[[ast.Call], str | None]) -> None:
        for statement in [*made.later, *made.after]:
            for node in _walk_scope(statement):
                if isinstance(node, ast.Call) and called(node) == _MARK_STATIC:
                    node.func = _located(runtime_call("mark_static_address").func, node.func)
        names = self.module.fresh_names("made", "values")
        call = made.statement.value
        assert isinstance(call, ast.Call)
        values = call.args[0]
        call.args[0] = _located(ast.NamedExpr(target=store(names["values"]), value=values), values)
        made.statement.value = _located(
            ast.NamedExpr(target=store(names["made"]), value=call), call
        )
        for parent, field_name, test in made.tests:
            asked = runtime_call(
                "item_from_python",
                test.value,
                test.slice,
                load(names["made"]),
                load(names["values"]),
            )
            _replace(parent, field_name, test, _located(asked, test))

    def _record(self, node: ast.stmt, qualname: str, decision: Decision, reason: str) -> None:
        self.module.record(self.name, node, qualname, decision, reason)


def _located(node: ast.expr, like: ast.expr) -> ast.expr:
    """``node`` (new, around ``like``) and its new parts placed where ``like`` is."""
    for part in ast.walk(node):
        if not hasattr(part, "lineno"):
            ast.copy_location(part, like)
    return node


def _blocks_of(statement: ast.stmt) -> Iterator[list[ast.stmt]]:
    for field_name in _BLOCKS:
        block = getattr(statement, field_name, None)
        if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
            yield block
    for holder in [*getattr(statement, "handlers", []), *getattr(statement, "cases", [])]:
        yield holder.body


def _statement_blocks(
    block: list[ast.stmt], after: list[ast.stmt]
) -> Iterator[tuple[list[ast.stmt], list[ast.stmt]]]:
    """``block`` and the blocks of its statements, not those of nested definitions; each
    with the statements that may run after it ends (``after``, for ``block``): those
    after the statements holding it, the whole of the loops holding it, and the
    handlers and ``finally`` of the ``try`` statements holding it."""
    yield block, after
    for index, statement in enumerate(block):
        if not isinstance(statement, _NESTED_SCOPES):
            following = [*block[index + 1 :], *after]
            if isinstance(statement, ast.For | ast.While):
                following = [statement, *following]
            for nested, then in _nested_blocks(statement, following):
                yield from _statement_blocks(nested, then)


def _nested_blocks(
    statement: ast.stmt, following: list[ast.stmt]
) -> Iterator[tuple[list[ast.stmt], list[ast.stmt]]]:
    """The blocks of ``statement``, each with the statements that may run after it ends:
    ``following``, and first, after a ``try``'s body its handlers, ``else`` and
    ``finally``, after its handlers and ``else`` its ``finally``."""
    if not isinstance(statement, _TRIES):
        for nested in _blocks_of(statement):
            yield nested, following
        return
    final = [*statement.finalbody, *following]
    handled = [part for handler in statement.handlers for part in handler.body]
    yield statement.body, [*handled, *statement.orelse, *final]
    for nested in [*(handler.body for handler in statement.handlers), statement.orelse]:
        yield nested, final
    yield statement.finalbody, following


def _same_target(node: ast.AST, target: ast.expr) -> bool:
    """Whether ``node`` names what ``target`` names (``flags``, ``self.flags``), in any
    context (read, stored, deleted)."""
    chain = _chain(node)
    return chain is not None and chain == _chain(target)


def _chain(node: ast.AST) -> tuple[str, ...] | None:
    """The names of an attribute chain (``("self", "flags")``); ``None`` for anything else."""
    attributes: list[str] = []
    while isinstance(node, ast.Attribute):
        attributes.append(node.attr)
        node = node.value
    return (node.id, *reversed(attributes)) if isinstance(node, ast.Name) else None


def _find_tests(made: _Made) -> None:
    """The item tests of ``made``'s tensor in the statements after it: ``target[index]``
    whose truth alone is used (an ``if``, ``while``, conditional expression or
    ``assert`` test, or through ``not``, ``and``, ``or`` there)."""
    target = made.statement.targets[0]
    for statement in made.later:
        for parent, field_name, node in _in_tests(statement):
            if (
                isinstance(node, ast.Subscript)
                and not isinstance(node.slice, ast.Slice | ast.Tuple)
                and _same_target(node.value, target)
            ):
                made.tests.append((parent, field_name, node))


def _in_tests(statement: ast.stmt) -> Iterator[tuple[ast.AST, str, ast.expr]]:
    """Each expression whose truth alone is used, with its parent and field, outside
    nested scopes."""
    for node in _walk_scope(statement):
        if isinstance(node, ast.If | ast.While | ast.IfExp | ast.Assert):
            yield from _truth_operands(node, "test")


def _truth_operands(parent: ast.AST, field_name: str) -> Iterator[tuple[ast.AST, str, ast.expr]]:
    node = getattr(parent, field_name)
    yield parent, field_name, node
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        yield from _truth_operands(node, "operand")
    elif isinstance(node, ast.BoolOp):
        for index in range(len(node.values)):
            yield from _truth_operands(_Item(node.values, index), "value")


@dataclass
class _Item:
    """A slot of a list field (a ``BoolOp``'s operands), read and replaced like a field."""

    values: list[ast.expr]
    index: int

    @property
    def value(self) -> ast.expr:
        return self.values[self.index]

    @value.setter
    def value(self, node: ast.expr) -> None:
        self.values[self.index] = node


def _replace(parent: ast.AST, field_name: str, old: ast.expr, new: ast.expr) -> None:
    assert getattr(parent, field_name) is old
    setattr(parent, field_name, new)


def _walk_scope(node: ast.AST, skip: ast.AST | None = None) -> Iterator[ast.AST]:
    """``node`` and the nodes below it that belong to its scope, and the nested scopes
    there (not what they hold); not ``skip`` and what it holds."""
    if node is skip:
        return
    yield node
    if not isinstance(node, _NESTED_SCOPES):
        for child in ast.iter_child_nodes(node):
            yield from _walk_scope(child, skip)


def _check_kept(made: _Made, called: Callable[[ast.Call], str | None]) -> None:
    """Decline unless nothing can update the tensor after it is made, and what may run
    after it traces (plain compile ran it eagerly, after the break at a test): the tensor
    is read only by its item tests, no nested scope or ``locals()`` sees it, and every
    call is to torch (one TorchDynamo traces), to a builtin, or to a method of a list or
    dict stored in the block after the tensor, none handed the tensor or its owner.
    ``called`` names a call's function through the module's imports (or ``None``)."""
    target = made.statement.targets[0]
    root = _root(target)
    tested = {id(test.value) for _, _, test in made.tests}
    containers = _fresh_containers([*made.later, *made.after], root)
    fresh: set[str] = set()
    for statement in made.later:
        _check_statement(statement, made, tested, fresh, called)
        fresh |= containers.get(id(statement), set())
    for statement in made.after:
        _check_statement(statement, made, tested, set(), called)


def _check_statement(
    statement: ast.stmt,
    made: _Made,
    tested: set[int],
    fresh: set[str],
    called: Callable[[ast.Call], str | None],
) -> None:
    target = made.statement.targets[0]
    root = _root(target)
    for node in _walk_scope(statement, skip=made.statement):  # made again in a loop
        if isinstance(node, _NESTED_SCOPES) and any(
            isinstance(inner, ast.Name) and inner.id == root for inner in ast.walk(node)
        ):
            raise Decline(f"a nested function or comprehension reads {root}")
        if isinstance(node, ast.Name) and node.id in FRAME_INTROSPECTION:
            raise Decline(f"{node.id}() may read the tensor")
        if _same_target(node, target) and id(node) not in tested:
            raise Decline(f"{ast.unparse(target)} is read other than by tests of its items")
        if not isinstance(node, ast.Call):
            continue
        if _untraceable(node, called):
            raise Decline(
                f"{ast.unparse(node.func)}() cannot be traced, and the original broke the "
                "graph before it"
            )
        if _unknown(node, root, fresh, made.containers, called):
            raise Decline(
                f"{ast.unparse(node.func)}() may reach {root} or fail to trace where the "
                "original broke the graph before it"
            )


def _untraceable(call: ast.Call, called: Callable[[ast.Call], str | None]) -> bool:
    """A call TorchDynamo may refuse to trace (``torch._dynamo.mark_dynamic``...), except
    ``mark_static_address`` of one tensor, which the rewrite makes after the graph."""
    name = called(call) or ""
    return name.startswith(_TRACER_MODULES) and not _marks_static_address(call, name)


def _marks_static_address(call: ast.Call, name: str) -> bool:
    return (
        name == _MARK_STATIC
        and len(call.args) == 1
        and not call.keywords
        and not isinstance(call.args[0], ast.Starred)
    )


def _root(target: ast.expr) -> str:
    while isinstance(target, ast.Attribute):
        target = target.value
    assert isinstance(target, ast.Name)
    return target.id


def _fresh_containers(later: list[ast.stmt], root: str) -> dict[int, set[str]]:
    """The attributes of ``root`` stored once after the tensor is made, a new list, dict
    or set: by the statement (``id``) that stores them."""
    stores: dict[str, list[ast.AST]] = {}
    for statement in later:
        for node in ast.walk(statement):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store | ast.Del)
                and isinstance(node.value, ast.Name)
                and node.value.id == root
            ):
                stores.setdefault(node.attr, []).append(node)
    fresh: dict[int, set[str]] = {}
    for statement in later:
        if isinstance(statement, ast.Assign | ast.AnnAssign) and isinstance(
            statement.value, _DISPLAYS
        ):
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            for target in targets:
                if isinstance(target, ast.Attribute) and stores.get(target.attr) == [target]:
                    fresh.setdefault(id(statement), set()).add(target.attr)
    return fresh


def _unknown(
    call: ast.Call,
    root: str,
    fresh: set[str],
    containers: frozenset[str],
    called: Callable[[ast.Call], str | None],
) -> bool:
    """Whether ``call`` may reach what ``root`` holds, or is not known to trace."""
    arguments = [*call.args, *(keyword.value for keyword in call.keywords)]
    if any(_may_be(argument, root) for argument in arguments):
        return True
    name = called(call) or ""
    if name.startswith(("torch.", "builtins.")) and name != "builtins.super":
        return False
    method = call.func
    return not (
        isinstance(method, ast.Attribute)
        and method.attr in _CONTAINER_METHODS
        and _container(method.value, root, fresh, containers)
    )


def _container(receiver: ast.expr, root: str, fresh: set[str], local: frozenset[str]) -> bool:
    """Whether ``receiver`` is a list, dict or set made in the function: an attribute of
    ``root`` stored as one (``fresh``), or a local bound only to such displays."""
    if isinstance(receiver, ast.Name):
        return receiver.id in local
    return (
        isinstance(receiver, ast.Attribute)
        and isinstance(receiver.value, ast.Name)
        and receiver.value.id == root
        and receiver.attr in fresh
    )


def _local_containers(function: ast.FunctionDef) -> frozenset[str]:
    """Locals of ``function`` bound only by ``name = <list, dict or set display>`` in its
    own scope: never a parameter, never bound otherwise, never named in a nested scope."""
    displays: dict[str, list[ast.Name]] = {}
    others = {argument.arg for argument in ast.walk(function.args) if isinstance(argument, ast.arg)}
    stores: list[ast.Name] = []
    for statement in function.body:
        for node in _walk_scope(statement):
            if isinstance(node, _NESTED_SCOPES):
                others |= {inner.id for inner in ast.walk(node) if isinstance(inner, ast.Name)}
            elif isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
                stores.append(node)
            else:
                others |= _bound_without_a_name_node(node)
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, _DISPLAYS)
            ):
                displays.setdefault(node.targets[0].id, []).append(node.targets[0])
    by_display = {id(target) for targets in displays.values() for target in targets}
    others |= {store.id for store in stores if id(store) not in by_display}
    return frozenset(displays.keys() - others)


def _bound_without_a_name_node(node: ast.AST) -> set[str]:
    """Names a node binds that no ``ast.Name`` holds (``global``, ``import``, ``except ...
    as``, ``match`` captures)."""
    if isinstance(node, ast.Global | ast.Nonlocal):
        return set(node.names)
    if isinstance(node, ast.alias):
        return {(node.asname or node.name).split(".")[0]}
    name = getattr(node, "name", None) or getattr(node, "rest", None)
    return {name} if isinstance(name, str) else set()


def _may_be(argument: ast.expr, root: str) -> bool:
    """Whether an argument is ``root`` or may hold it (``*args``, ``**kwargs``)."""
    return isinstance(argument, ast.Starred) or (
        isinstance(argument, ast.Name) and argument.id == root
    )
