"""T2: output calls (``print``, module loggers, ``warnings.warn``) run after the graph.

A statement such as ``logger.warning_once(f"mean {h.mean()}", stacklevel=1)``
becomes::

    if _@gm_tracing():
        _@gm_arg6 = h.mean()
        _@gm_carried7 = (_@gm_rt.carriable(_@gm_arg6) and _@gm_rt.keyable()
                         and _@gm_rt.defers_here(_@gm_arg6))
        _@gm_defer3(*_@gm_rt.capture(_@gm_arg6, _@gm_carried7))
    else:
        logger.warning_once(f"mean {h.mean()}", stacklevel=1)    # untouched

plus, at module level, one plain function per site that makes the original
call from the values it is given::

    @_@gm_rt.deferred('Block.forward')
    def _@gm_defer3(*gm_tokens5_):
        (gm_p4_,) = _@gm_rt.rebuild(gm_tokens5_)
        logger.warning_once(f"mean {_@gm_rt.render(gm_p4_, -1, '')}", stacklevel=1)

TorchDynamo reorders calls to registered plain functions to after the graph
(``config.reorderable_logging_functions``); it refuses bound methods and drops
keyword arguments, hence a function per site that holds the callee and the
keywords.  Values are captured at the call point, as tokens TorchDynamo can
carry out of the graph (see :mod:`graphmend.runtime.deferral`: tensors are
copied; sizes, shapes, dtypes and Python numbers travel too), and formatted
after the graph exactly as the original would have.  Names that cannot
change before the graph ends (modules, classes, functions, builtins,
``sys.stdout``/``sys.stderr``) are evaluated in the deferred function; anything
TorchDynamo cannot carry out of the graph makes it keep the original call,
with the original graph break.  So does a call whose copies would make a graph
where plain compile has none (``defers_here``: a graph of nothing but copies).
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Callable
from dataclasses import dataclass, field

from graphmend.analysis import output_calls
from graphmend.analysis.host_reads import HostReads
from graphmend.analysis.output_calls import NotProven, OutputCall, OutputKind
from graphmend.analysis.scopes import STATIC_KINDS, Resolution
from graphmend.analysis.walking import walk
from graphmend.findings import Decision
from graphmend.interpreter_builtins import interpreter_builtin
from graphmend.rewrites.common import (
    RUNTIME,
    Decline,
    FunctionStatementRewriter,
    dual_path,
    literal_format_spec,
    load,
    locate,
    make_function,
    mangled,
    named_by_content,
    runtime_call,
    store,
    substituted,
)

_FLAG_KEYWORDS = {"exc_info", "stack_info"}
#: The levels a root ``logging`` attribute names (``logging.INFO``): integers.
_LOGGING_LEVELS = frozenset(
    {"NOTSET", "DEBUG", "INFO", "WARN", "WARNING", "ERROR", "CRITICAL", "FATAL"}
)


@dataclass(frozen=True)
class _Signature:
    """The parameters of an output callee, to check a call binds to them (a call that
    does not raises ``TypeError`` where it stands, and so cannot wait)."""

    positional: tuple[str, ...]  # named positional parameters, in order
    required: int  # how many of those must be given
    keywords: frozenset[str]  # keyword-only parameters
    more_positional: bool  # ``*args``

    def mismatch(self, call: ast.Call) -> str | None:
        """Why ``call`` (no ``*``/``**``) would raise ``TypeError``, or None."""
        given = len(call.args)
        if given > len(self.positional) and not self.more_positional:
            return "too many positional arguments"
        names = [keyword.arg for keyword in call.keywords]
        for name in names:
            if name in self.positional[:given]:
                return f"{name}= given twice"
            if name not in self.positional and name not in self.keywords:
                return f"no parameter {name}="
        for name in self.positional[given : self.required]:
            if name not in names:
                return f"{name} missing"
        return None


_LOGGER_KEYWORDS = frozenset({"exc_info", "stack_info", "stacklevel", "extra"})
_PRINT = _Signature((), 0, frozenset({"sep", "end", "file", "flush"}), more_positional=True)
_LOGGER = _Signature(("msg",), 1, _LOGGER_KEYWORDS, more_positional=True)
_LOGGER_LOG = _Signature(("level", "msg"), 2, _LOGGER_KEYWORDS, more_positional=True)
# skip_file_prefixes (3.12) names callers' frames, gone after the graph: not taken
_WARN = _Signature(("message", "category", "stacklevel", "source"), 1, frozenset(), False)


def _signature(found: OutputCall) -> _Signature:
    if found.kind is OutputKind.PRINT:
        return _PRINT
    if found.kind is OutputKind.WARNING:
        return _WARN
    return _LOGGER_LOG if found.method == "log" else _LOGGER


_STATIC_SYS_ATTRIBUTES = {"stdout", "stderr"}


@dataclass
class _Value:
    """A value the deferred call needs, and how it is captured at the call point."""

    expr: ast.expr
    #: An argument passed to the callee as it is is captured once every later
    #: value was evaluated; f-string pieces and format operands at once.
    consumed_at_call: bool = False
    #: The format of an f-string field with a spec or a conversion (``"{!r:>8}"``),
    #: checked while tracing (``runtime.deferral.formattable``).
    field: str | None = None


@dataclass
class _FormatCheck:
    """A ``%`` or ``str.format`` expression whose values are checked while tracing to
    take its format (``runtime.deferral.formattable``)."""

    template: str
    kind: str  # "%", "%tuple" or "format"
    keywords: tuple[str, ...]
    #: Each operand: the index of a value captured, or its expression (a literal, a
    #: static name), evaluated again for the check.
    operands: list[int | ast.expr]

    def call(self, values: list[ast.expr]) -> ast.Call:
        """The check, given the expressions that hold the captured values."""
        operands = [
            values[operand] if isinstance(operand, int) else copy.deepcopy(operand)
            for operand in self.operands
        ]
        names = ast.Tuple(elts=[ast.Constant(name) for name in self.keywords], ctx=ast.Load())
        return runtime_call(
            "formattable", ast.Constant(self.template), ast.Constant(self.kind), names, *operands
        )


class DeferRewrite(FunctionStatementRewriter):
    """Defers proven output calls while tracing; the eager path is the original call."""

    name = "defer"

    def rewrite_statement(self, statement: ast.stmt) -> ast.stmt | list[ast.stmt]:
        if not isinstance(statement, ast.Expr) or not isinstance(statement.value, ast.Call):
            return statement
        enclosing = self.enclosing
        found = output_calls.classify(statement.value, self.module.scopes, enclosing.functions)
        if found is None:
            return statement
        if isinstance(found, NotProven):
            self.record(statement, Decision.DECLINED, found.reason)
            return statement
        if self.may_catch:
            self.record(
                statement,
                Decision.DECLINED,
                "inside a try (or a with) of this function, whose handlers would no longer "
                "see the call's exceptions after the graph",
            )
            return statement
        host_read = self._host_read(statement.value)
        if host_read is not None:
            self.record(
                statement,
                Decision.DECLINED,
                f"an argument reads tensor data on the host ({host_read}): the graph breaks "
                "there all the same, and the code after the call would join the frame that "
                "resumes after the read, compiled again when the value read changes",
            )
            return statement
        if self._guard_follows(statement):
            self.record(
                statement,
                Decision.DECLINED,
                "a guard on tensor data may run after it in this function: the output must "
                "appear before the guard's exception, so the guard would keep a graph break "
                "instead of this call (one graph more than without GraphMend)",
            )
            return statement
        try:
            plan = _Planner(self, found, statement.value).plan()
        except Decline as reason:
            self.record(statement, Decision.DECLINED, str(reason))
            return statement
        function = plan.deferred_function(
            self.module.fresh_name("defer"), enclosing.qualname, self.module.fresh_identifier
        )
        private = _private_name(function, enclosing.class_name)
        if private is not None:
            self.record(
                statement,
                Decision.DECLINED,
                f"{private} is a private name, which class {enclosing.class_name} mangles: "
                "the call deferred out of the class would read another name",
            )
            return statement
        locate(function, statement)
        function_name = named_by_content(function)
        self.module.module_level.append(function)
        self.record(statement, Decision.REWRITTEN, plan.describe(found))
        tracing_path = plan.tracing_path(function_name, self.module.fresh_name, statement)
        if found.kind is OutputKind.WARNING:
            # a filter that makes it an exception, or a category warn() refuses: the
            # original call, where it stands
            checked = [plan.unproven_category] if plan.unproven_category is not None else []
            unless_raised = ast.If(
                test=runtime_call("warnings_may_raise", *map(copy.deepcopy, checked)),
                body=[copy.deepcopy(statement)],
                orelse=tracing_path,
            )
            tracing_path = [locate(unless_raised, statement)]
        return dual_path(statement, tracing_path)

    def _host_read(self, call: ast.Call) -> str | None:
        """The first host read (``.item()``, ``float(t)``...) among ``call``'s arguments."""
        functions = self.enclosing.functions
        names = self.module.tensor_names(functions[-1], functions)
        reads = HostReads(self.module.scopes, functions, names)
        for argument in [*call.args, *(keyword.value for keyword in call.keywords)]:
            found = reads.first(argument)
            if found is not None:
                return found
        return None

    def _guard_follows(self, statement: ast.stmt) -> bool:
        """Whether a guard on tensor data (``assert``, an ``if`` that only raises) may
        run after ``statement`` in its function: later in the source, or anywhere in
        the function when a loop holds the statement."""
        nodes = walk(self.enclosing.functions[-1])
        line = statement.lineno
        in_loop = any(
            isinstance(node, ast.For | ast.AsyncFor | ast.While)
            and node.lineno <= line <= (node.end_lineno or line)
            for node in nodes
        )
        return any(
            (in_loop or node.lineno > line) and self.may_hold_tensor_data(test)
            for node in nodes
            if (test := _guard_test(node)) is not None
        )


