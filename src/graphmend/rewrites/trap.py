"""T3: validation guards on tensor data fail the compiled call from inside the graph.

``if <cond>: raise E(msg)`` (and ``if/elif`` chains of them) and
``assert <cond>, msg`` become, while tracing::

    @gm_cond1 = <cond, tensor parts kept on the device>
    if not (@gm_rt.lowerable(@gm_cond1)
            and @gm_rt.lower_guard(@gm_cond1, E, [<msg parts>], True, "7:f:m.py"))
            and @gm_cond1:
        raise E(msg)                      # the original raise, when it cannot be lowered

The message parts are evaluated only once ``lowerable`` has accepted the
condition; later links of a chain also pass the earlier conditions, which must
all be false.  ``lower_guard`` puts an operation into the graph that raises ``E(msg)`` when
the condition holds (see :mod:`graphmend.runtime.traps`); when the condition is
a Python value, or cannot be lowered, the original ``if`` decides on the host.
The eager path is the original statement.  Asserts sit under ``if __debug__:``
so that ``python -O`` removes them, rewritten or not.  The message is built at
trace time, so it may only use expressions that cannot fail or change
anything: names, constants, shapes, dtypes, ``len()``, ``x.size()``, and ``tuple()`` or
``list()`` of those.  A field that reads a module global, or attributes of one
(``{STEP}``, ``{config.epoch}``), is read when the guard fires instead, as the original
reads it (``@gm_rt.global_text``).

An assert that cannot be lowered stays an assert, ``assert @gm_rt.not_(@gm_cond1), msg``,
which TorchDynamo turns into ``torch._assert_async`` itself when the message is
constant, as without GraphMend (an ``if`` that raises would be a break plain
``torch.compile`` does not have).
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Sequence
from dataclasses import dataclass

from graphmend.analysis.purity import may_hold_tensor_data, qualified_name
from graphmend.analysis.scopes import BindingKind, ModuleScopes, Resolution
from graphmend.analysis.speculation import speculation_problem
from graphmend.findings import Decision
from graphmend.interpreter_builtins import interpreter_builtin
from graphmend.rewrites.common import (
    Decline,
    FunctionStatementRewriter,
    dual_path,
    literal_format_spec,
    load,
    locate,
    mangled,
    mark_generated,
    runtime_call,
    store,
)
from graphmend.rewrites.conditions import (
    ConditionTranslator,
    Translation,
    jumps_moved_to_device,
    test_to_evaluate_again,
)

_SEPARATOR = "\x1f"  # see graphmend.runtime.traps
_AS_GIVEN = 0  # graphmend.runtime.traps.AS_GIVEN: the exception's argument is the value
_SAFE_METHODS = frozenset({"size", "dim", "numel"})


@dataclass
class _Guard:
    """One ``if cond: raise E(msg)`` link (an assert is ``if not cond: raise AssertionError``)."""

    site: ast.stmt
    condition: ast.expr
    exception: ast.expr
    message: ast.expr | None
    raise_statement: ast.Raise
    is_assert: bool = False


class TrapRewrite(FunctionStatementRewriter):
    """Lowers tensor-valued guards to in-graph checks while tracing."""

    name = "trap"
    keywords = ("if", "assert")

    def rewrite_statement(self, statement: ast.stmt) -> ast.stmt | list[ast.stmt]:
        if isinstance(statement, ast.Assert):
            return self._rewrite_assert(statement)
        if isinstance(statement, ast.If):
            return self._rewrite_guard_chain(statement)
        return statement

    def _rewrite_assert(self, statement: ast.Assert) -> ast.stmt:
        if not self.may_hold_tensor_data(statement.test):
            return statement
        scopes, functions = self.module.scopes, self.enclosing.functions
        if scopes.resolve("AssertionError", functions) is not Resolution.BUILTIN:
            # the assert statement raises the builtin, whatever the name is bound to
            self.record(
                statement,
                Decision.DECLINED,
                "AssertionError is rebound in this module, and the assert raises the builtin",
            )
            return statement
        message = statement.msg
        exception = ast.Name(id="AssertionError", ctx=ast.Load())
        raised = ast.Call(
            func=exception, args=[copy.deepcopy(message)] if message else [], keywords=[]
        )
        guard = _Guard(
            site=statement,
            condition=ast.UnaryOp(op=ast.Not(), operand=statement.test),
            exception=exception,
            message=message,
            raise_statement=locate(ast.Raise(exc=raised, cause=None), statement),  # type: ignore[arg-type]
            is_assert=True,
        )
        lowered = self._lower([guard], statement, "assert")
        if lowered is None:
            return statement
        # Under python -O the whole construct disappears, like the assert itself.
        return mark_generated(
            locate(ast.If(test=load("__debug__"), body=[lowered], orelse=[]), statement)
        )  # type: ignore[return-value]

    def _rewrite_guard_chain(self, statement: ast.If) -> ast.stmt | list[ast.stmt]:
        chain = _guard_chain(statement)
        if chain is None:
            return statement
        guards, rest = chain
        if not any(self.may_hold_tensor_data(guard.condition) for guard in guards):
            return statement
        lowered = self._lower(guards, _without_rest(statement, len(guards)), "guard")
        if lowered is None:
            return statement
        # `else:` of a guard runs only when no guard raised: it can follow the chain.
        return [lowered, *rest]

    def _lower(self, guards: list[_Guard], eager: ast.stmt, kind: str) -> ast.stmt | None:
        if self.may_catch:
            self.record(
                guards[0].site,
                Decision.DECLINED,
                "inside a try (or a with) of this function, whose handlers cannot catch an "
                "exception raised from inside the graph",
            )
            return None
        if self.in_with_block:
            self.record(
                guards[0].site,
                Decision.DECLINED,
                "inside a with block, whose exit would not run for an exception raised from "
                "inside the graph (torch.no_grad() would stay in force after the call)",
            )
            return None
        plans = []
        for index, guard in enumerate(guards):
            try:
                plans.append(self._plan(guard, ahead_of_time=index > 0))
            except Decline as reason:
                # The later links of the chain are offered again on their own.
                self.record(guards[0].site, Decision.DECLINED, str(reason))
                return None
        body: list[ast.stmt] = []
        conditions: list[str] = []
        # a guard that searches a tensor for a number runs the statement as written when
        # it is not lowered (graphmend.runtime.searches)
        searches = any(plan[-1] is not None for plan in plans)
        search = self.module.fresh_name("search") if searches else None
        for guard, (translation, message_parts, formats_names, again) in zip(
            guards, plans, strict=True
        ):
            # an assert's test is translated as it stands (see _plan): the guard fires
            # where it is false (lower_guard's ``negated``)
            name = self.module.fresh_name("test" if guard.is_assert else "cond")
            body.extend(translation.prelude)
            body.append(ast.Assign(targets=[store(name)], value=translation.condition))
            earlier = [load(previous) for previous in conditions]
            # The message is built only once the guard can be lowered (short circuit).
            gates = [runtime_call("lowerable", load(name), *copy.deepcopy(earlier))]
            if formats_names:
                gates.append(runtime_call("names_formattable"))
            lower = runtime_call(
                "lower_guard",
                load(name),
                copy.deepcopy(guard.exception),
                ast.List(elts=message_parts, ctx=ast.Load()),
                ast.Constant(guard.message is not None),
                ast.Constant(self._where(guard)),
                *earlier,
            )
            if guard.is_assert:
                lower.keywords.append(ast.keyword(arg="negated", value=ast.Constant(True)))
            lowered = ast.BoolOp(op=ast.And(), values=[*gates, lower])
            if again is None:
                choice = translation.choice_on_host(load(name))
                if guard.is_assert:
                    choice = ast.UnaryOp(op=ast.Not(), operand=choice)  # its raise condition
                kept = _unless_lowered(lowered, choice, guard, jumps=self._jumps_inside(guard))
            else:
                restart = runtime_call("as_written", load(search))  # type: ignore[arg-type]
                kept = _unless_lowered(lowered, again, guard, restart)
            body.append(locate(kept, guard.site))  # type: ignore[arg-type]
            conditions.append(name)
            exception = ast.unparse(guard.exception)
            self.record(
                guard.site,
                Decision.REWRITTEN,
                f"{kind} lowered into the graph: the compiled call raises {exception} "
                "with the original message when it fails",
            )
        return dual_path(eager, body, search)

    def _jumps_inside(self, guard: _Guard) -> bool:
        """Whether an assert's test, as written, jumps on a tensor or reads one on the host
        where the translated test does not (:func:`jumps_moved_to_device`): TorchDynamo
        breaks the graph there, where it turns an assert whose test is one tensor into
        ``torch._assert_async`` itself."""
        if not guard.is_assert:
            return False
        scopes, functions = self.module.scopes, self.enclosing.functions
        names = self.module.tensor_names(functions[-1], functions)
        return jumps_moved_to_device(
            guard.condition.operand,  # type: ignore[attr-defined]
            scopes,
            functions,
            lambda expr: may_hold_tensor_data(expr, scopes, functions, names),
        )

    def _where(self, guard: _Guard) -> str:
        """The raise's line, function and file (``line:qualname:file``): the lowered
        guard raises from there, as the original raise does."""
        line = guard.raise_statement.lineno
        return f"{line}:{self.enclosing.qualname}:{self.module.filename}"

    def _plan(
        self, guard: _Guard, ahead_of_time: bool
    ) -> tuple[Translation, list[ast.expr], bool, ast.expr | None]:
        functions = self.enclosing.functions
        scopes = self.module.scopes
        _check_raise(guard.raise_statement)
        if ahead_of_time:
            problem = speculation_problem(guard.condition, scopes, functions)
            if problem is not None:
                raise Decline(f"the elif condition would run ahead of time, but {problem}")
        _check_exception(guard.exception, scopes, functions)
        bound = self.bound_at(guard.site)
        message = _Message(scopes, functions, bound, self.enclosing.class_name)
        message_parts = message.parts(guard.message)
        translator = ConditionTranslator(self.module, functions, "trap", bound)
        # An assert's test is translated as it stands: where the choice is made on the
        # host, the assert jumps on the test's value, as the original's does, not on
        # not_ of not_ of it, computed on the device in a graph that plain compile's
        # frame does not have (fuzz seed 3744: 6 graphs against 2).
        tested = guard.condition.operand if guard.is_assert else guard.condition  # type: ignore[attr-defined]
        translation = translator.translate(tested)
        again = test_to_evaluate_again(guard.condition, scopes, functions)
        return translation, message_parts, message.formats_names, again


def _unless_lowered(
    lowered: ast.expr,
    condition: ast.expr,
    guard: _Guard,
    restart: ast.expr | None = None,
    jumps: bool = False,
) -> ast.If:
    """What runs when ``lowered`` is false: the original raise, on ``condition`` (the
    evaluated condition, or the original one evaluated again, after ``restart``, which
    returns ``None``); for an assert, the assert itself, given the truth of its test:
    TorchDynamo turns one with a constant message into ``torch._assert_async`` as without
    GraphMend, where an ``if`` that raises is a graph break plain ``torch.compile`` does
    not have (``torch.func.grad``'s ``with`` block keeps GraphMend from lowering it).
    Where the test as written ``jumps`` on a tensor, TorchDynamo breaks the graph there
    instead (what waits for the graph's end, a caller's tensor updated in place, happens
    before the ``AssertionError``): ``if not <test>: raise AssertionError(<message>)``,
    a jump TorchDynamo does not take for an assert, breaks there too, and the frame it
    resumes to raise holds what the original's does (read with ``.item()`` instead, the
    frame resumed after the read raised while traced, one frame given up more than
    plain compile; fuzz seeds 2402, 2479).  An assert's ``condition`` is ``not <test>``."""
    if guard.is_assert and not jumps:
        test = condition.operand  # type: ignore[attr-defined]
        kept: ast.stmt = ast.Assert(test=_after(restart, test), msg=copy.deepcopy(guard.message))
    else:
        kept = ast.If(
            test=_after(restart, condition), body=[copy.deepcopy(guard.raise_statement)], orelse=[]
        )
    return ast.If(test=ast.UnaryOp(op=ast.Not(), operand=lowered), body=[kept], orelse=[])


