"""Translate a condition so that its tensor parts stay tensors while tracing.

``not`` becomes a runtime helper; ``and``/``or`` become statements that keep
Python's short circuit for Python values and, when the left side is a tensor
and the right side is pure, combine both with a logical operator (generated
as statements rather than lambdas, so that no local of the function becomes a
closure cell and the eager path stays as fast as before); a host read
(``.item()``, ``float(x)``, ``int(x)``, ``bool(x)``) that feeds a comparison or
the truth of the condition becomes a device value compared exactly;
``torch.equal``/``torch.allclose`` become their on-device equivalents, and so
does a membership test (``0.0 in mask``), which searches a tensor on the host.  The
right side of ``and``/``or`` is evaluated ahead of time only when it is pure, and as an
attempt (``runtime.conditions.speculated``): where it cannot be traced, raises when it
runs, or has no single truth, the original's jump decides.  Each host read is marked
where the original makes it (``runtime.read_on_host``): where the choice is made on the
host after all, the next analysis reads the frame's first as written, the original's
break.
Everything else is left as written, so that the translated condition always
computes what the original computes, and whatever it cannot keep on the
device is decided on the host exactly as before.
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from graphmend.analysis.bindings import names_read
from graphmend.analysis.purity import is_host_conversion, is_number_search, qualified_name
from graphmend.analysis.scopes import ModuleScopes, Resolution
from graphmend.analysis.speculation import speculation_problem
from graphmend.rewrites.common import (
    Decline,
    ModuleContext,
    load,
    make_function,
    replaced,
    runtime_call,
    store,
    substituted,
    tuple_of,
)

_COMPARISON_SYMBOLS: dict[type[ast.cmpop], str] = {
    ast.Eq: "==",
    ast.NotEq: "!=",
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
}
#: Reads of tensors kept on the device, by the runtime's form of each, and the keywords
#: a call of it may pass (a call passing others, its tensors by keyword included, is
#: left as it is: the runtime's forms take the tensors by position).
_ON_DEVICE: dict[str, tuple[str, frozenset[str]]] = {
    "torch.equal": ("equal", frozenset()),
    "torch.allclose": ("allclose", frozenset({"rtol", "atol", "equal_nan"})),
}
#: How many arguments the calls of :data:`_ON_DEVICE` take by position, at most.
_MOST_POSITIONAL = {"equal": 2, "allclose": 5}


def on_device_form(node: ast.AST, scopes: ModuleScopes, functions: Sequence[ast.AST]) -> str | None:
    """The runtime's on-device form of ``node`` (``torch.equal(a, b)`` -> ``equal``) if
    it is a read of tensors GraphMend keeps on the device, called in a way that form
    takes (both tensors by position, nothing unpacked), else ``None``."""
    if not isinstance(node, ast.Call):
        return None
    form, keywords = _ON_DEVICE.get(qualified_name(node.func, scopes, functions) or "", ("", ()))
    if (
        not form
        or not 2 <= len(node.args) <= _MOST_POSITIONAL[form]
        or any(isinstance(arg, ast.Starred) for arg in node.args)
        or any(keyword.arg not in keywords for keyword in node.keywords)
    ):
        return None
    return form


#: The attribute that marks the nodes of a test the translation reads again on purpose
#: (``Translation.choice_on_host``), host reads included.
_READ_AGAIN = "graphmend_read_again"


class Untranslatable(Decline):
    """A condition whose host reads cannot be kept on the device exactly."""


def test_to_evaluate_again(
    test: ast.expr, scopes: ModuleScopes, functions: Sequence[ast.AST]
) -> ast.expr | None:
    """A copy of ``test`` where it searches a tensor for a number (``0 in mask``), else
    ``None``.

    TorchDynamo cannot resume after that search, so plain compile keeps the graph up
    to its last checkpoint and runs the rest of the frame eagerly, while a jump on the
    device value breaks there and compiles the rest (one graph more than plain).  Where
    the original choice is made on the host after all (the branches do not merge, a
    guard is not lowered), such a test, pure, is evaluated again as written, to break as
    the original does; one that is not pure is declined.
    """
    if not any(is_number_search(node) for node in ast.walk(test)):
        return None
    problem = speculation_problem(test, scopes, functions)
    if problem is not None:
        raise Untranslatable(
            "a search of a tensor for a number breaks where plain compile cannot resume, "
            f"and the condition cannot be evaluated again: {problem}"
        )
    return copy.deepcopy(test)


def jumps_moved_to_device(
    test: ast.expr,
    scopes: ModuleScopes,
    functions: Sequence[ast.AST],
    may_be_tensor: Callable[[ast.expr], bool],
) -> bool:
    """Whether :class:`ConditionTranslator` puts on the device a choice the original makes
    on the host, a jump on what ``may_be_tensor`` (``not t``, ``t and b`` with ``b``
    pure, ``a < t < c``) or a read of a tensor (``torch.equal``): where the truth is
    read on the host after all, it breaks the graph there, as the original does (a
    host read or a ``torch.equal`` GraphMend translates is read again by
    :meth:`Translation.choice_on_host`).  ``test`` is an assert's: Python folds a
    ``not`` that the test jumps on into the jump, and TorchDynamo turns the assert's
    last jump into ``torch._assert_async`` itself where it is a jump if true, past an
    even number of them (``assert not not t``: no break in the original)."""
    folded, inverted, last = _folded_nots(test)
    if inverted and may_be_tensor(last):
        return True  # the last jump is one if false, a break
    for node in ast.walk(test):
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            if id(node) not in folded and may_be_tensor(node.operand):
                return True
        elif isinstance(node, ast.Compare) and len(node.ops) > 1:
            if may_be_tensor(node.left) or may_be_tensor(node.comparators[0]):
                return True
        elif isinstance(node, ast.BoolOp):
            rest = node.values[1:]
            rest_node = rest[0] if len(rest) == 1 else ast.BoolOp(op=node.op, values=rest)
            jumps = any(map(may_be_tensor, node.values[:-1]))
            if jumps and speculation_problem(rest_node, scopes, functions) is None:
                return True
        elif on_device_form(node, scopes, functions) is not None:
            return True
    return False


def _folded_nots(test: ast.expr) -> tuple[set[int], bool, ast.expr]:
    """The ``not`` operators of the test ``test`` that Python folds into its jumps (by
    id: those it jumps on, through ``and``/``or``), whether the last jump is inverted (one
    if false: past an odd number of them), and what it jumps on."""
    folded: set[int] = set()
    stack = [test]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            folded.add(id(node))
            stack.append(node.operand)
        elif isinstance(node, ast.BoolOp):
            stack.extend(node.values)
    inverted, last = False, test
    while True:
        if isinstance(last, ast.UnaryOp) and isinstance(last.op, ast.Not):
            inverted, last = not inverted, last.operand
        elif isinstance(last, ast.BoolOp):
            last = last.values[-1]
        else:
            return folded, inverted, last


@dataclass(frozen=True)
class Translation:
    """A condition translated for tracing."""

    #: Statements to run first.
    prelude: tuple[ast.stmt, ...]
    #: Then the condition, its tensor parts kept on the device.
    condition: ast.expr
    #: A test that is one comparison, one host read or one ``torch.equal``/``allclose``
    #: (or ``not`` of one), as written, each operand read from the local the condition
    #: bound it to (``_@gm_operand3.item() > lim``).
    reread: ast.expr | None
    #: Whether that comparison was made on the device (``runtime.compared_on_device``);
    #: ``None``: where the condition's value is a tensor (and, for a host read, the
    #: value it reads, :attr:`read_of`).
    on_device: ast.expr | None
    #: For a test that is one host read, a read of the local holding what it reads.
    read_of: ast.expr | None
    #: The condition's name for what it evaluates ahead of the original's break (after
    #: its first host read, ``runtime.read_on_host``; the right sides of its
    #: ``and``/``or``, ``runtime.conditions.speculated``), if any.
    name: str | None

    def choice_on_host(self, evaluated: ast.expr) -> ast.expr:
        """The choice as the original makes it, given ``evaluated``, the condition's value,
        where it is made on the host after all.  Where the comparison of a :attr:`reread`
        test was made on the device, that test: the host value read from the bound
        operands, a break at the read as the original's, and the frame resumes with the
        number read, as the original's does; where it was made as the original makes it,
        ``evaluated``, its result.  A longer test's truth is taken by the caller's jump on
        it, as the original's: its first host read was made as written (where the
        choice is made on the host, the analysis restarts for it), so what is left on
        the device is what the original jumps on (read with ``.item()`` instead, it
        broke inside GraphMend's runtime, and the frame resumed there guarded the
        number read, or raised while traced: one graph or frame given up more than
        plain compile; fuzz seed 2402).  Where the condition evaluated anything
        ahead of the original's break, ``before_host_choice(<name>) or <choice>``: it
        may restart the analysis, the first read made on the host or a right side read
        by the original's jump (:mod:`graphmend.runtime.ahead_of_reads`)."""
        if self.reread is not None:
            made_on_device = _made_on_device(self.on_device, self.read_of, evaluated)
            choice: ast.expr = ast.IfExp(
                test=made_on_device, body=copy.deepcopy(self.reread), orelse=evaluated
            )
        else:
            choice = evaluated
        if self.name is None:
            return choice
        kept = runtime_call("before_host_choice", ast.Constant(self.name))
        return ast.BoolOp(op=ast.Or(), values=[kept, choice])