def _private_name(function: ast.FunctionDef, class_name: str | None) -> str | None:
    """The first name or attribute in ``function`` that Python mangles in class
    ``class_name`` (``__log`` is ``_M__log`` in class ``M``), if any: the deferred
    function is defined at module level, where no name is mangled."""
    for node in ast.walk(function):
        name = node.id if isinstance(node, ast.Name) else None
        if isinstance(node, ast.Attribute):
            name = node.attr
        if name is not None and mangled(name, class_name) != name:
            return name
    return None


def _guard_test(node: ast.AST) -> ast.expr | None:
    if isinstance(node, ast.Assert):
        return node.test
    if isinstance(node, ast.If) and len(node.body) == 1 and isinstance(node.body[0], ast.Raise):
        return node.test
    return None


@dataclass
class _Plan:
    callee: ast.expr
    args: list[ast.expr]
    keywords: list[ast.keyword]
    values: list[_Value]
    parameters: list[str]
    #: The callee caches on its arguments (``warning_once``): a tensor passed to it as
    #: it is must be the original object, not a copy, and a list raises (unhashable)
    #: where it stands, so such a call keeps its break (``runtime.deferral.keyable``).
    keyed_on_arguments: bool = False
    format_checks: list[_FormatCheck] = field(default_factory=list)
    #: ``warnings.warn``'s category, checked while tracing to be a class of warnings
    #: (``runtime.deferral.warnings_may_raise``): the source cannot prove it one.
    unproven_category: ast.expr | None = None

    def deferred_function(
        self, name: str, qualname: str, fresh_identifier: Callable[[str], str]
    ) -> ast.FunctionDef:
        """``def name(*tokens): <parameters> = rebuild(tokens); <the original call>``."""
        call = ast.Call(func=self.callee, args=self.args, keywords=self.keywords)
        decorator = ast.Call(
            func=ast.Attribute(value=load(RUNTIME), attr="deferred", ctx=ast.Load()),
            args=[ast.Constant(qualname)],
            keywords=[],
        )
        tokens = fresh_identifier("tokens")
        parameters = ast.Tuple(elts=[store(p) for p in self.parameters], ctx=ast.Store())
        rebuilt = ast.Assign(targets=[parameters], value=runtime_call("rebuild", load(tokens)))
        body = [rebuilt, ast.Expr(call)] if self.parameters else [ast.Expr(call)]
        return make_function(name, [], body, [decorator], vararg=tokens)

    def tracing_path(
        self, function_name: str, fresh_name: Callable[[str], str], site: ast.stmt
    ) -> list[ast.stmt]:
        """Capture the values in source order and call the deferred function with them;
        ``site``, the original call, where the copies would make a graph of their own
        (see :func:`graphmend.runtime.deferral.defers_here`)."""
        if self.checked_first():
            return self._checked_path(function_name, fresh_name, site)
        statements = self._captured_one_by_one(function_name, fresh_name)
        in_place = ast.If(
            test=ast.UnaryOp(op=ast.Not(), operand=runtime_call("graph_started")),
            body=[copy.deepcopy(site)],
            orelse=statements,
        )
        return [locate(in_place, site)]  # type: ignore[list-item]

    def _captured_one_by_one(
        self, function_name: str, fresh_name: Callable[[str], str]
    ) -> list[ast.stmt]:
        """Each value captured where the original evaluates it; a value a format check
        needs is bound to a name as it is captured, and each check is made where the last
        value it needs is captured (that value is not carried where it fails)."""
        held = [fresh_name("held") for _ in self.values]
        checks = self._format_checks([load(name) for name in held])
        statements: list[ast.stmt] = []
        captured: list[ast.expr] = []
        # An argument is consumed at the call, after every later value was
        # evaluated; bind values to temporaries when one is followed by others.
        needs_temporaries = any(value.consumed_at_call for value in self.values[:-1])
        for index, value in enumerate(self.values):
            expr = value.expr
            if not value.consumed_at_call:
                expr = self._capture_checked(index, expr, held[index], checks)
            if needs_temporaries and index < len(self.values) - 1:
                temporary = fresh_name("arg")
                statements.append(ast.Assign(targets=[store(temporary)], value=expr))
                expr = load(temporary)
            if value.consumed_at_call:
                expr = self._capture_checked(index, expr, held[index], checks)
            captured.append(ast.Starred(value=expr, ctx=ast.Load()))
        call = ast.Call(func=load(function_name), args=captured, keywords=[])
        statements.append(ast.Expr(call))
        return statements

    def _capture_checked(
        self, index: int, expr: ast.expr, held: str, checks: list[tuple[ast.expr, int]]
    ) -> ast.expr:
        """``capture((held := expr), carriable(held) and <checks due>)``: bound for the
        checks, and not carried where TorchDynamo could not carry it as it is (a copy of a
        tensor that requires grad prints its own ``grad_fn``) or where a check made once
        it is captured (the last value the check needs) fails."""
        bound = ast.NamedExpr(target=store(held), value=copy.deepcopy(expr))
        due = [check for check, last in checks if last == index]
        carried = [runtime_call("carriable", load(held)), *due]
        test = carried[0] if len(carried) == 1 else ast.BoolOp(op=ast.And(), values=carried)
        return runtime_call("capture", bound, test)

    def checked_first(self) -> bool:
        """Whether every value may be evaluated before any is captured: nothing evaluated
        after a value captured at once (an f-string piece) can change it."""
        early = [index for index, value in enumerate(self.values) if not value.consumed_at_call]
        return not early or all(_inert(value.expr) for value in self.values[early[0] + 1 :])

    def _checked_path(
        self, function_name: str, fresh_name: Callable[[str], str], site: ast.stmt
    ) -> list[ast.stmt]:
        """Evaluate the values, then ask whether TorchDynamo can carry them all, and
        whether their copies fit in the graph, before any is copied: where not, the
        original call is made where it stands with the values evaluated, so that it breaks
        the graph as the original does, with no copy made (an operation the original does
        not have)."""
        statements: list[ast.stmt] = []
        names = []
        for value in self.values:
            names.append(fresh_name("arg"))
            statements.append(ast.Assign(targets=[store(names[-1])], value=value.expr))
        carried = fresh_name("carried")
        checks = [
            runtime_call("carriable", *[load(name) for name in names]),
            *(check for check, _ in self._format_checks([load(name) for name in names])),
        ]
        if self.keyed_on_arguments:
            passed = [
                load(name)
                for name, value in zip(names, self.values, strict=True)
                if value.consumed_at_call
            ]
            checks.append(runtime_call("keyable", *passed))
        # last: only a call the other checks let wait opens its site (see runtime.skipped_frames)
        checks.append(runtime_call("defers_here", *[load(name) for name in names]))
        check = ast.BoolOp(op=ast.And(), values=checks)
        statements.append(ast.Assign(targets=[store(carried)], value=check))
        captured = [
            ast.Starred(value=runtime_call("capture", load(name)), ctx=ast.Load()) for name in names
        ]
        deferred = ast.Expr(ast.Call(func=load(function_name), args=captured, keywords=[]))
        kept = locate(self._made_from(site, names), site)
        statements.append(ast.If(test=load(carried), body=[deferred], orelse=[kept]))
        return statements

    def _made_from(self, site: ast.stmt, names: list[str]) -> ast.stmt:
        """``site`` with each value read from the name that holds it: a break where the
        original's is (a ``%`` format of a tensor, which TorchDynamo cannot resume after,
        where the generated function's call is one it resumes after)."""
        held = [(value.expr, name) for value, name in zip(self.values, names, strict=True)]
        return substituted(site, held)  # type: ignore[return-value]

    def _format_checks(self, values: list[ast.expr]) -> list[tuple[ast.expr, int]]:
        """The checks that the values, held by ``values``, take their formats, each with
        the index of the last value it needs."""
        checks = [
            (_field_check(value.field, held), index)
            for index, (value, held) in enumerate(zip(self.values, values, strict=True))
            if value.field is not None
        ]
        for check in self.format_checks:
            last = max(operand for operand in check.operands if isinstance(operand, int))
            checks.append((check.call(values), last))
        return checks

    def describe(self, found: OutputCall) -> str:
        what = {
            OutputKind.PRINT: "print()",
            OutputKind.LOGGER: f"logger.{found.method}()",
            OutputKind.WARNING: "warnings.warn()",
        }[found.kind]
        count = len(self.values)
        carried = f"{count} value{'s' if count != 1 else ''} captured at the call"
        return f"{what} deferred until after the graph ({carried})"