def _after(restart: ast.expr | None, test: ast.expr) -> ast.expr:
    """``test``, evaluated after ``restart`` (a call that returns ``None``), if any."""
    return test if restart is None else ast.BoolOp(op=ast.Or(), values=[restart, test])


def _guard_chain(statement: ast.If) -> tuple[list[_Guard], list[ast.stmt]] | None:
    """The guards of an ``if/elif`` chain whose branches each only raise, and the ``else``."""
    guards: list[_Guard] = []
    current: ast.If | None = statement
    rest: list[ast.stmt] = []
    while current is not None:
        if len(current.body) != 1 or not _is_guard_raise(current.body[0]):
            if not guards:
                return None
            rest = [current]
            break
        raise_statement = current.body[0]
        assert isinstance(raise_statement, ast.Raise) and raise_statement.exc is not None
        exception, message = _exception_and_message(raise_statement.exc)
        guards.append(_Guard(current, current.test, exception, message, raise_statement))
        orelse = current.orelse
        if len(orelse) == 1 and isinstance(orelse[0], ast.If):
            current = orelse[0]
        else:
            rest = orelse
            current = None
    return guards, rest


def _is_guard_raise(statement: ast.stmt) -> bool:
    return isinstance(statement, ast.Raise) and statement.exc is not None


