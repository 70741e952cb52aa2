"""T1 for a tensor-valued ``a if c else b``: both values computed ahead of time as
functions of what they read, and merged under the condition by the runtime's ``branch``
(:mod:`graphmend.runtime.selection`), or the original choice where that is not exact.
:class:`graphmend.rewrites.predicate.PredicateRewrite` finds the statements holding one.
"""

from __future__ import annotations

import ast
import copy
from typing import TYPE_CHECKING

from graphmend.analysis.bindings import names_read, stored_names
from graphmend.analysis.speculation import SpeculationChecker
from graphmend.rewrites.common import (
    Decline,
    load,
    locate,
    make_function,
    runtime_call,
    store,
    tuple_of,
)
from graphmend.rewrites.merging import check_not_told_apart_after, submodule_read

if TYPE_CHECKING:
    from graphmend.rewrites.predicate import PredicateRewrite


class ConditionalExpressions(ast.NodeTransformer):
    """Replaces tensor-valued ``a if c else b`` by the merged value, or the original choice::

    m[0] if (m := _@gm_rt.branch((c := <cond>), then, (...), else_, (...), ...)) is not None
    else (then(...)[0] if c else else_(...)[0])
    """

    def __init__(
        self,
        rewriter: PredicateRewrite,
        statement: ast.stmt,
        copy_: ast.stmt,
        definitions: list[ast.stmt],
    ) -> None:
        self.rewriter = rewriter
        self.statement = statement
        self.whole_value = getattr(copy_, "value", None)  # the expression the copy computes
        self.whole_statement = copy_
        self.definitions = definitions
        self.bound = rewriter.bound_at(statement)
        self.search: str | None = None  # the statement's search token, named by its first site

    def visit_Lambda(self, node: ast.Lambda) -> ast.AST:
        return node  # its own scope

    def _kept(self, node: ast.IfExp) -> ast.expr:
        """The ``kept`` argument of the runtime's ``branch`` for ``node``
        (:meth:`PredicateRewrite.kept_after`): the statement's target is rebound where
        ``node`` is its whole value (``h = ... if c else h``); where it is part of a
        larger one, the statement may read any name after the merge too."""
        statement = self.whole_statement
        if self.whole_value is not node:
            return self.rewriter.kept_after(self.statement, [], also=names_read(statement))
        if isinstance(statement, ast.Return):
            return tuple_of([])
        targets = statement.targets if isinstance(statement, ast.Assign) else []
        rebound = [target.id for target in targets if isinstance(target, ast.Name)]
        return self.rewriter.kept_after(self.statement, rebound if len(targets) == 1 else [])

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = visit_Lambda

    def visit_IfExp(self, node: ast.IfExp) -> ast.AST:
        if not self.rewriter.may_hold_tensor_data(node.test):
            return self.generic_visit(node)
        self._check_no_update_in_place_after()
        module = self.rewriter.module
        checker = SpeculationChecker(
            module.scopes, self.rewriter.enclosing.functions, in_branch=True
        )
        names = module.fresh_names("then", "else", "cond", "merged", "search")
        self.search = self.search or names["search"]
        branches: list[ast.expr] = []
        for label, value in (("then", node.body), ("else", node.orelse)):
            checker.expression(value)
            parameters = sorted(self.rewriter.local_reads([value]))
            unbound = [p for p in parameters if p not in self.bound]
            if unbound:
                raise Decline(f"a branch reads {unbound[0]}, which may be unbound here")
            name = names[label]
            function = make_function(name, parameters, [ast.Return(value=tuple_of([value]))], [])
            self.definitions.append(locate(function, self.statement))  # type: ignore[arg-type]
            branches += [load(name), tuple_of(load(p) for p in parameters)]
        if checker.facts.problem is not None:
            raise Decline(f"a value cannot be computed ahead of time: {checker.facts.problem}")
        translation = self.rewriter.translate_condition(node.test, self.bound)
        if translation.prelude and self.whole_value is not node:
            raise Decline(
                "an and/or condition inside a larger expression would change evaluation order"
            )
        self.definitions.extend(
            locate(statement, self.statement) for statement in translation.prelude
        )
        call = runtime_call(
            "branch",
            ast.NamedExpr(target=store(names["cond"]), value=translation.condition),
            *branches,
            tuple_of(
                submodule_read(m, self.bound, self.rewriter.enclosing.class_name)
                for m in checker.facts.modules
            ),
            ast.Constant(checker.facts.expensive),
        )
        call.keywords.append(ast.keyword(arg="kept", value=self._kept(node)))
        merged = ast.NamedExpr(target=store(names["merged"]), value=call)
        # Not exact to merge: the original choice, on the host, in this frame (the
        # original graph break; inside a helper it would split the graph once more),
        # and the original branches, not the branch functions: a function still live
        # at the break makes TorchDynamo guard the resumed frame on the id of its code
        # object, a guard that failed on later calls in long runs (a recompile, one
        # graph more than plain).
        original = copy.deepcopy(node)
        test = self.rewriter.original_choice(node.test, translation, names["cond"], self.search)
        fallback = ast.IfExp(test=test, body=original.body, orelse=original.orelse)
        return ast.IfExp(
            test=ast.Compare(left=merged, ops=[ast.IsNot()], comparators=[ast.Constant(None)]),
            body=_first(load(names["merged"])),
            orelse=fallback,
        )

    def _check_no_update_in_place_after(self) -> None:
        """A name the statement binds, updated in place after it, would no longer update
        the object the original bound there (an argument, a view of one): a merged
        value is a new tensor."""
        statement = self.statement
        targets = statement.targets if isinstance(statement, ast.Assign) else []
        if isinstance(statement, ast.AnnAssign):
            targets = [statement.target]
        for name in sorted(frozenset().union(*(stored_names(t) for t in targets))):
            check_not_told_apart_after(self.rewriter, statement, name, "the conditional expression")


def _first(value: ast.expr) -> ast.Subscript:
    return ast.Subscript(value=value, slice=ast.Constant(0), ctx=ast.Load())


def expressions_in_scope(statement: ast.stmt) -> list[ast.AST]:
    """Nodes of a simple statement, not entering lambdas or comprehensions."""
    found: list[ast.AST] = []
    pending: list[ast.AST] = [statement]
    while pending:
        node = pending.pop()
        found.append(node)
        if isinstance(
            node, ast.Lambda | ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp
        ):
            continue
        pending.extend(ast.iter_child_nodes(node))
    return found