class _Planner:
    """Splits one output call into values captured now and a call made later."""

    def __init__(self, rewriter: DeferRewrite, found: OutputCall, call: ast.Call) -> None:
        self.scopes = rewriter.module.scopes
        self.functions = rewriter.enclosing.functions
        self.found = found
        self.call = call
        self.values: list[_Value] = []
        self.parameters: list[str] = []
        self.format_checks: list[_FormatCheck] = []
        self.fresh_identifier = rewriter.module.fresh_identifier
        #: ``warnings.warn``'s category where the source cannot prove it a class of warnings
        self.unproven_category: ast.expr | None = None

    def plan(self) -> _Plan:
        call = self.call
        if any(isinstance(arg, ast.Starred) for arg in call.args) or any(
            keyword.arg is None for keyword in call.keywords
        ):
            raise Decline("*args or **kwargs cannot be carried out of the graph")
        self._check_keywords()
        args = self._lift_arguments(call.args)
        keywords = [
            ast.keyword(arg=keyword.arg, value=self._lift(keyword.value))
            for keyword in call.keywords
        ]
        plan = _Plan(
            callee=copy.deepcopy(call.func),
            args=args,
            keywords=keywords,
            values=self.values,
            parameters=self.parameters,
            keyed_on_arguments=self.found.method.endswith("_once"),
            format_checks=self.format_checks,
            unproven_category=self.unproven_category,
        )
        if plan.keyed_on_arguments and not plan.checked_first():
            raise Decline(
                f"{self.found.method}() remembers its arguments, and those cannot be checked "
                "before an f-string's values are copied"
            )
        return plan

    def _check_keywords(self) -> None:
        keywords = {keyword.arg: keyword.value for keyword in self.call.keywords}
        self._check_raising_arguments(keywords)
        if self.found.kind is OutputKind.LOGGER:
            for flag in _FLAG_KEYWORDS & keywords.keys():
                value = keywords[flag]
                if not (isinstance(value, ast.Constant) and value.value in (False, None)):
                    raise Decline(
                        f"{flag}= reads the interpreter state at the call; it cannot wait"
                    )
        stacklevel = keywords.get("stacklevel")
        if (
            self.found.kind is OutputKind.WARNING
            and stacklevel is None
            and len(self.call.args) >= 3
        ):
            stacklevel = self.call.args[2]
        if stacklevel is not None and not (
            isinstance(stacklevel, ast.Constant) and stacklevel.value == 1
        ):
            raise Decline(
                "stacklevel other than 1 names a caller's frame, which is gone after the graph"
            )

    def _check_raising_arguments(self, keywords: dict[str | None, ast.expr]) -> None:
        """Decline a call that an argument may make raise: made after the graph, it would
        raise once the graph has run (and updated its inputs), not where it stands.
        The call must bind to the callee's parameters; ``print``'s ``sep`` and ``end`` must
        be text or None, its ``file`` None, ``sys.stdout`` or ``sys.stderr``;
        ``logger.log``'s level an integer; ``warnings.warn``'s category a class of
        warnings (or None)."""
        if self.found.kind is OutputKind.PRINT:
            for name in ("sep", "end"):
                value = keywords.get(name)
                if value is not None and not (
                    isinstance(value, ast.Constant) and isinstance(value.value, str | None)
                ):
                    raise Decline(f"print()'s {name}= may not be text, and print() then raises")
            self._check_file(keywords.get("file"))
        mismatch = _signature(self.found).mismatch(self.call)
        if mismatch is not None:
            raise Decline(f"the call raises TypeError where it stands ({mismatch})")
        if self.found.kind is OutputKind.LOGGER and self.found.method == "log":
            level = keywords.get("level", self.call.args[0] if self.call.args else None)
            if level is not None and not self._integer_level(level):
                raise Decline("log()'s level may not be an integer, and log() then raises")
        if self.found.kind is OutputKind.WARNING:
            category = keywords.get("category")
            if category is None and len(self.call.args) >= 2:
                category = self.call.args[1]
            if category is not None:
                self._check_category(category)

    def _check_file(self, file: ast.expr | None) -> None:
        """Decline ``print(..., file=...)`` to anything but None, ``sys.stdout`` and
        ``sys.stderr``: TorchDynamo carries out of the graph only values such as numbers
        and text, which print() cannot write to (it raises ``AttributeError`` where it
        stands, deferred it would raise after the graph updated its inputs), and never a
        file object (the call would keep its break all the same)."""
        if file is None or (isinstance(file, ast.Constant) and file.value is None):
            return
        if isinstance(file, ast.Attribute) and self._is_static(file):  # sys.stdout, sys.stderr
            return
        raise Decline(
            "print()'s file= is not sys.stdout or sys.stderr: a file object cannot be "
            "carried out of the graph, and print() raises where it stands on anything else"
        )

    def _integer_level(self, level: ast.expr) -> bool:
        """Whether ``level`` is an integer: a literal, or a level of the ``logging``
        module (``logging.INFO``)."""
        if isinstance(level, ast.Constant):
            return isinstance(level.value, int)
        if not (isinstance(level, ast.Attribute) and isinstance(level.value, ast.Name)):
            return False
        binding = self.scopes.sole_global_binding(level.value.id, self.functions)
        return (
            binding is not None and binding.imported == "logging" and level.attr in _LOGGING_LEVELS
        )

    def _check_category(self, category: ast.expr) -> None:
        """Decline a category that is not a class of warnings; one the source cannot prove
        (a module's own class) is checked while tracing (``warnings_may_raise``), where
        evaluating it once more cannot change anything (a name, an attribute)."""
        known = self._warning_class(category)
        if known is False:
            raise Decline("the category is not a class of warnings, and warn() then raises")
        if known is None:
            if not _inert(category):
                raise Decline(
                    "the category may not be a class of warnings (warn() then raises at "
                    "the call), and it cannot be checked without evaluating it twice"
                )
            self.unproven_category = category

    def _warning_class(self, expr: ast.expr) -> bool | None:
        """Whether ``expr`` is a class of warnings (or None, which ``warn()`` takes too):
        known for a constant and a builtin name, None (not known) for any other."""
        if isinstance(expr, ast.Constant):
            return expr.value is None
        if isinstance(expr, ast.Name) and self.scopes.resolve(expr.id, self.functions) is (
            Resolution.BUILTIN
        ):
            builtin = interpreter_builtin(expr.id)
            return isinstance(builtin, type) and issubclass(builtin, Warning)
        return None

    def _lift_arguments(self, arguments: list[ast.expr]) -> list[ast.expr]:
        """The call's positional arguments lifted (:meth:`_lift`); a logger call's message
        and its arguments, which logging formats with ``%`` when it emits the record,
        are checked as a ``%`` expression is (:meth:`_check_format`)."""
        lifted: list[ast.expr] = []
        refs: list[int | ast.expr] = []
        for argument in arguments:
            count = len(self.values)
            lifted.append(self._lift(argument))
            if len(self.values) == count:
                refs.append(argument)  # a literal or a static name
            elif len(self.values) == count + 1 and self.values[count].expr is argument:
                refs.append(count)
            else:  # an f-string or a format expression: text
                refs.append(ast.Constant(""))
        message = 1 if self.found.method == "log" else 0
        if self.found.kind is OutputKind.LOGGER and len(arguments) > message + 1:
            self._check_logged_format(arguments[message], refs[message + 1 :])
        return lifted

    def _check_logged_format(self, template: ast.expr, refs: list[int | ast.expr]) -> None:
        """Logging formats ``template % arguments`` when it emits a record with arguments;
        a handler may let the error out (pytest's log capture does), which after the
        graph would come once the graph had updated its inputs."""
        if not (isinstance(template, ast.Constant) and isinstance(template.value, str)):
            return  # not known before it runs (a constant's name, an f-string): unchecked
        if any(isinstance(ref, int) for ref in refs):
            self._check_format(template, "%tuple", (), refs)
            return
        try:
            operands = tuple(ast.literal_eval(ref) for ref in refs)  # type: ignore[arg-type]
        except ValueError:
            return  # a static name (a class, a function) formats as text whenever it runs
        try:
            template.value % operands
        except Exception:
            raise Decline("the logged message does not take its arguments") from None

    def _parameter(self, value: _Value) -> ast.Name:
        self.values.append(value)
        self.parameters.append(self.fresh_identifier("p"))
        return load(self.parameters[-1])

    def _lift(self, expr: ast.expr) -> ast.expr:
        """The expression the deferred function uses in place of ``expr``."""
        if _is_literal(expr) or self._is_static(expr):
            return copy.deepcopy(expr)
        if isinstance(expr, ast.JoinedStr):
            return ast.JoinedStr(values=[self._lift_fstring_part(part) for part in expr.values])
        if _is_percent_format(expr):
            assert isinstance(expr, ast.BinOp)
            right = expr.right
            if isinstance(right, ast.Tuple) and any(isinstance(e, ast.Starred) for e in right.elts):
                raise Decline("*args in a %-format cannot be carried out of the graph")
            elements = right.elts if isinstance(right, ast.Tuple) else [right]
            lifted, refs = self._lift_operands(elements)
            operands = (
                ast.Tuple(elts=lifted, ctx=ast.Load())
                if isinstance(right, ast.Tuple)
                else lifted[0]
            )
            kind = "%tuple" if isinstance(right, ast.Tuple) else "%"
            self._check_format(expr.left, kind, (), refs)
            return ast.BinOp(left=copy.deepcopy(expr.left), op=ast.Mod(), right=operands)
        if _is_str_format(expr):
            assert isinstance(expr, ast.Call)
            if any(isinstance(a, ast.Starred) for a in expr.args) or any(
                k.arg is None for k in expr.keywords
            ):
                raise Decline(
                    "*args or **kwargs in str.format() cannot be carried out of the graph"
                )
            args, refs = self._lift_operands(expr.args)
            keyword_values, keyword_refs = self._lift_operands([k.value for k in expr.keywords])
            names = tuple(str(k.arg) for k in expr.keywords)
            self._check_format(expr.func.value, "format", names, [*refs, *keyword_refs])  # type: ignore[attr-defined]
            return ast.Call(
                func=copy.deepcopy(expr.func),
                args=args,
                keywords=[
                    ast.keyword(arg=name, value=value)
                    for name, value in zip(names, keyword_values, strict=True)
                ],
            )
        return self._parameter(_Value(expr, consumed_at_call=True))

    def _lift_operands(
        self, operands: list[ast.expr]
    ) -> tuple[list[ast.expr], list[int | ast.expr]]:
        """Each operand lifted (:meth:`_lift_operand`), and what holds it for a format
        check: the index of its value, or the operand itself (a literal, a static name)."""
        lifted: list[ast.expr] = []
        refs: list[int | ast.expr] = []
        for operand in operands:
            count = len(self.values)
            lifted.append(self._lift_operand(operand))
            refs.append(count if len(self.values) > count else operand)
        return lifted, refs

    def _check_format(
        self, template: ast.expr, kind: str, keywords: tuple[str, ...], refs: list[int | ast.expr]
    ) -> None:
        """Check the values of a format expression while tracing, if any is captured."""
        if any(isinstance(ref, int) for ref in refs):
            assert isinstance(template, ast.Constant)
            self.format_checks.append(_FormatCheck(template.value, kind, keywords, refs))

    def _lift_operand(self, expr: ast.expr) -> ast.expr:
        if _is_literal(expr) or self._is_static(expr):
            return copy.deepcopy(expr)
        return self._parameter(_Value(expr))

    def _lift_fstring_part(self, part: ast.expr) -> ast.expr:
        if not isinstance(part, ast.FormattedValue):
            return copy.deepcopy(part)
        spec = literal_format_spec(part.format_spec)
        if _is_literal(part.value) or self._is_static(part.value):
            return copy.deepcopy(part)
        parameter = self._parameter(_Value(part.value, field=_field(part.conversion, spec)))
        rendered = runtime_call(
            "render", parameter, ast.Constant(part.conversion), ast.Constant(spec)
        )
        return ast.FormattedValue(value=rendered, conversion=-1, format_spec=None)

    def _is_static(self, expr: ast.expr) -> bool:
        """Whether ``expr`` has the same value after the graph as at the call.

        True for names bound once to a module, class or function, for builtin
        classes and functions, and for ``sys.stdout``/``sys.stderr``.
        """
        if isinstance(expr, ast.Attribute):
            if not isinstance(expr.value, ast.Name) or expr.attr not in _STATIC_SYS_ATTRIBUTES:
                return False
            binding = self.scopes.sole_global_binding(expr.value.id, self.functions)
            return binding is not None and binding.imported == "sys"
        if not isinstance(expr, ast.Name):
            return False
        if self.scopes.resolve(expr.id, self.functions) is Resolution.BUILTIN:
            return interpreter_builtin(expr.id) is not None
        binding = self.scopes.sole_global_binding(expr.id, self.functions)
        return binding is not None and binding.kind in STATIC_KINDS