def _exception_and_message(exc: ast.expr) -> tuple[ast.expr, ast.expr | None]:
    if isinstance(exc, ast.Call):
        message = exc.args[0] if exc.args else None
        return exc.func, message
    return exc, None


def _without_rest(statement: ast.If, links: int) -> ast.If:
    """A copy of the chain with the ``else`` after its last guard removed."""
    chain = copy.deepcopy(statement)
    current = chain
    for _ in range(links - 1):
        current = current.orelse[0]  # type: ignore[assignment]
    current.orelse = []
    return chain


def _check_raise(statement: ast.Raise) -> None:
    if statement.cause is not None:
        raise Decline("raise ... from ...: the cause cannot be attached inside the graph")
    exc = statement.exc
    if isinstance(exc, ast.Call) and (
        len(exc.args) > 1 or exc.keywords or any(isinstance(a, ast.Starred) for a in exc.args)
    ):
        raise Decline("the exception is built from more than one message argument")


def _check_exception(
    exception: ast.expr, scopes: ModuleScopes, functions: Sequence[ast.AST]
) -> None:
    if isinstance(exception, ast.Name):
        if scopes.resolve(exception.id, functions) is Resolution.BUILTIN:
            value = interpreter_builtin(exception.id)
            if isinstance(value, type) and issubclass(value, BaseException):
                return
        binding = scopes.sole_global_binding(exception.id, functions)
        if binding is not None and binding.kind in (BindingKind.CLASS, BindingKind.IMPORT_FROM):
            return
    elif qualified_name(exception, scopes, functions) is not None:
        return
    raise Decline(f"the exception {ast.unparse(exception)} is not a class the source binds once")