class ConditionTranslator:
    """Builds the tracing-time version of a condition: statements to run, then an expression."""

    def __init__(
        self,
        module: ModuleContext,
        functions: Sequence[ast.AST],
        rewrite: str,
        bound: frozenset[str],
    ) -> None:
        """``rewrite``: the rewrite the condition is a site of, for what an attempt records;
        ``bound``: the names of the function certainly bound where the condition stands."""
        self.module = module
        self.scopes = module.scopes
        self.functions = functions
        self.rewrite = rewrite
        self.bound = bound
        self.prelude: list[ast.stmt] = []
        self._locals: set[str] = set()
        self._condition_name: str | None = None  # the condition's name, once it needs one
        #: how many of the condition's reads on the host are translated
        self._reads = 0
        #: each operand of a host comparison and the local it is bound to
        self._operands: list[tuple[ast.expr, str]] = []
        #: each host read compared, and the local its value (``host_value``'s) is bound to
        self._compared_reads: list[tuple[ast.expr, str]] = []
        #: each host read, by id, and a read of the local holding what it reads (a
        #: constant as it is)
        self._read_of: dict[int, ast.expr] = {}
        #: the tests whose operands the translation bound, by id: comparisons of host
        #: reads, host reads, reads kept on the device (see _reread)
        self._rereadable: set[int] = set()
        #: each comparison of host reads, by id, and whether it was made on the device
        self._on_device: dict[int, ast.expr] = {}

    def _local(self, role: str) -> str:
        """A new injected name for a local the translation binds."""
        name = self.module.fresh_name(role)
        self._locals.add(name)
        return name

    def translate(self, condition: ast.expr) -> Translation:
        """Statements to run first, and the condition with tensor parts kept on the device."""
        self.prelude = []
        self._operands = []
        self._compared_reads = []
        self._read_of = {}
        self._condition_name = None
        self._reads = 0
        self._rereadable = set()
        self._on_device = {}
        translated = self._condition(condition)
        everything = ast.Module(body=[*self.prelude, ast.Expr(translated)], type_ignores=[])
        for node in ast.walk(everything):
            if self._is_host_read(node) and not hasattr(node, _READ_AGAIN):
                raise Untranslatable(
                    f"{ast.unparse(node)} reads a tensor on the host for something other than "
                    "a comparison or a truth test"
                )
        return Translation(
            tuple(self.prelude),
            translated,
            self._reread(condition),
            self._on_device.get(id(_without_not(condition))),
            self._read_of.get(id(_without_not(condition))),
            self._condition_name,
        )

    def _reread(self, test: ast.expr) -> ast.expr | None:
        """``test``, one comparison, one host read or one read of tensors GraphMend keeps
        on the device (``torch.equal``), or ``not`` of one, with each operand the
        translation bound read from its local (see :meth:`Translation.choice_on_host`)."""
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            operand = self._reread(test.operand)
            return None if operand is None else ast.UnaryOp(op=ast.Not(), operand=operand)
        if id(test) not in self._rereadable:
            return None
        # a host read compared is read again only where it read a tensor and was kept on
        # the device: one converted on the host (an object's own item(), int() of a
        # float) is its value
        kept = [
            (
                read,
                ast.IfExp(
                    test=_made_on_device(None, self._read_of[id(read)], load(name)),
                    body=substituted(read, self._operands),
                    orelse=load(name),
                ),
            )
            for read, name in self._compared_reads
        ]
        operands = [(operand, load(name)) for operand, name in self._operands]
        return replaced(test, [*kept, *operands])  # type: ignore[return-value]

    def _bound(self, operand: ast.expr) -> tuple[ast.expr, ast.expr]:
        """``(_@gm_operandN := operand)`` and a read of it, the operand remembered for
        :meth:`_reread`; a constant as it is, twice."""
        if isinstance(operand, ast.Constant):
            return copy.deepcopy(operand), copy.deepcopy(operand)
        name = self._local("operand")
        self._operands.append((operand, name))
        return ast.NamedExpr(target=store(name), value=copy.deepcopy(operand)), load(name)

    def _condition(self, node: ast.expr) -> ast.expr:
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return runtime_call("not_", self._condition(node.operand))
        if isinstance(node, ast.BoolOp):
            return self._bool_op(node)
        if isinstance(node, ast.Compare):
            return self._compare(node)
        if isinstance(node, ast.Call):
            return self._call(node) or copy.deepcopy(node)
        return copy.deepcopy(node)

    def _bool_op(self, node: ast.BoolOp) -> ast.expr:
        """``a and b``: ``r = a``; combine with ``b`` on the device, or short-circuit in Python.

        For ``and`` (``or`` mirrors it)::

            r = <a>
            if _@gm_rt.is_scalar_tensor(r):      # only when b is pure
                r = _@gm_rt.logical_and(r, <b>)
            elif r:
                r = <b>
            else:
                r = False

        The conditions are read for their truth only, and where ``a``'s truth was read in
        Python (a jump on a tensor ``a``: a graph break, as the original's), ``r`` holds
        it: a second read, the test of ``r``, would break the graph again (or call an
        object's ``__bool__`` twice).  Where ``b`` was to be combined on the device but
        could not be traced ahead of time, both are read by jumps as written
        (:func:`_as_written`).
        """
        is_and = isinstance(node.op, ast.And)
        result = self._local("bool")
        self.prelude.append(
            ast.Assign(targets=[store(result)], value=self._condition(node.values[0]))
        )
        rest = node.values[1:]
        rest_node = rest[0] if len(rest) == 1 else ast.BoolOp(op=node.op, values=rest)
        outer_prelude = self.prelude
        self.prelude = []
        rest_value = self._condition(rest_node)
        rest_prelude = self.prelude
        self.prelude = outer_prelude
        left_truth = self._truth_as_read(node.values[0], result)
        python_test = left_truth if is_and else ast.UnaryOp(op=ast.Not(), operand=left_truth)
        python_path = ast.If(
            test=python_test,
            body=[*rest_prelude, ast.Assign(targets=[store(result)], value=rest_value)],
            orelse=[ast.Assign(targets=[store(result)], value=ast.Constant(not is_and))],
        )
        if speculation_problem(rest_node, self.scopes, self.functions) is not None:
            self.prelude.append(python_path)
            return load(result)
        ahead = self._ahead_of_time(rest_prelude, rest_value)
        if ahead is None:
            self.prelude.append(python_path)
            return load(result)
        definition, attempt = ahead
        value = self._local("right")
        combined = runtime_call(
            "logical_and" if is_and else "logical_or",
            load(result),
            ast.Subscript(value=load(value), slice=ast.Constant(0), ctx=ast.Load()),
        )
        taken = ast.If(
            test=ast.Compare(left=load(value), ops=[ast.IsNot()], comparators=[ast.Constant(None)]),
            body=[ast.Assign(targets=[store(result)], value=combined)],
            orelse=[
                _as_written(node.op, result, left_truth, rest_value, self._name())
                if not rest_prelude
                else python_path
            ],
        )
        self.prelude.append(
            ast.If(
                test=runtime_call("is_scalar_tensor", load(result)),
                body=[definition, ast.Assign(targets=[store(value)], value=attempt), taken],
                orelse=[python_path],
            )
        )
        return load(result)

    def _truth_as_read(self, left: ast.expr, result: str) -> ast.expr:
        """The truth of ``left``, whose value ``result`` holds, where Python takes it: read
        again from its bound operands where it is one comparison of host reads made on
        the device, one host read or one read kept on the device (a break at the read,
        as the original's, not at a jump on a tensor; see
        :meth:`Translation.choice_on_host`), else ``result``.  Read again where the
        condition noted a read, ``before_host_choice(<name>) or <truth>``: what it
        evaluated since may need the original's break at that read
        (:mod:`graphmend.runtime.ahead_of_reads`)."""
        reread = self._reread(left)
        if reread is None:
            return load(result)
        for node in ast.walk(reread):
            setattr(node, _READ_AGAIN, True)  # kept by copies
        single = _without_not(left)
        truth: ast.expr = ast.IfExp(
            test=_made_on_device(
                self._on_device.get(id(single)), self._read_of.get(id(single)), load(result)
            ),
            body=reread,
            orelse=load(result),
        )
        if self._condition_name is None:
            return truth
        kept = runtime_call("before_host_choice", self._name())
        return ast.BoolOp(op=ast.Or(), values=[kept, truth])

    def _ahead_of_time(
        self, prelude: list[ast.stmt], value: ast.expr
    ) -> tuple[ast.stmt, ast.expr] | None:
        """A function computing the right side of an ``and``/``or`` (its ``prelude``, then
        ``(value,)``) from the locals it reads, and the call evaluating it ahead of time as
        an attempt (``runtime.conditions.speculated``); ``None`` where a local it reads may
        be unbound there (the original raises only if it evaluates that side)."""
        body = [*copy.deepcopy(prelude), ast.Return(value=tuple_of([copy.deepcopy(value)]))]
        assigned = {
            node.id if isinstance(node, ast.Name) else node.name
            for statement in body
            for node in ast.walk(statement)
            if (isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store))
            or isinstance(node, ast.FunctionDef)  # a nested and/or's own function
        }
        own = self.scopes.locals_of(self.functions[-1]) if self.functions else frozenset()
        parameters = sorted(
            {
                name
                for statement in body
                for name in names_read(statement)
                if name not in assigned
                and (
                    name in self._locals  # bound by the translation before it
                    or self.scopes.resolve(name, self.functions) is Resolution.LOCAL
                )
            }
        )
        if any(name in own and name not in self.bound for name in parameters):
            return None
        # TorchDynamo binds the arguments with inspect.signature, which refuses a parameter
        # named as the translation's own locals are (_@gm_...): such a one gets a valid name.
        renamed = {
            name: self.module.fresh_identifier("operand")
            for name in parameters
            if not name.isidentifier()
        }
        for node in (node for statement in body for node in ast.walk(statement)):
            if isinstance(node, ast.Name) and node.id in renamed:
                node.id = renamed[node.id]
        function = make_function(
            self.module.fresh_name("right"),
            [renamed.get(name, name) for name in parameters],
            body,
            [],
        )
        attempt = runtime_call(
            "speculated",
            ast.Constant(self.rewrite),
            self._name(),
            load(function.name),
            tuple_of(load(name) for name in parameters),
        )
        return function, attempt

    def _name(self) -> ast.Constant:
        """The condition's name for what it evaluates ahead of the original's break:
        unique in the process, a module's file and a name."""
        if self._condition_name is None:
            identifier = self.module.fresh_identifier("condition")
            self._condition_name = f"{self.module.filename}:{identifier}"
        return ast.Constant(self._condition_name)

    def _read_first(self, read: ast.Call, on_device: ast.Call) -> ast.expr:
        """``<read> if read_on_host(<rewrite>, <name>, <first>, <bindings>) else
        <on_device>``: ``on_device``, the runtime's device form of ``read`` whose
        arguments are operands bound to locals (``_bound``), read from those locals;
        after the bindings, where the original reads, the next analysis may read as
        written, a break where the original's is (see
        :mod:`graphmend.runtime.ahead_of_reads`).  ``<first>``: whether it is the first
        read the condition translates."""
        first = ast.Constant(self._reads == 0)
        self._reads += 1
        arguments = [*on_device.args, *(keyword.value for keyword in on_device.keywords)]
        bindings = [argument for argument in arguments if isinstance(argument, ast.NamedExpr)]
        reads = [(binding, load(binding.target.id)) for binding in bindings]  # type: ignore[union-attr]
        on_device = replaced(on_device, reads)  # type: ignore[assignment]
        as_written = substituted(read, self._operands)
        for node in ast.walk(as_written):
            setattr(node, _READ_AGAIN, True)
        asked = runtime_call(
            "read_on_host", ast.Constant(self.rewrite), self._name(), first, *bindings
        )
        return ast.IfExp(test=asked, body=as_written, orelse=on_device)

    def _compare(self, node: ast.Compare) -> ast.expr:
        if is_number_search(node):
            negated = isinstance(node.ops[0], ast.NotIn)
            element, container = (
                copy.deepcopy(operand) for operand in (node.left, *node.comparators)
            )
            return runtime_call("contains", element, container, ast.Constant(negated))
        operands = [node.left, *node.comparators]
        host = [self._is_host_read(operand) for operand in operands]
        if len(node.ops) > 1 and not any(host):
            return self._chained(node)
        if not any(host):
            return copy.deepcopy(node)
        if len(node.ops) != 1:
            raise Untranslatable("a chained comparison of values read on the host")
        symbol = _COMPARISON_SYMBOLS.get(type(node.ops[0]))
        if symbol is None:
            raise Untranslatable(f"`{ast.unparse(node)}` compares host values by identity")
        (left, left_read), (right, right_read) = (
            self._compared(operand) if read else self._bound(operand)
            for operand, read in zip(operands, host, strict=True)
        )
        made = runtime_call("compared_on_device", left_read, right_read, *self._flags(operands))
        self._on_device[id(node)] = made
        self._rereadable.add(id(node))
        flags = self._flags(operands)
        return runtime_call("compare", left, ast.Constant(symbol), right, *flags, self._name())

    def _flags(self, operands: Sequence[ast.expr]) -> list[ast.expr]:
        """For each operand of a comparison, whether it is a host read of a tensor
        (``runtime.reads_a_tensor`` of what it reads, bound to a local): an object's own
        ``item()`` (``__float__``...) is read by nothing on the host, and a tensor it
        gives is compared as the original compares it."""
        return [
            runtime_call("reads_a_tensor", copy.deepcopy(self._read_of[id(operand)]))
            if self._is_host_read(operand)
            else ast.Constant(False)
            for operand in operands
        ]

    def _compared(self, call: ast.expr) -> tuple[ast.expr, ast.expr]:
        """The host value of ``call`` as :meth:`_host_value` gives it, bound to a local,
        and a read of that local."""
        name = self._local("compared")
        self._compared_reads.append((call, name))
        return ast.NamedExpr(target=store(name), value=self._host_value(call)), load(name)

    def _chained(self, node: ast.Compare) -> ast.expr:
        """``a < b < c``: ``a`` and ``b`` bound in that order, then ``a < b and b < c``
        (the rest a chain again where it is longer), translated as an ``and`` (a jump on
        the tensor ``a < b``, where plain compile breaks too, would otherwise stand in
        the condition: one graph more than plain where the chain stops there)."""
        left, middle = self._local("operand"), self._local("operand")
        for name, operand in ((left, node.left), (middle, node.comparators[0])):
            # bound as written: an operand is a value (``eps or 0.5``), not a condition
            self.prelude.append(ast.Assign(targets=[store(name)], value=copy.deepcopy(operand)))
        first = ast.Compare(left=load(left), ops=[node.ops[0]], comparators=[load(middle)])
        rest = ast.Compare(  # b < c < d after a < b: a chain again, on the right of the and
            left=load(middle),
            ops=node.ops[1:],
            comparators=[copy.deepcopy(operand) for operand in node.comparators[1:]],
        )
        return self._bool_op(ast.BoolOp(op=ast.And(), values=[first, rest]))

    def _call(self, node: ast.Call) -> ast.expr | None:
        if self._is_host_read(node):
            self._rereadable.add(id(node))
            return self._host_value(node)
        form = on_device_form(node, self.scopes, self.functions)
        if form is None:
            return None
        self._rereadable.add(id(node))
        call = runtime_call(form, *(self._bound(arg)[0] for arg in node.args))
        call.keywords = [
            ast.keyword(arg=keyword.arg, value=self._bound(keyword.value)[0])
            for keyword in node.keywords
        ]
        return self._read_first(node, call)

    def _is_host_read(self, node: ast.AST) -> bool:
        return isinstance(node, ast.Call) and is_host_conversion(node, self.scopes, self.functions)

    def _host_value(self, call: ast.expr) -> ast.expr:
        assert isinstance(call, ast.Call)
        if isinstance(call.func, ast.Attribute):
            value, conversion = call.func.value, "item"
        else:
            value, conversion = call.args[0], call.func.id  # type: ignore[attr-defined]
        bound, self._read_of[id(call)] = self._bound(value)
        arguments = [bound, ast.Constant(conversion), self._name()]
        return self._read_first(call, runtime_call("host_value", *arguments))


