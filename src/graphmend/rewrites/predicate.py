"""T1: a data-dependent ``if`` (or ``a if c else b``) becomes one graph.

While tracing, each branch runs as a generated function of the values it
reads, and :func:`graphmend.runtime.selection.branch` merges their results
under the tensor condition (``torch.where``, or ``torch.cond`` for costly
branches; see that module for the rule)::

    if _@gm_tracing():
        _@gm_cond3 = <condition, tensor parts kept on the device>
        def _@gm_then3(h):
            clamp_value = torch.finfo(h.dtype).max - 1000
            h = torch.clamp(h, min=-clamp_value, max=clamp_value)
            return (h,)
        def _@gm_else3(h):
            return (h,)
        # (submodules to check, whether a branch is costly, tensors written in place)
        _@gm_merged3 = _@gm_rt.branch(_@gm_cond3, _@gm_then3, (h,), _@gm_else3, (h,), (), False, ())
        if _@gm_merged3 is not None:
            (h,) = _@gm_merged3
        elif _@gm_cond3:                  # not exact to merge: the original branches
            clamp_value = ...
            h = ...
    elif <the original condition>:     # eagerly: the original if, as written
        <the original branches>

Branches may assign local names, store into a tensor by index (written back
in place, predicated), call pure
torch functions, tensor methods, pure functions of the module and submodules
whose type is checked while tracing, nest further ``if``s, and return (when
every branch returns; an early ``return`` merges with the rest of the block).
Anything else keeps the original ``if`` and its graph break; so does a store
into an attribute (``self.buf = ...``, ``register_buffer``): the original binds
another tensor there, and whoever holds the one it replaces (a local, the
caller, another attribute aliasing it) keeps its values, which no store made in
a graph can do on both paths.
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from graphmend.analysis.bindings import (
    assigned_on_every_path,
    is_name_target,
    live_after,
    stored_names,
)
from graphmend.analysis.scopes import STATIC_KINDS, Resolution
from graphmend.analysis.speculation import BranchFacts, SpeculationChecker, speculation_problem
from graphmend.analysis.walking import walk
from graphmend.findings import Decision
from graphmend.rewrites.common import (
    Decline,
    FunctionStatementRewriter,
    dual_path,
    load,
    locate,
    make_function,
    mark_continuable,
    runtime_call,
    store,
    tuple_of,
)
from graphmend.rewrites.conditional_expressions import (
    ConditionalExpressions,
    expressions_in_scope,
)
from graphmend.rewrites.conditions import (
    ConditionTranslator,
    Translation,
    test_to_evaluate_again,
)
from graphmend.rewrites.kept_names import kept_argument
from graphmend.rewrites.merging import check_not_told_apart_after, submodule_read


@dataclass
class _Slots:
    """What the branches of a site, nested ones included, write to: tensors stored into by
    index (merged and written back in place) and the locals rebound."""

    items: list[str] = field(default_factory=list)  # local tensors stored into by index
    rebound: set[str] = field(default_factory=set)  # locals any branch assigns


#: Attributes of a tensor that describe it without giving its elements.
_METADATA = frozenset({"shape", "dtype", "device", "ndim", "layout", "is_cuda", "requires_grad"})


@dataclass
class _ArmState:
    """What a branch has done so far, while its statements are transformed."""

    assigned: set[str] = field(default_factory=set)  # local names bound
    slots: set[str] = field(default_factory=set)  # indexed names written

    def copy(self) -> _ArmState:
        return _ArmState(set(self.assigned), set(self.slots))


#: Why a site inside a ``try`` or a ``with`` block is left as it is: TorchDynamo 2.13
#: could not rebuild the block's exception table for the code it resumes after a break
#: there once the block held a rewritten site ("exception table entry start instruction
#: has no offset"; 2.5: a TypeError), and the compile failed, ``torch.no_grad()`` blocks
#: included.
_IN_A_BLOCK = (
    "inside a try or with block of this function: TorchDynamo may fail to rebuild the "
    "block's exception table for code resumed after a break in it"
)


class PredicateRewrite(FunctionStatementRewriter):
    """Predicates tensor-valued ``if`` statements and conditional expressions."""

    name = "predicate"
    keywords = ("if",)  # an if statement or a conditional expression

    def rewrite_statement(self, statement: ast.stmt) -> ast.stmt | list[ast.stmt]:
        if isinstance(statement, ast.If):
            return self._rewrite_if(statement, tail=None)
        if isinstance(
            statement, ast.Assign | ast.AnnAssign | ast.Return | ast.Expr
        ) and self.module.mentions(statement, self.keywords):
            return self._rewrite_conditional_expressions(statement)
        return statement

    def rewrite_tail(self, statement: ast.stmt, tail: list[ast.stmt]) -> list[ast.stmt] | None:
        """``if c: ...; return a`` followed by ``...; return b``: one site, both branches."""
        if not (
            isinstance(statement, ast.If)
            and not statement.orelse
            and statement.body
            and isinstance(statement.body[-1], ast.Return)
            and tail
            and isinstance(tail[-1], ast.Return)
        ):
            return None
        rewritten = self._rewrite_if(statement, tail=tail)
        return rewritten if isinstance(rewritten, list) else None

    def kept_after(
        self, statement: ast.stmt, rebound: Sequence[str], also: Iterable[str] = ()
    ) -> ast.expr:
        """The runtime ``branch``'s argument ``kept`` for the site ``statement``
        (:mod:`graphmend.rewrites.kept_names`)."""
        functions = self.enclosing.functions
        return kept_argument(self.module.scopes, functions, statement, rebound, also)

    # -- if statements -------------------------------------------------------------------

    def _rewrite_if(
        self, statement: ast.If, tail: list[ast.stmt] | None
    ) -> ast.stmt | list[ast.stmt]:
        if _is_guard(statement) or not self.may_hold_tensor_data(statement.test):
            return statement
        if self.may_catch or self.in_with_block:
            self.record(statement, Decision.DECLINED, _IN_A_BLOCK)
            return statement
        then_arm = statement.body
        else_arm = statement.orelse if tail is None else tail
        try:
            site = _Site(self, statement, then_arm, else_arm)
            tracing_body = site.tracing_path()
        except Decline as reason:
            if tail is None or not _returns(statement.body):
                self.record(statement, Decision.DECLINED, str(reason))
            return statement
        self.record(statement, Decision.REWRITTEN, site.describe())
        eager = [statement, *(tail or [])]
        if tail is None:
            return dual_path(statement, tracing_body, site.names["search"])
        rewritten = dual_path(statement, tracing_body, site.names["search"])
        rewritten.orelse = eager
        return [rewritten]

    # -- conditional expressions ------------------------------------------------------------

    def _rewrite_conditional_expressions(self, statement: ast.stmt) -> ast.stmt:
        candidates = [
            node
            for node in expressions_in_scope(statement)
            if isinstance(node, ast.IfExp) and self.may_hold_tensor_data(node.test)
        ]
        if not candidates:
            return statement
        if self.may_catch or self.in_with_block:
            self.record(candidates[0], Decision.DECLINED, _IN_A_BLOCK)
            return statement
        rewritten = copy.deepcopy(statement)
        definitions: list[ast.stmt] = []
        try:
            transformer = ConditionalExpressions(self, statement, rewritten, definitions)
            rewritten = transformer.visit(rewritten)
        except Decline as reason:
            self.record(candidates[0], Decision.DECLINED, str(reason))
            return statement
        for node in candidates:
            self.record(
                node,
                Decision.REWRITTEN,
                "conditional expression predicated: both values computed and selected on "
                "the device when that is exact",
            )
        return dual_path(statement, [*definitions, rewritten], transformer.search)

    # -- shared helpers ------------------------------------------------------------------

    def translate_condition(self, condition: ast.expr, bound: frozenset[str]) -> Translation:
        """Statements to run first, and the condition for tracing (``bound``: the names
        certainly bound where it stands)."""
        translator = ConditionTranslator(self.module, self.enclosing.functions, self.name, bound)
        return translator.translate(condition)

    def original_choice(
        self, test: ast.expr, translation: Translation, condition_name: str, search: str
    ) -> ast.expr:
        """The test of the original choice, made when the branches do not merge: the
        evaluated condition (read as :meth:`Translation.choice_on_host` says); for a test
        that searches a tensor for a number (see :func:`test_to_evaluate_again`),
        ``as_written(<search>) or <test>``, which runs the statement as written
        (:mod:`graphmend.runtime.searches`)."""
        scopes, functions = self.module.scopes, self.enclosing.functions
        again = test_to_evaluate_again(test, scopes, functions)
        if again is None:
            return translation.choice_on_host(load(condition_name))
        restart = runtime_call("as_written", load(search))
        return ast.BoolOp(op=ast.Or(), values=[restart, again])


class _Site:
    """One ``if`` statement being predicated: checks, then code generation."""

    def __init__(
        self,
        rewriter: PredicateRewrite,
        statement: ast.If,
        then_arm: list[ast.stmt],
        else_arm: list[ast.stmt],
        parent: _Site | None = None,
        bound: frozenset[str] | None = None,
        state: _ArmState | None = None,
    ) -> None:
        self.rewriter = rewriter
        self.module = rewriter.module
        self.statement = statement
        self.nested = parent is not None
        self.returns = _returns(then_arm)
        if self.returns != _returns(else_arm):
            raise Decline("one branch returns and the other does not")
        if self.returns and self.nested:
            raise Decline("a nested if returns from inside a branch")
        self.bound = rewriter.bound_at(statement) if bound is None else bound
        self.checker = (
            parent.checker
            if parent
            else SpeculationChecker(
                self.module.scopes, rewriter.enclosing.functions, in_branch=True
            )
        )
        self.slots = parent.slots if parent else _Slots()
        self.state = state or _ArmState()  # what the enclosing branch did before this site
        self.names = self.module.fresh_names("cond", "then", "else", "merged", "search")
        self.then_arm = then_arm
        self.else_arm = else_arm
        self.outputs = [] if self.returns else self._outputs()

    @property
    def facts(self) -> BranchFacts:
        return self.checker.facts

    def _outputs(self) -> list[str]:
        """The locals the site binds that are used after it, each bound on every path."""
        assigned = _assigned_names(self.then_arm) | _assigned_names(self.else_arm)
        function = self.rewriter.enclosing.functions[-1]
        assert isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef)
        outputs = []
        for name in sorted(assigned):
            everywhere = name in assigned_on_every_path(self.then_arm) and name in (
                assigned_on_every_path(self.else_arm)
            )
            if (everywhere or name in self.bound) and not self.nested:
                check_not_told_apart_after(self.rewriter, self.statement, name, "the if")
            if everywhere or name in self.bound:
                outputs.append(name)
            elif self.nested or live_after(function, self.statement, name):
                # (inside a branch function, every assigned name may be returned by it)
                raise Decline(
                    f"{name} is assigned in one branch only, may be unbound before the if, "
                    "and is used after it"
                )
        return outputs

    def tracing_path(self) -> list[ast.stmt]:
        """The statements run while tracing (checks raise :class:`Decline`)."""
        condition_name = self.names["cond"]
        translation = self.rewriter.translate_condition(self.statement.test, self.bound)
        then_state, else_state = self.state.copy(), self.state.copy()
        then_body = self._transform(self.then_arm, then_state)
        else_body = self._transform(self.else_arm, else_state)
        self.written = then_state.slots | else_state.slots
        if self.nested:
            # stores made inside a nested if are results of it, like its names
            self.outputs += sorted(self.written - set(self.outputs))
        if self.facts.problem is not None:
            raise Decline(f"a branch cannot run ahead of time: {self.facts.problem}")
        if self.returns and self.slots.items:
            raise Decline("a branch both returns and stores into a tensor")
        then_name, else_name = self.names["then"], self.names["else"]
        then_function, then_parameters = self._function(then_name, self.then_arm, then_body)
        else_function, else_parameters = self._function(else_name, self.else_arm, else_body)
        merged_name = self.names["merged"]
        in_place = [] if self.nested else [load(name) for name in self.slots.items]
        call = runtime_call(
            "branch",
            load(condition_name),
            load(then_name),
            tuple_of(load(p) for p in then_parameters),
            load(else_name),
            tuple_of(load(p) for p in else_parameters),
            tuple_of(self._module_reads(then_state, else_state)),
            ast.Constant(self.facts.expensive),
            tuple_of(in_place),
        )
        kept = (
            tuple_of([]) if self.returns else self.rewriter.kept_after(self.statement, self.outputs)
        )
        call.keywords.append(ast.keyword(arg="kept", value=kept))
        return [
            *translation.prelude,
            ast.Assign(targets=[store(condition_name)], value=translation.condition),
            then_function,
            else_function,
            ast.Assign(targets=[store(merged_name)], value=call),
            *self._choose(merged_name, translation),
        ]

    def _module_reads(self, *states: _ArmState) -> list[ast.expr]:
        """The submodules the branches call, read before them without raising."""
        assigned = set().union(*(state.assigned for state in states))
        class_name = self.rewriter.enclosing.class_name
        return [
            submodule_read(module, self.bound - assigned, class_name)
            for module in self.facts.modules
        ]

    def _unpack(self, merged_name: str) -> list[ast.stmt]:
        if self.returns:
            first = ast.Subscript(value=load(merged_name), slice=ast.Constant(0), ctx=ast.Load())
            return [ast.Return(value=first)]
        if not self.outputs:
            return [ast.Pass()]  # only in-place stores, written by the runtime
        names = ast.Tuple(elts=[store(n) for n in self.outputs], ctx=ast.Store())
        return [ast.Assign(targets=[names], value=load(merged_name))]

    def _choose(self, merged_name: str, translation: Translation) -> list[ast.stmt]:
        """Take the merged results; else run the original branches, decided on the host
        (the original graph break).  Inside a branch function a host read would break
        the graph there: the function returns ``None`` and the enclosing merge fails."""
        if self.nested:
            failed = ast.Compare(
                left=load(merged_name), ops=[ast.Is()], comparators=[ast.Constant(None)]
            )
            give_up = ast.If(test=failed, body=[ast.Return(ast.Constant(None))], orelse=[])
            return [give_up, *self._unpack(merged_name)]
        merged = ast.Compare(
            left=load(merged_name), ops=[ast.IsNot()], comparators=[ast.Constant(None)]
        )
        condition_name = self.names["cond"]
        fallback = mark_continuable(
            ast.If(
                test=self.rewriter.original_choice(
                    self.statement.test, translation, condition_name, self.names["search"]
                ),
                body=copy.deepcopy(self.then_arm) or [ast.Pass()],
                orelse=copy.deepcopy(self.else_arm),
            ),
            condition_name,
        )
        return [ast.If(test=merged, body=self._unpack(merged_name), orelse=[fallback])]

    def _function(
        self, name: str, arm: list[ast.stmt], body: list[ast.stmt]
    ) -> tuple[ast.stmt, list[str]]:
        """``def name(<locals read>): <arm without side effects>; return (<results>)``."""
        body = list(body)
        if self.returns:
            results: list[ast.expr] = []  # the arm's own return statement ends the body
        else:
            results = [load(n) for n in self.outputs]
            if not self.nested:
                results += [load(n) for n in self.slots.items]
            body.append(ast.Return(value=tuple_of(results)))
        parameters = sorted(
            self.rewriter.local_reads([*arm, *results]) | set(self.outputs) | set(self.slots.items)
        )
        bound = self.bound
        if self.nested:  # indexed names are bound in the enclosing branch function
            bound = bound | set(self.slots.items)
        parameters = [p for p in parameters if p in bound]
        function = make_function(name, parameters, body or [ast.Pass()], [])
        return locate(function, self.statement), parameters  # type: ignore[return-value]

    def _transform(self, arm: list[ast.stmt], state: _ArmState) -> list[ast.stmt]:
        """The arm's statements with stores made local; raises :class:`Decline`."""
        transformed: list[ast.stmt] = []
        for statement in arm:
            stored_before = frozenset(state.slots)
            self._check_reads(statement, state)
            transformed.extend(self._transform_statement(statement, state))
            if stored_before:
                # after the statement's own checks, whose reasons say more
                self._check_no_way_around_the_copy(_reads(statement), stored_before)
        return transformed

    def _check_reads(self, statement: ast.stmt, state: _ArmState) -> None:
        """A branch may read only what is bound."""
        for name in sorted(self.rewriter.local_reads(_reads(statement))):
            if name not in state.assigned and name not in self.bound:
                raise Decline(f"a branch reads {name}, which may be unbound before the if")

    def _check_no_way_around_the_copy(self, reads: list[ast.AST], slots: frozenset[str]) -> None:
        """After a store by index the branch holds a copy of the tensor stored into; an
        attribute (``self.buf``, where ``h = self.buf``) may hold the tensor itself, whose
        values from before the store it would read.  (Tensors the branch is given are
        checked while tracing: ``runtime.aliasing.stored_alias``.)"""
        nodes = [node for read in reads for node in walk(read)]
        called = {id(node.func) for node in nodes if isinstance(node, ast.Call)}
        for node in nodes:
            if (
                isinstance(node, ast.Attribute)
                and id(node) not in called
                and node.attr not in _METADATA
                and isinstance(node.value, ast.Name)
                and node.value.id not in slots
                and self.rewriter.local_reads([node.value])
            ) or (isinstance(node, ast.Name) and self._module_variable(node.id)):
                raise Decline(
                    f"a branch reads {ast.unparse(node)} after storing into "
                    f"{min(slots)} by index: it may hold the tensor stored into"
                )

    def _module_variable(self, name: str) -> bool:
        """Whether ``name`` read here may be a module-level value other than a module,
        function or class (a tensor the module holds)."""
        scopes, functions = self.module.scopes, self.rewriter.enclosing.functions
        resolution = scopes.resolve(name, functions)
        if resolution is Resolution.UNKNOWN:
            return True
        binding = scopes.sole_global_binding(name, functions)
        return resolution is Resolution.GLOBAL and (
            binding is None or binding.kind not in STATIC_KINDS
        )

    def _transform_statement(self, statement: ast.stmt, state: _ArmState) -> list[ast.stmt]:
        if isinstance(statement, ast.Pass) or _is_docstring(statement):
            return []
        if isinstance(statement, ast.Return):
            if statement.value is None:
                raise Decline("a branch returns None implicitly, which cannot be selected")
            self.checker.expression(statement.value)
            return [ast.Return(value=tuple_of([copy.deepcopy(statement.value)]))]
        if isinstance(statement, ast.Assign | ast.AnnAssign):
            return self._transform_assignment(statement, state)
        if isinstance(statement, ast.If):
            return self._transform_nested_if(statement, state)
        what = {
            ast.AugAssign: "an augmented assignment (+= updates a tensor in place)",
            ast.Expr: "an expression statement, which may have side effects",
            ast.Raise: "a raise",
            ast.For: "a loop",
            ast.While: "a loop",
            ast.Break: "a break",
            ast.Continue: "a continue",
        }.get(type(statement), f"a {type(statement).__name__} statement")
        raise Decline(f"a branch holds {what} (line {statement.lineno})")

    def _transform_nested_if(self, statement: ast.If, state: _ArmState) -> list[ast.stmt]:
        """A nested ``if`` (an ``elif``) predicated inside the branch function."""
        if _is_guard(statement):
            raise Decline(f"a branch raises (line {statement.lineno})")
        self.checker.condition(statement.test)  # evaluated ahead of time too
        nested = _Site(
            self.rewriter,
            statement,
            statement.body,
            statement.orelse,
            parent=self,
            bound=frozenset(self.bound | state.assigned),
            state=state,
        )
        code = nested.tracing_path()
        state.assigned |= set(nested.outputs)
        state.slots |= nested.written
        return code

    def _transform_assignment(
        self, statement: ast.Assign | ast.AnnAssign, state: _ArmState
    ) -> list[ast.stmt]:
        if statement.value is None:
            return []
        self.checker.expression(statement.value)
        targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
        value = copy.deepcopy(statement.value)
        if all(stored_names(t) and is_name_target(t) for t in targets):
            names = set().union(*(stored_names(t) for t in targets))
            self._check_locals(names, state)
            state.assigned |= names
            self.slots.rebound |= names
            return [ast.Assign(targets=[copy.deepcopy(t) for t in targets], value=value)]
        if len(targets) != 1:
            raise Decline("a chained assignment stores into something other than names")
        target = targets[0]
        if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name):
            name = target.value.id
            if name in state.assigned or name in self.slots.rebound:
                # The write-back reaches the object the name held before the if; a
                # branch that rebinds the name must leave that object as it was.
                raise Decline(f"a branch rebinds {name} and a branch stores into it by index")
            self._check_index(target.slice)
            if name not in self.slots.items:
                self.slots.items.append(name)
            state.slots.add(name)
            update = runtime_call("assign_item", load(name), copy.deepcopy(target.slice), value)
            return [ast.Assign(targets=[store(name)], value=update)]
        if isinstance(target, ast.Attribute):
            raise Decline(
                f"a branch stores into {ast.unparse(target)}: the original binds the "
                "branch's own object there (code holding the one it replaces keeps it), "
                "which a value merged in the graph is not"
            )
        raise Decline(f"a branch stores into {ast.unparse(target)}, which cannot be predicated")

    def _check_locals(self, names: set[str], state: _ArmState) -> None:
        function = self.rewriter.enclosing.functions[-1]
        for name in sorted(names):
            if name not in self.module.scopes.locals_of(function):
                raise Decline(f"a branch assigns {name}, a global or nonlocal name")
            if name in self.slots.items:
                raise Decline(f"a branch stores into {name} by index and a branch rebinds it")

    def _check_index(self, index: ast.expr) -> None:
        problem = speculation_problem(index, self.module.scopes, self.rewriter.enclosing.functions)
        if problem is not None:
            raise Decline(f"an index in a branch cannot be computed ahead of time: {problem}")

    def describe(self) -> str:
        """The finding's text for a rewritten site."""
        if self.returns:
            what = "the returned values"
        else:
            stores = [f"{name}[...]" for name in self.slots.items]
            what = ", ".join(self.outputs + stores) or "nothing"
        return (
            f"if predicated: {what} selected on the device while tracing "
            "(torch.where, or torch.cond for costly branches) when that is exact"
        )


def _reads(statement: ast.stmt) -> list[ast.AST]:
    """What a branch's statement reads before anything of it runs (a nested ``if``: its
    test; its branches are checked statement by statement)."""
    return [statement.test] if isinstance(statement, ast.If) else [statement]


def _is_guard(statement: ast.If) -> bool:
    """``if c: raise ...``: T3's site, not a branch to predicate."""
    return len(statement.body) == 1 and isinstance(statement.body[0], ast.Raise)


def _returns(arm: Sequence[ast.stmt]) -> bool:
    return bool(arm) and isinstance(arm[-1], ast.Return)


def _is_docstring(statement: ast.stmt) -> bool:
    return isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)


def _assigned_names(arm: Sequence[ast.stmt]) -> set[str]:
    names: set[str] = set()
    for statement in arm:
        for node in walk(statement):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
    return names