def _is_name_or_names(expr: ast.expr) -> bool:
    if isinstance(expr, ast.Tuple):
        return any(_is_name_or_names(element) for element in expr.elts)
    return isinstance(expr, ast.Name)


class _Message:
    """A guard's message, as parts built at trace time by expressions that cannot fail.

    Names must be bound before the guard; attributes are read with a default, and
    sizes asked only of tensors (``@gm_rt.attribute``, ``@gm_rt.metadata``), so a
    missing or ``None`` value yields a part the runtime refuses (the original
    break) instead of an exception while tracing.
    """

    def __init__(
        self,
        scopes: ModuleScopes,
        functions: Sequence[ast.AST],
        bound: frozenset[str],
        class_name: str | None,
    ) -> None:
        self.scopes = scopes
        self.functions = functions
        self.bound = bound
        #: The class the guard is written in: its private names are mangled.
        self.class_name = class_name
        #: Whether a field formats a name's value itself (``{t}``, ``{(t, n)}``),
        #: which may be a Python float the caller passes.
        self.formats_names = False

    def parts(self, message: ast.expr | None) -> list[ast.expr]:
        if message is None:
            return []
        if isinstance(message, ast.Constant) and isinstance(message.value, str):
            return [self._literal(message.value)]
        path = self._global_path(message)
        if path is not None:  # raise E(MESSAGE): the global itself, read when it fires
            field = (ast.Constant(_AS_GIVEN), ast.Constant(""))
            return [runtime_call("global_text", ast.Constant(path), *field)]
        if isinstance(message, ast.Name):
            return [runtime_call("exact_text", self._value(message))]
        if not isinstance(message, ast.JoinedStr):
            raise Decline("the message is built by an expression that cannot be formatted early")
        parts: list[ast.expr] = []
        for part in message.values:
            if isinstance(part, ast.Constant):
                parts.append(self._literal(part.value))
                continue
            assert isinstance(part, ast.FormattedValue)
            # the spec travels in the template too (f"{STEP:\x1f>5}")
            spec = self._literal(literal_format_spec(part.format_spec))
            field = (ast.Constant(part.conversion), spec)
            path = self._global_path(part.value)
            if path is not None:
                parts.append(runtime_call("global_text", ast.Constant(path), *field))
                continue
            self.formats_names |= _is_name_or_names(part.value)
            parts.append(runtime_call("text", self._value(part.value), *field))
        return parts

    def _global_path(self, expr: ast.expr) -> str | None:
        """``expr`` as ``name.attribute...`` where it reads a module global, and the
        attributes of it (``STEP``, ``math.pi``), else ``None``.  Such a field is read when
        the guard fires (``@gm_rt.global_text``), as the original reads it: read while
        tracing, TorchDynamo would guard on its value, which any module may change between
        calls (``module.STEP = 3``), and the frame compile again for every value.

        Names are mangled as Python compiles them in the class the guard is written in
        (``{__LIMIT}`` in class ``C`` reads the global ``_C__LIMIT``); ``__class__`` in a
        class is the method's implicit closure cell, not a global (the guard keeps its
        break)."""
        attributes: list[str] = []
        while isinstance(expr, ast.Attribute):
            attributes.insert(0, mangled(expr.attr, self.class_name))
            expr = expr.value
        if not isinstance(expr, ast.Name):
            return None
        if self.scopes.resolve(expr.id, self.functions) is Resolution.LOCAL:
            return None
        if expr.id == "__class__" and self.class_name is not None:
            return None
        return ".".join([mangled(expr.id, self.class_name), *attributes])

    @staticmethod
    def _literal(text: str) -> ast.Constant:
        if _SEPARATOR in text:
            raise Decline("the message holds an ASCII unit separator, which it cannot carry")
        return ast.Constant(text)

    def _value(self, expr: ast.expr) -> ast.expr:
        """``expr`` rewritten so that evaluating it early cannot raise; else Decline.

        A global read inside a field (``{(STEP, n)}``, ``{len(LIST)}``) declines: it would
        be read while tracing, and TorchDynamo guard on its value, which any module may
        change between calls (only a field that is a global, or attributes of one, is
        read when the guard fires: :meth:`_global_path`)."""
        if isinstance(expr, ast.Constant):
            return copy.deepcopy(expr)
        if isinstance(expr, ast.Name):
            if self.scopes.resolve(expr.id, self.functions) is not Resolution.LOCAL:
                raise Decline(
                    f"the message reads the global {expr.id} inside an expression, which "
                    "would be read while tracing"
                )
            if expr.id not in self.bound:
                raise Decline(f"the message formats {expr.id}, which may be unbound at the guard")
            return copy.deepcopy(expr)
        if isinstance(expr, ast.Tuple):
            return ast.Tuple(elts=[self._value(e) for e in expr.elts], ctx=ast.Load())
        if isinstance(expr, ast.Attribute):
            if (
                expr.attr == "__name__"
                and isinstance(expr.value, ast.Call)
                and qualified_name(expr.value.func, self.scopes, self.functions) == "builtins.type"
                and len(expr.value.args) == 1
            ):
                return runtime_call("type_name", self._value(expr.value.args[0]))
            name = mangled(expr.attr, self.class_name)
            return runtime_call("attribute", self._value(expr.value), ast.Constant(name))
        if isinstance(expr, ast.Call) and not expr.keywords:
            func = expr.func
            if isinstance(func, ast.Attribute) and func.attr in _SAFE_METHODS and not expr.args:
                return runtime_call("metadata", self._value(func.value), ast.Constant(func.attr))
            name = qualified_name(func, self.scopes, self.functions)
            if name == "builtins.len" and len(expr.args) == 1:
                return runtime_call("metadata", self._value(expr.args[0]), ast.Constant("__len__"))
            if name in ("builtins.tuple", "builtins.list") and len(expr.args) == 1:
                kind = ast.Constant(name.removeprefix("builtins."))
                return runtime_call("sequence", self._value(expr.args[0]), kind)
        raise Decline(
            f"the message formats {ast.unparse(expr)}, which could fail or change if computed "
            "before the guard fires"
        )
