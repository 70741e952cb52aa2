"""Which local names are certainly bound at a statement, and which are read where.

Predication passes the values a branch reads to a generated function, so it
must know that each of them is bound when the ``if`` starts (reading an
unbound local would raise where the original did not).  The analysis is the
usual definite-assignment one, conservative about loops and ``try``.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from graphmend.analysis.walking import walk

if TYPE_CHECKING:
    from graphmend.analysis.callees import Callees

FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef


def parameter_names(function: FunctionNode | ast.Lambda) -> frozenset[str]:
    """The names a function's (or lambda's) parameters bind."""
    arguments = function.args
    every = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
    every += [a for a in (arguments.vararg, arguments.kwarg) if a is not None]
    return frozenset(argument.arg for argument in every)


class _Found(Exception):
    def __init__(self, bound: frozenset[str]) -> None:
        self.bound = bound


def bound_before(function: FunctionNode, target: ast.stmt) -> frozenset[str]:
    """Names certainly bound when ``target`` (a statement of ``function``) starts."""
    try:
        _block(function.body, parameter_names(function), target)
    except _Found as found:
        return found.bound
    raise ValueError("the statement is not in the function")


def _block(body: Iterable[ast.stmt], bound: frozenset[str], target: ast.stmt) -> frozenset[str]:
    for statement in body:
        if statement is target:
            raise _Found(bound)
        bound = _statement(statement, bound, target)
    return bound


def _statement(statement: ast.stmt, bound: frozenset[str], target: ast.stmt) -> frozenset[str]:
    if isinstance(statement, ast.If):
        then = _block(statement.body, bound, target)
        otherwise = _block(statement.orelse, bound, target)
        return then & otherwise
    if isinstance(statement, ast.For | ast.AsyncFor | ast.While):
        inside = bound | (
            stored_names(statement.target) if not isinstance(statement, ast.While) else frozenset()
        )
        _block(statement.body, inside, target)
        _block(statement.orelse, bound, target)
        return bound
    if isinstance(statement, ast.With | ast.AsyncWith):
        names = frozenset().union(
            *(stored_names(item.optional_vars) for item in statement.items if item.optional_vars)
        )
        return _block(statement.body, bound | names, target)
    if isinstance(statement, ast.Try):
        _block(statement.body, bound, target)
        for handler in statement.handlers:
            _block(handler.body, bound | ({handler.name} if handler.name else set()), target)
        _block(statement.orelse, bound, target)
        return _block(statement.finalbody, bound, target)
    if isinstance(statement, ast.Match):
        for case in statement.cases:
            _block(case.body, bound, target)
        return bound
    if isinstance(statement, ast.Delete):
        return bound - frozenset().union(*(stored_names(t) for t in statement.targets))
    if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return bound | {statement.name}
    return bound | assigned_by(statement)


def assigned_on_every_path(body: Iterable[ast.stmt]) -> frozenset[str]:
    """Names certainly bound by running ``body`` to its end."""
    return _block(body, frozenset(), _NOWHERE)


_NOWHERE = ast.Pass()


def stored_names(target: ast.expr) -> frozenset[str]:
    """Names an assignment target binds (``a``, ``a, (b, c)``, ``*rest``)."""
    if isinstance(target, ast.Name):
        return frozenset({target.id})
    if isinstance(target, ast.Tuple | ast.List):
        return frozenset().union(*(stored_names(element) for element in target.elts))
    if isinstance(target, ast.Starred):
        return stored_names(target.value)
    return frozenset()


def is_name_target(target: ast.expr) -> bool:
    """Whether an assignment target only binds names (``a``, ``a, (b, c)``)."""
    if isinstance(target, ast.Name):
        return True
    return isinstance(target, ast.Tuple | ast.List) and all(
        is_name_target(element) for element in target.elts
    )


def is_attribute_chain(expr: ast.expr) -> bool:
    """Whether ``expr`` is a name followed by attributes only (``self.a.b``)."""
    while isinstance(expr, ast.Attribute):
        expr = expr.value
    return isinstance(expr, ast.Name)


def assigned_by(statement: ast.stmt) -> frozenset[str]:
    """Names a simple statement binds."""
    if isinstance(statement, ast.Assign):
        return frozenset().union(*(stored_names(target) for target in statement.targets))
    if isinstance(statement, ast.AnnAssign | ast.AugAssign):
        return stored_names(statement.target) if getattr(statement, "value", True) else frozenset()
    if isinstance(statement, ast.Import | ast.ImportFrom):
        return frozenset(alias.asname or alias.name.split(".", 1)[0] for alias in statement.names)
    return frozenset(
        node.target.id
        for node in walk(statement)
        if isinstance(node, ast.NamedExpr) and isinstance(node.target, ast.Name)
    )


def names_read(node: ast.AST) -> frozenset[str]:
    """Every name loaded anywhere in ``node`` (nested functions included)."""
    return frozenset(
        child.id
        for child in walk(node)
        if isinstance(child, ast.Name) and isinstance(child.ctx, ast.Load)
    )


def live_after(function: FunctionNode, site: ast.stmt, name: str) -> bool:
    """Whether ``name`` may be read after ``site`` before being assigned again.

    Follows the statements that can run next: the rest of the site's block, then
    of each enclosing block, a loop's whole body again (its next iteration) and
    the handlers and ``finally`` of an enclosing ``try``.  Conservative: a read
    in any nested function or lambda of ``function`` counts (it may run later),
    unless that function binds ``name`` itself (see :func:`_reads_enclosing`).
    """
    if any(_reads_enclosing(inner, name) for inner in _nested_scopes(function)):
        return True
    continuation = _continuation(function, site)
    return continuation is None or read_before_written(continuation, name)


def used_in_place_after(function: FunctionNode, site: ast.stmt, name: str) -> bool:
    """Whether the object ``name`` holds may be updated in place after ``site``
    (``name += ...``, ``name[...] = ...``, ``name.add_(...)``, ``out=name``), directly,
    through an expression that may be it or a view of it (``name.data.add_(1)``), or
    through a name bound later to a view of it (``z = name.view(-1); z.add_(1)``, see
    :func:`_views_after`).

    ``name`` may also be an attribute chain, as written (``self.inv_freq``).
    """
    return _used_after(function, site, name, _updates_in_place)


def identity_used_after(
    function: FunctionNode,
    site: ast.stmt,
    name: str,
    callees: Callees | None = None,
    enclosing: Sequence[ast.AST] = (),
) -> bool:
    """Whether the identity of the object ``name`` holds may be used after ``site``: an
    operand of ``is`` or ``is not`` (except against a constant, as ``y is None``; an
    item or a call's result may be it, :func:`_may_hold`), an argument of ``id()``, an
    attribute stored into it (``y.tag = 1``), or its memory read (``y.data_ptr()``,
    ``y._base``), directly or through a name bound
    later to it or a view of it (:func:`_views_after`); also, given the module's
    ``callees`` and the functions ``enclosing`` ``function``, inside a function of the
    module it is passed to (:func:`_used_by_callee`)."""

    def uses(node: ast.AST, views: frozenset[str]) -> bool:
        if _uses_identity(node, views):
            return True
        return callees is not None and _used_by_callee(node, views, callees, enclosing)

    return _used_after(function, site, name, uses)


#: How deep :func:`_used_by_callee` follows calls from the function with the site.
_CALL_DEPTH = 3


def _used_by_callee(
    node: ast.AST,
    views: frozenset[str],
    callees: Callees,
    enclosing: Sequence[ast.AST],
    depth: int = _CALL_DEPTH,
) -> bool:
    """Whether ``node`` calls a function of the module (:class:`Callees`) with one of
    ``views`` as an argument whose parameter's identity that function uses, as
    :func:`identity_used_after` sees it, following its calls too, ``depth`` deep.  A
    parameter that cannot be matched to the argument counts as used."""
    if depth == 0 or not isinstance(node, ast.Call):
        return False
    given = [
        argument
        for argument in [*node.args, *(keyword.value for keyword in node.keywords)]
        if _may_be_view(argument.value if isinstance(argument, ast.Starred) else argument, views)
    ]
    callee = callees.reached(node, enclosing) if given else None
    if callee is None:
        return False
    for argument in given:
        parameter = callee.receiving(node, argument)
        if parameter is None:
            return True
        body = callee.function.body
        inner = _views_after(body, parameter)
        if any(
            _uses_identity(each, inner)
            or _used_by_callee(each, inner, callees, callee.enclosing, depth - 1)
            for statement in body
            for each in walk(statement)
        ):
            return True
    return False


def _used_after(
    function: FunctionNode,
    site: ast.stmt,
    name: str,
    uses: Callable[[ast.AST, frozenset[str]], bool],
) -> bool:
    """Whether a node that may run after ``site`` ``uses`` the object ``name`` holds,
    given the names that may hold it or a view of it (True where that is unknown)."""
    continuation = _continuation(function, site)
    if continuation is None:
        return True
    views = _views_after(continuation, name)
    return any(uses(node, views) for statement in continuation for node in walk(statement))


def _updates_in_place(node: ast.AST, views: frozenset[str]) -> bool:
    """Whether ``node`` updates in place the object one of ``views`` holds, or what may
    be a view of it, unbound (:func:`_may_be_view`): ``y.data.add_(1)`` (``.data``
    counts its updates in a version of its own, unseen while tracing),
    ``y.view(-1)[0] = 1``, ``out=y.t()``."""
    if isinstance(node, ast.AugAssign):
        return _may_be_view(node.target, views)
    if isinstance(node, ast.Subscript | ast.Attribute) and isinstance(node.ctx, ast.Store):
        return _may_be_view(node.value, views)
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if (
        isinstance(func, ast.Attribute)
        and func.attr.endswith("_")
        and not func.attr.startswith("__")
        and _may_be_view(func.value, views)
    ):
        return True
    return any(k.arg == "out" and _may_be_view(k.value, views) for k in node.keywords)


#: What a tensor tells of its memory or its history, and so of which tensor it is.
_MEMORY_ATTRIBUTES = frozenset(
    {
        "data_ptr",
        "untyped_storage",
        "storage",
        "storage_offset",
        "is_set_to",
        "_base",
        "_is_view",
        "_version",
        "as_strided",
    }
)
#: ``torch`` functions that read a tensor argument's memory: ``torch.as_strided(y, ...)``.
_MEMORY_FUNCTIONS = frozenset({"as_strided"})


def _uses_identity(node: ast.AST, views: frozenset[str]) -> bool:
    if _hashes(node, views):
        return True
    if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
        return _is_any(node.value, views)  # an attribute of the very object: t.tag = 1
    if isinstance(node, ast.Attribute) and node.attr in _MEMORY_ATTRIBUTES:
        return _may_be_view(node.value, views)
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in _MEMORY_FUNCTIONS
    ):
        return any(_may_be_view(argument, views) for argument in node.args)
    if isinstance(node, ast.Compare):
        operands = [node.left, *node.comparators]
        return any(
            isinstance(op, ast.Is | ast.IsNot)
            and not isinstance(left, ast.Constant)
            and not isinstance(right, ast.Constant)
            and (_may_hold(left, views) or _may_hold(right, views))
            for op, left, right in zip(node.ops, operands[:-1], operands[1:], strict=True)
        )
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "id"
        and any(_may_be_view(argument, views) for argument in node.args)
    )


#: Methods of dicts, sets and lists that look their first argument up by identity
#: (``list.index`` first by identity, then by ``==``).
_LOOKUPS = frozenset({"get", "setdefault", "pop", "discard", "index", "remove", "count"})


def _hashes(node: ast.AST, views: frozenset[str]) -> bool:
    """Whether ``node`` looks one of ``views`` up by identity, as a tensor's ``__hash__``
    and ``in`` do: a set's element or a dict's key (``{y: 1}``), the left operand of
    ``in`` or ``not in`` (``y in seen``: a merged tensor is in no container the
    original's is in), an argument of ``hash()``, the key a container's method looks
    up (``cache.get(y)``, :data:`_LOOKUPS`)."""
    if isinstance(node, ast.Set):
        keys = node.elts
    elif isinstance(node, ast.Dict):
        keys = [key for key in node.keys if key is not None]
    elif isinstance(node, ast.Compare):
        operands = [node.left, *node.comparators]
        keys = [
            left
            for op, left in zip(node.ops, operands[:-1], strict=True)
            if isinstance(op, ast.In | ast.NotIn)
        ]
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "hash":
        keys = node.args
    elif (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in _LOOKUPS
    ):
        keys = node.args[:1]
    else:
        return False
    return any(_may_be_view(key, views) for key in keys)


def _may_hold(expr: ast.expr, views: frozenset[str]) -> bool:
    """Whether ``expr`` may evaluate to the object one of ``views`` holds: it is one of
    them, an item (of a container built around it: ``outputs[0]``) or the result of a
    call other than ``type()``."""
    if isinstance(expr, ast.Call):
        return not (isinstance(expr.func, ast.Name) and expr.func.id == "type")
    return _is_any(expr, views) or isinstance(expr, ast.Subscript)


def _views_after(continuation: list[ast.stmt], name: str) -> frozenset[str]:
    """``name``, and the names bound in ``continuation`` to what may be its object or a
    view of it, transitively: an expression that starts from one of them (the name, an
    attribute or index of it, a method called on it, a call taking it first, as
    ``torch.transpose(y, 0, 1)``), element by element when a tuple is unpacked.  A
    tuple or list built around it (``outputs = (y,)``) holds it without being it."""
    views = {name}
    while True:
        bound = {
            target
            for statement in continuation
            for node in walk(statement)
            for targets, value in _bindings(node)
            if _may_be_view(value, views)
            for target in stored_names(targets)
        }
        if bound <= views:
            return frozenset(views)
        views |= bound


def _bindings(node: ast.AST) -> list[tuple[ast.expr, ast.expr]]:
    """The (target, value) pairs ``node`` binds, a tuple unpacked element by element."""
    if isinstance(node, ast.Assign):
        pairs = [(target, node.value) for target in node.targets]
    elif isinstance(node, ast.AnnAssign | ast.NamedExpr) and node.value is not None:
        pairs = [(node.target, node.value)]
    elif isinstance(node, ast.For | ast.AsyncFor | ast.comprehension):
        pairs = [(node.target, node.iter)]
    elif isinstance(node, ast.withitem) and node.optional_vars is not None:
        pairs = [(node.optional_vars, node.context_expr)]
    else:
        return []
    unpacked = []
    for target, value in pairs:
        if (
            isinstance(target, ast.Tuple | ast.List)
            and isinstance(value, ast.Tuple | ast.List)
            and len(target.elts) == len(value.elts)
        ):
            unpacked += list(zip(target.elts, value.elts, strict=True))
        else:
            unpacked.append((target, value))
    return unpacked


def _may_be_view(value: ast.expr, views: set[str]) -> bool:
    if _is_any(value, views):
        return True
    if isinstance(value, ast.Attribute | ast.Subscript | ast.Starred):
        return _may_be_view(value.value, views)
    if isinstance(value, ast.IfExp):
        return _may_be_view(value.body, views) or _may_be_view(value.orelse, views)
    if isinstance(value, ast.Call):
        func = value.func
        method = isinstance(func, ast.Attribute) and _may_be_view(func.value, views)
        return method or (bool(value.args) and _may_be_view(value.args[0], views))
    return False


def _is_any(expr: ast.expr, names: Iterable[str]) -> bool:
    return any(_is_name(expr, name) for name in names)


def _is_name(expr: ast.expr, name: str) -> bool:
    """Whether ``expr`` is the name or attribute chain ``name``."""
    if isinstance(expr, ast.Name):
        return expr.id == name
    chain = isinstance(expr, ast.Attribute) and is_attribute_chain(expr)
    return chain and ast.unparse(expr) == name


def _nested_scopes(function: FunctionNode) -> list[ast.AST]:
    return [
        node
        for node in walk(function)
        if node is not function
        and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef)
    ]


def _reads_enclosing(scope: ast.AST, name: str) -> bool:
    """Whether the nested ``scope`` may read ``name`` from an enclosing function.

    A function that binds ``name`` itself (a parameter, or an assignment in its own
    body without ``nonlocal``/``global``) reads its own local, as Python scoping has it;
    a class body, or a name bound only by a comprehension, counts as a read.
    """
    if name not in names_read(scope):
        return False
    if isinstance(scope, ast.ClassDef):
        return True
    if any(
        isinstance(node, ast.Nonlocal | ast.Global) and name in node.names for node in walk(scope)
    ):
        return True
    assert isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
    arguments = scope.args
    parameters = {
        argument.arg
        for argument in [
            *arguments.posonlyargs,
            *arguments.args,
            *arguments.kwonlyargs,
            *filter(None, [arguments.vararg, arguments.kwarg]),
        ]
    }
    body = [scope.body] if isinstance(scope, ast.Lambda) else scope.body
    return name not in parameters and name not in _bound_in_own_scope(body)


def shared_with_nested(function: FunctionNode, excluded: list[ast.stmt]) -> frozenset[str]:
    """Locals of ``function`` that a function, lambda, class or generator expression
    defined in it, outside the statements ``excluded``, may read or rebind later: they
    live in cells the nested code shares with ``function``'s frame."""
    skipped = {id(node) for statement in excluded for node in walk(statement)}
    candidates = local_names(function)
    shared: set[str] = set()
    for node in walk(function):
        if node is function or id(node) in skipped:
            continue
        if isinstance(node, ast.GeneratorExp):
            shared |= names_read(node) & candidates
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            shared |= {name for name in candidates if _reads_enclosing(node, name)}
            declared = {
                name
                for inner in walk(node)
                if isinstance(inner, ast.Nonlocal)
                for name in inner.names
            }
            shared |= declared & candidates
    return frozenset(shared)


def bound_in(body: list[ast.stmt]) -> frozenset[str]:
    """Names ``body`` binds in its own scope (see :func:`local_names`)."""
    return _bound_in_own_scope(list(body))


def local_names(function: FunctionNode) -> frozenset[str]:
    """The names local to ``function``: its parameters and what its own body binds."""
    return parameter_names(function) | _bound_in_own_scope(list(function.body))


def _bound_in_own_scope(nodes: list[ast.AST]) -> frozenset[str]:
    """Names bound by ``nodes`` in their own scope: not inside nested functions,
    lambdas, classes or comprehensions (whose names are theirs)."""
    bound: set[str] = set()
    pending = list(nodes)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
            continue
        if isinstance(
            node, ast.Lambda | ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp
        ):
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
            bound.add(node.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            bound |= assigned_by(node)
        pending.extend(ast.iter_child_nodes(node))
    return frozenset(bound)


def _continuation(function: FunctionNode, site: ast.stmt) -> list[ast.stmt] | None:
    """The statements that may run after ``site``, in order (see :func:`live_after`)."""
    path = _path_to(function.body, site)
    if path is None:
        return None
    continuation: list[ast.stmt] = []
    for owner, block, index in reversed(path):
        continuation += block[index + 1 :]
        if isinstance(owner, ast.For | ast.AsyncFor | ast.While) and block is owner.body:
            continuation += [*owner.body, *owner.orelse]
        if isinstance(owner, ast.Try):
            if block is owner.body:
                continuation += [s for handler in owner.handlers for s in handler.body]
            continuation += owner.finalbody
    return continuation


def _path_to(
    body: list[ast.stmt], site: ast.stmt, owner: ast.AST | None = None
) -> list[tuple[ast.AST | None, list[ast.stmt], int]] | None:
    """The (owner, block, index) steps from ``body`` down to ``site``."""
    for index, statement in enumerate(body):
        if statement is site:
            return [(owner, body, index)]
        for block in _blocks(statement):
            inner = _path_to(block, site, statement)
            if inner is not None:
                return [(owner, body, index), *inner]
    return None


def _blocks(statement: ast.stmt) -> list[list[ast.stmt]]:
    if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return []
    blocks = [
        getattr(statement, field)
        for field in ("body", "orelse", "finalbody")
        if isinstance(getattr(statement, field, None), list)
    ]
    blocks += [handler.body for handler in getattr(statement, "handlers", [])]
    blocks += [case.body for case in getattr(statement, "cases", [])]
    return blocks


def _names_read_now(node: ast.AST) -> frozenset[str]:
    """Names ``node`` loads when it runs.  The bodies of the functions, lambdas and
    classes it defines are left out (their reads are those of :func:`_reads_enclosing`);
    their decorators, defaults, annotations and bases are evaluated now and count."""
    read: set[str] = set()
    pending = [node]
    while pending:
        current = pending.pop()
        if isinstance(current, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            arguments = current.args
            pending += [*arguments.defaults, *filter(None, arguments.kw_defaults)]
            if not isinstance(current, ast.Lambda):
                pending += [*current.decorator_list, *filter(None, [current.returns])]
                pending += [
                    argument.annotation
                    for argument in ast.walk(arguments)
                    if isinstance(argument, ast.arg) and argument.annotation
                ]
            continue
        if isinstance(current, ast.ClassDef):
            pending += [*current.decorator_list, *current.bases, *current.keywords]
            continue
        if isinstance(current, ast.Name) and isinstance(current.ctx, ast.Load):
            read.add(current.id)
        pending.extend(ast.iter_child_nodes(current))
    return frozenset(read)


def _reads(statement: ast.stmt, name: str) -> bool:
    """Whether a simple statement reads ``name`` (``name += 1`` and ``name[0] = 1`` do)."""
    if name in _names_read_now(statement):
        return True
    return isinstance(statement, ast.AugAssign) and name in stored_names(statement.target)


def _binds_before_reading(loop: ast.For | ast.AsyncFor, name: str) -> bool:
    """Whether each run of the loop's body binds ``name`` before reading it: its target
    binds it, or the body assigns it before any read, so that a run reads what it bound
    itself.  The iterable and the target, evaluated first, must not read it, and nothing
    in the loop may delete it."""
    if name in _names_read_now(loop.iter) or name in names_read(loop.target):
        return False
    if any(
        isinstance(node, ast.Delete)
        and any(name in stored_names(target) for target in node.targets)
        for node in walk(loop)
    ):
        return False
    return name in stored_names(loop.target) or not read_before_written(loop.body, name)


def read_before_written(statements: list[ast.stmt], name: str) -> bool:
    """Whether running ``statements`` may read ``name`` before assigning it (``while``,
    ``with`` and ``try`` count any read; a ``for`` loop any read unless each run of its
    body binds the name first)."""
    for statement in statements:
        if isinstance(statement, ast.If):
            if name in names_read(statement.test):
                return True
            if read_before_written(statement.body, name) or read_before_written(
                statement.orelse, name
            ):
                return True
            if name in assigned_on_every_path(statement.body) & assigned_on_every_path(
                statement.orelse
            ):
                return False
        elif isinstance(statement, ast.For | ast.AsyncFor) and _binds_before_reading(
            statement, name
        ):
            if read_before_written(statement.orelse, name):
                return True  # the loop may not have run: nothing bound it
        elif _blocks(statement) or isinstance(
            statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
        ):
            if name in _names_read_now(statement) or any(
                isinstance(node, ast.AugAssign) and name in stored_names(node.target)
                for node in walk(statement)
            ):
                return True  # loops, with, try: any read counts
            if (
                isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                and statement.name == name
            ):
                return False  # a definition binds its name
        else:
            if _reads(statement, name):
                return True
            if name in assigned_by(statement):
                return False
    return False


def items_read_after(function: FunctionNode, site: ast.stmt, name: str) -> list[ast.expr] | None:
    """The constant subscripts (an int, or a slice of int constants: ``outputs[2:]``) that
    are all ``name`` is read by after ``site``, or ``None`` where it may be read otherwise
    (whole, by a computed index, in a nested function, or where that is unknown)."""
    if any(_reads_enclosing(inner, name) for inner in _nested_scopes(function)):
        return None
    continuation = _continuation(function, site)
    if continuation is None:
        return None
    subscripts: list[ast.expr] = []
    for statement in continuation:
        parents = {child: node for node in walk(statement) for child in ast.iter_child_nodes(node)}
        for node in walk(statement):
            if not (isinstance(node, ast.Name) and node.id == name):
                continue
            parent = parents.get(node)
            if isinstance(parent, ast.AugAssign):
                return None  # it reads the whole (``outputs *= 2`` repeats its items)
            if not isinstance(node.ctx, ast.Load):
                continue
            if not (
                isinstance(parent, ast.Subscript)
                and parent.value is node
                and isinstance(parent.ctx, ast.Load)
                and _constant_index(parent.slice)
            ):
                return None
            subscripts.append(parent.slice)
    return subscripts


def _constant_index(node: ast.expr) -> bool:
    """Whether ``node`` is an int constant (``-1`` too) or a slice of them and ``None``."""
    if isinstance(node, ast.Slice):
        parts = (node.lower, node.upper, node.step)
        return all(part is None or _constant_index(part) for part in parts)
    try:
        return type(ast.literal_eval(node)) is int
    except (ValueError, TypeError, SyntaxError):
        return False