def _made_on_device(
    on_device: ast.expr | None, read_of: ast.expr | None, value: ast.expr
) -> ast.expr:
    """Whether a test read again (``Translation.reread``) was made on the device, given
    ``value``, its value: ``on_device`` for a comparison; else where ``value`` is a
    one-element tensor, and, for a host read, so is what it reads (``read_of``: an
    object's own ``item()`` may give a tensor, and is not called again)."""
    if on_device is not None:
        return copy.deepcopy(on_device)
    made = runtime_call("is_scalar_tensor", copy.deepcopy(value))
    if read_of is None:
        return made
    reads_a_tensor = runtime_call("is_scalar_tensor", copy.deepcopy(read_of))
    return ast.BoolOp(op=ast.And(), values=[reads_a_tensor, made])


def _without_not(test: ast.expr) -> ast.expr:
    """``test`` without the ``not`` operators in front of it."""
    while isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        test = test.operand
    return test


def _as_written(
    op: ast.boolop, left: str, left_truth: ast.expr, right: ast.expr, name: ast.Constant
) -> ast.If:
    """``if <left> and jumped_on(<name>, <right>): r = True else: r = False`` (``or``
    alike): the truth of a one-element tensor ``left`` (``left_truth``: see
    ``_truth_as_read``) and of ``right`` read by jumps, as the original reads them, a host
    read in ``right`` made as written before the jump on it (``runtime.jumped_on``).
    Where the right side could not be traced ahead of time, both sides' true (or false)
    jumps then lead to the same statement, as the original's lead to its branch:
    TorchDynamo resumes there after either, with one function (``r = <right>`` for the
    second, then the site's test of ``r``, resumed at the branch, made one graph more
    than plain compile, found by helper hgen3)."""
    values = [
        copy.deepcopy(left_truth),
        runtime_call("jumped_on", copy.deepcopy(name), copy.deepcopy(right)),
    ]
    return ast.If(
        test=ast.BoolOp(op=copy.deepcopy(op), values=values),
        body=[ast.Assign(targets=[store(left)], value=ast.Constant(True))],
        orelse=[ast.Assign(targets=[store(left)], value=ast.Constant(False))],
    )