_CONVERSION_MARKS = {-1: "", ord("s"): "!s", ord("r"): "!r", ord("a"): "!a"}


def _field(conversion: int, spec: str) -> str | None:
    """The format of one f-string field (``"{!r:>8}"``), or ``None`` where it cannot
    raise (no spec, no conversion: ``str()``)."""
    if conversion == -1 and not spec:
        return None
    return "{" + _CONVERSION_MARKS[conversion] + (":" + spec if spec else "") + "}"


def _field_check(template: str, held: ast.expr) -> ast.Call:
    """``formattable(template, "field", (), held)``."""
    no_names = ast.Tuple(elts=[], ctx=ast.Load())
    return runtime_call(
        "formattable", ast.Constant(template), ast.Constant("field"), no_names, held
    )


def _is_literal(expr: ast.expr) -> bool:
    if isinstance(expr, ast.Constant):
        return True
    if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.USub | ast.UAdd):
        return isinstance(expr.operand, ast.Constant)
    if isinstance(expr, ast.Tuple):
        return all(_is_literal(element) for element in expr.elts)
    return False


def _inert(expr: ast.expr) -> bool:
    """Whether evaluating ``expr`` cannot change a value: a name, a constant, an
    attribute of one."""
    while isinstance(expr, ast.Attribute):
        expr = expr.value
    return isinstance(expr, ast.Name | ast.Constant)


def _is_percent_format(expr: ast.expr) -> bool:
    return (
        isinstance(expr, ast.BinOp)
        and isinstance(expr.op, ast.Mod)
        and isinstance(expr.left, ast.Constant)
        and isinstance(expr.left.value, str)
        and not isinstance(expr.right, ast.Dict)
    )


def _is_str_format(expr: ast.expr) -> bool:
    return (
        isinstance(expr, ast.Call)
        and isinstance(expr.func, ast.Attribute)
        and expr.func.attr == "format"
        and isinstance(expr.func.value, ast.Constant)
        and isinstance(expr.func.value.value, str)
    )
