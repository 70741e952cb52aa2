"""Continuation predication: the rest of a function folded into both branches of an ``if``.

T1 (:mod:`graphmend.rewrites.predicate`) merges the values an ``if``'s branches
produce; where they cannot be merged (``None`` against a tensor, different
shapes, a branch calling code whose purity is unknown) its site falls back to
the original ``if`` while tracing, and TorchDynamo breaks the graph there.  This
rewrite runs after the others and, for the first such site among a function's
top-level statements, tries one more thing before that fallback::

    def then_k(<locals read>):        def else_k(<locals read>):
        <then branch>                     <else branch>
        <rest of the function>            <rest of the function>
    merged = continuation(cond, then_k, (...), else_k, (...))
    if merged is not None:
        return merged[0]
    <the fallback if, as before>

so that ``torch.cond`` chooses the function's result: only the taken branch
runs, made of the original statements (already rewritten by the other
rewrites), so the result is the original one by construction.  Every ``return``
in the copies returns a 1-tuple.  Whether ``torch.cond`` can capture the
branches is found out while tracing (:mod:`graphmend.runtime.continuation`);
statically the site is declined where the copies could not run as the original
does: a generator, ``global``/``nonlocal``, zero-argument ``super()``,
``locals()``, a ``def``, ``class`` or ``lambda`` (its ``__qualname__`` would name
the copy), a local read that may be unbound at the ``if``, a local shared with a
function defined before the site (it holds the frame's cell, the copies their own
local), and the bound on duplication below.

Duplication: one site per function, the rest of the function at most
:data:`MAX_STATEMENTS` statements; the copies are made after the other rewrites,
so a site inside the rest is not folded again (no nesting).
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Iterator

from graphmend.analysis.bindings import (
    bound_before,
    bound_in,
    local_names,
    parameter_names,
    read_before_written,
    shared_with_nested,
)
from graphmend.analysis.walking import own_nodes
from graphmend.findings import Decision
from graphmend.rewrites.common import (
    PREFIX,
    TOO_DEEP,
    Decline,
    ModuleContext,
    continuable_condition,
    is_generated,
    is_left_alone,
    is_tracing_test,
    load,
    locate,
    make_function,
    mark_generated,
    never_traced,
    runtime_call,
    store,
)

#: The most statements the rest of a function may hold to be copied into both branches.
MAX_STATEMENTS = 200

#: Definitions whose ``__qualname__`` names the function they are defined in.
_NAMED_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)

#: Tensor attributes that tell a strided view from a dense copy of it.
_LAYOUT_READS = frozenset(
    {
        "_base",
        "_is_view",
        "stride",
        "is_contiguous",
        "is_non_overlapping_and_dense",
        "storage_offset",
        "data_ptr",
        "untyped_storage",
        "storage",
        "as_strided",
        "is_set_to",
    }
)


class ContinuationRewrite:
    """Folds the rest of a function into both branches of a predicated site."""

    name = "continuation"

    def __init__(self, module: ModuleContext) -> None:
        self.module = module

    def run(self, tree: ast.Module) -> None:
        """Rewrite the first continuable site of every function, recording a finding."""
        for function, qualname in _functions(tree.body, ""):
            self._rewrite(function, qualname)

    def _rewrite(self, function: ast.FunctionDef, qualname: str) -> None:
        found = next(_sites(function.body, []), None)
        if found is None:
            return
        statement, rest = found
        located = _fallback_of(statement)
        assert located is not None
        holder, fallback, condition = located
        try:
            replacement = self._continued(function, statement, fallback, condition, rest)
        except Decline as reason:
            self._record(statement, qualname, Decision.DECLINED, str(reason))
            return
        except RecursionError:
            self._record(statement, qualname, Decision.DECLINED, TOO_DEEP)
            return
        holder.orelse = replacement
        self._record(
            statement,
            qualname,
            Decision.REWRITTEN,
            f"the rest of the function ({_statement_count(rest)} statements) runs in both "
            "branches, under torch.cond, where the branches' values cannot be merged",
        )

    def _continued(
        self,
        function: ast.FunctionDef,
        site: ast.stmt,
        fallback: ast.If,
        condition: str,
        rest: list[ast.stmt],
    ) -> list[ast.stmt]:
        then_body = [*copy.deepcopy(fallback.body), *copy.deepcopy(rest)]
        else_body = [*copy.deepcopy(fallback.orelse), *copy.deepcopy(rest)]
        _check_function(function)
        _check_copied(then_body + else_body, rest)
        parameters = sorted(
            name
            for name in local_names(function)
            if read_before_written(then_body, name) or read_before_written(else_body, name)
        )
        unbound = sorted(set(parameters) - bound_before(function, site))
        if unbound:
            raise Decline(f"the rest of the function reads {unbound[0]!r}, maybe unbound here")
        # The copies get their own locals: a nested function defined before the site
        # would neither see what they bind nor update what they were given.
        shared = shared_with_nested(function, [site, *rest]) & (
            set(parameters) | bound_in(then_body + else_body)
        )
        if shared:
            raise Decline(
                f"{min(shared)!r} is shared with a function defined before the site, and "
                "the copies of the rest would hold their own"
            )
        names = self.module.fresh_names("then", "else", "continued")
        then_function = make_function(names["then"], parameters, _returning_tuples(then_body), [])
        else_function = make_function(names["else"], parameters, _returning_tuples(else_body), [])
        arguments = ast.Tuple(elts=[load(name) for name in parameters], ctx=ast.Load())
        call = runtime_call(
            "continuation",
            load(condition),
            load(names["then"]),
            arguments,
            load(names["else"]),
            copy.deepcopy(arguments),
            ast.Constant(_layout_matters(then_body + else_body)),
        )
        merged = load(names["continued"])
        taken = ast.If(
            test=ast.Compare(left=merged, ops=[ast.IsNot()], comparators=[ast.Constant(None)]),
            body=[
                ast.Return(
                    ast.Subscript(
                        value=load(names["continued"]), slice=ast.Constant(0), ctx=ast.Load()
                    )
                )
            ],
            orelse=[],
        )
        statements: list[ast.stmt] = [
            then_function,
            else_function,
            ast.Assign(targets=[store(names["continued"])], value=call),
            taken,
            fallback,
        ]
        for statement in statements[2:4]:
            mark_generated(locate(statement, site))
        locate(then_function, site)
        locate(else_function, site)
        return statements

    def _record(self, node: ast.stmt, qualname: str, decision: Decision, reason: str) -> None:
        self.module.record(self.name, node, qualname, decision, reason)


def _functions(body: list[ast.stmt], prefix: str) -> Iterator[tuple[ast.FunctionDef, str]]:
    """The functions to look at, outer first, with their qualified names."""
    for statement in body:
        if is_left_alone(statement) or is_generated(statement):
            continue
        if isinstance(statement, ast.ClassDef):
            yield from _class_functions(statement, f"{prefix}{statement.name}.")
        elif isinstance(statement, ast.FunctionDef):
            yield statement, f"{prefix}{statement.name}"
            yield from _functions(statement.body, f"{prefix}{statement.name}.<locals>.")


def _class_functions(
    definition: ast.ClassDef, prefix: str
) -> Iterator[tuple[ast.FunctionDef, str]]:
    for statement in definition.body:
        if isinstance(statement, ast.FunctionDef) and never_traced(statement.name):
            continue
        yield from _functions([statement], prefix)


def _sites(block: list[ast.stmt], after: list[ast.stmt]) -> Iterator[tuple[ast.If, list[ast.stmt]]]:
    """Predicated sites of a function, in source order, each with the statements that run
    after it: the rest of its block, then of each block around it.  Only plain ``if``
    statements may hold a site (the rest of a loop, ``with`` or ``try`` body is not the
    rest of the function)."""
    for index, statement in enumerate(block):
        rest = [*block[index + 1 :], *after]
        if _fallback_of(statement) is not None:
            yield statement, rest  # type: ignore[misc]
        elif isinstance(statement, ast.If) and not is_generated(statement):
            yield from _sites(statement.body, rest)
            yield from _sites(statement.orelse, rest)


def _fallback_of(statement: ast.stmt) -> tuple[ast.If, ast.If, str] | None:
    """For a predicated site (``if tracing(): ... if merged is not None: ... else:
    <fallback>``): the ``if`` holding the fallback, the fallback and its condition."""
    if not (
        isinstance(statement, ast.If)
        and is_generated(statement)
        and is_tracing_test(statement.test)
        and statement.body
    ):
        return None
    holder = statement.body[-1]
    if not (isinstance(holder, ast.If) and len(holder.orelse) == 1):
        return None
    fallback = holder.orelse[0]
    condition = continuable_condition(fallback)
    if condition is None or not isinstance(fallback, ast.If):
        return None
    return holder, fallback, condition


def _check_function(function: ast.FunctionDef) -> None:
    for node in own_nodes(function.body):
        if isinstance(node, ast.Yield | ast.YieldFrom | ast.Await):
            raise Decline("the function is a generator: its rest cannot run in another function")
        if isinstance(node, ast.Global | ast.Nonlocal):
            raise Decline("the function declares global or nonlocal names")
    if "__class__" in parameter_names(function):
        raise Decline("the function binds __class__")


def _check_copied(copied: list[ast.stmt], rest: list[ast.stmt]) -> None:
    if _statement_count(rest) > MAX_STATEMENTS:
        raise Decline(
            f"the rest of the function holds more than {MAX_STATEMENTS} statements "
            "(the bound on what is copied into both branches)"
        )
    for node in own_nodes(copied):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "super"
            and not node.args
        ):
            raise Decline("super() without arguments needs the method's own frame")
        if isinstance(node, ast.Name) and node.id == "__class__":
            raise Decline("__class__ needs the method's own frame")
        if isinstance(node, _NAMED_DEFINITIONS) and not _generated_definition(node):
            name = "a lambda" if isinstance(node, ast.Lambda) else node.name
            raise Decline(
                f"it defines {name}, whose qualified name would be the copy's "
                "(f.<locals>.<copy>.<locals>...)"
            )


def _generated_definition(node: ast.AST) -> bool:
    """Whether ``node`` is a function an earlier rewrite defined (a predicated branch)."""
    return getattr(node, "name", "").startswith(PREFIX)


def _layout_matters(body: list[ast.stmt]) -> bool:
    """Whether ``body`` may tell a tensor from a dense copy of it: update it in place
    (``x += 1``, ``x[i] = v``, a method named like an in-place one such as ``add_``, an
    ``out=`` argument) or read its layout (``x.stride()``, ``x.is_contiguous()``...)."""
    for node in ast.walk(ast.Module(body=body, type_ignores=[])):
        if isinstance(node, ast.Attribute) and node.attr in _LAYOUT_READS:
            return True
        if isinstance(node, ast.AugAssign):
            return True
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store):
            return True
        if isinstance(node, ast.Call):
            method = node.func.attr if isinstance(node.func, ast.Attribute) else ""
            if method.endswith("_") and not method.startswith("_"):
                return True
            if any(keyword.arg == "out" for keyword in node.keywords):
                return True
    return False


def _statement_count(body: list[ast.stmt]) -> int:
    return sum(isinstance(node, ast.stmt) for node in own_nodes(body))


class _TupleReturns(ast.NodeTransformer):
    """``return x`` → ``return (x,)`` in one function's own body."""

    def visit_Return(self, node: ast.Return) -> ast.Return:
        value = node.value if node.value is not None else ast.Constant(None)
        return ast.copy_location(ast.Return(ast.Tuple(elts=[value], ctx=ast.Load())), node)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.FunctionDef:
        return node

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> ast.AsyncFunctionDef:
        return node

    def visit_Lambda(self, node: ast.Lambda) -> ast.Lambda:
        return node

    def visit_ClassDef(self, node: ast.ClassDef) -> ast.ClassDef:
        return node


def _returning_tuples(body: list[ast.stmt]) -> list[ast.stmt]:
    """``body`` with each return giving a 1-tuple, and ``(None,)`` when it runs off the end."""
    transformer = _TupleReturns()
    statements = [transformer.visit(statement) for statement in body]
    if statements and isinstance(statements[-1], ast.Return):
        return statements
    falls_off = ast.Return(ast.Tuple(elts=[ast.Constant(None)], ctx=ast.Load()))
    return [*statements, falls_off]
