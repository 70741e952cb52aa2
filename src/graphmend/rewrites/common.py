"""What every rewrite shares: the module context, injected names, the dual-path site.

Injected names start with ``_@gm_``: no Python source can spell them, so they
never collide with user names (pytest's assertion rewriting uses the same trick),
and the leading underscore keeps the module-level ones out of ``from m import *``;
TorchDynamo traces them like any other global or local.
"""

from __future__ import annotations

import ast
import copy
import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from graphmend.analysis.bindings import bound_before, names_read
from graphmend.analysis.callees import Callees
from graphmend.analysis.purity import may_hold_tensor_data, qualified_name, tensor_valued_names
from graphmend.analysis.scopes import ModuleScopes, Resolution
from graphmend.analysis.walking import walk
from graphmend.findings import Decision, Finding, site_source
from graphmend.generated import PREFIX

RUNTIME = f"{PREFIX}rt"  # the module global holding graphmend.runtime
TRACING = f"{PREFIX}tracing"  # the module global holding runtime.tracing

#: Builtins that read the frame's locals, or list their names (injected ones included).
FRAME_INTROSPECTION = frozenset({"locals", "vars", "exec", "eval", "dir"})
_GENERATED = "_graphmend_generated"
_NEVER_TRACED = frozenset({"__init__", "__init_subclass__"})
_LEFT_ALONE = "_graphmend_left_alone"
_CONTINUABLE = "_graphmend_continuable"


#: Why a site whose code nests deeper than the analysis can follow is left as it is (a
#: long ``a + b + ...`` chain: Python compiles thousands of terms, the analysis recurses).
TOO_DEEP = "its code nests too deeply to be analysed (RecursionError)"


class Decline(Exception):
    """A site that cannot be rewritten exactly; the message says why, in a model author's words."""


def mark_generated(node: ast.AST) -> ast.AST:
    """Flag a node built by a rewrite, so that later rewrites leave it alone."""
    setattr(node, _GENERATED, True)
    return node


def is_generated(node: ast.AST) -> bool:
    """Whether ``node`` was made by a rewrite (and so is not a candidate site)."""
    return getattr(node, _GENERATED, False)


def is_left_alone(node: ast.AST) -> bool:
    """Whether a directive flagged ``node`` (:func:`leave_alone`)."""
    return getattr(node, _LEFT_ALONE, False)


def never_traced(method: str) -> bool:
    """Whether a method of this name only builds an object (``__init__``,
    ``__init_subclass__``): models are built before ``torch.compile`` traces them."""
    return method in _NEVER_TRACED


def mark_continuable(fallback: ast.If, condition: str) -> ast.If:
    """Flag the ``if`` a predicated site falls back to while tracing (its test the name
    ``condition``): continuation predication may try ``torch.cond`` before it."""
    setattr(fallback, _CONTINUABLE, condition)
    return fallback


def continuable_condition(node: ast.AST) -> str | None:
    """The condition's name, if ``node`` is a fallback :func:`mark_continuable` flagged."""
    return getattr(node, _CONTINUABLE, None)


def leave_alone(node: ast.FunctionDef | ast.ClassDef) -> None:
    """Flag a definition that no rewrite may enter (a directive asks so)."""
    setattr(node, _LEFT_ALONE, True)


def locate(node: ast.AST, like: ast.AST) -> ast.AST:
    """Give every new node in ``node`` the source location of ``like``.

    Nodes copied from the original source keep their own locations, so
    tracebacks and TorchDynamo's messages point at the user's line.  A new
    expression lies on the first line of ``like`` only: Python 3.10 places a method
    call, and 3.12+ an attribute load, on its node's last line, so ``_@gm_rt.branch``
    located at a multi-line ``if`` would sit on the ``if``'s last line (a fallback
    recorded there is not the site's), and the line table TorchDynamo writes for a
    resumed frame counts such a line change twice (its breaks were reported lines
    below the user's).
    """
    for child in walk(node):
        if "lineno" in child._attributes and not hasattr(child, "lineno"):
            ast.copy_location(child, like)
            if isinstance(child, ast.expr) and child.end_lineno not in (None, child.lineno):
                child.end_lineno, child.end_col_offset = child.lineno, child.col_offset
    return node


def named_by_content(function: ast.FunctionDef) -> str:
    """Give a generated module-level function a name that says what it does: its name,
    ``@`` and a digest of its code and source lines; returns the name.

    Code of an earlier version of the module calls it by name after
    ``importlib.reload`` (a method of an instance made before the reload): a name
    numbered in order alone would call the new version's function of that number,
    another site's (its output, or a failure to unpack its arguments).
    """
    dumped = ast.dump(function, include_attributes=True)
    function.name = f"{function.name}@{hashlib.sha256(dumped.encode()).hexdigest()[:16]}"
    return function.name


def substituted(node: ast.AST, reads: Sequence[tuple[ast.AST, str]]) -> ast.AST:
    """A copy of ``node`` in which each of its parts in ``reads`` (found by identity) is
    a read of the name paired with it."""
    return replaced(node, [(part, load(name)) for part, name in reads])


def replaced(node: ast.AST, replacements: Sequence[tuple[ast.AST, ast.AST]]) -> ast.AST:
    """A copy of ``node`` in which each of its parts in ``replacements`` (found by
    identity) is the node paired with it (the first pairing of a part counts)."""
    # deepcopy's memo maps an object's id to its copy (the parts, held by
    # ``replacements``, keep their ids while it runs)
    memo: dict[int, ast.AST] = {}
    for part, replacement in replacements:
        memo.setdefault(id(part), replacement)
    return copy.deepcopy(node, memo)


def literal_format_spec(spec: ast.expr | None) -> str:
    """The text of an f-string field's format spec; Decline when it is computed at run time."""
    if spec is None:
        return ""
    assert isinstance(spec, ast.JoinedStr)
    if not all(isinstance(part, ast.Constant) for part in spec.values):
        raise Decline("a format spec computed at run time cannot be applied later")
    return "".join(part.value for part in spec.values)  # type: ignore[attr-defined]


def load(name: str) -> ast.Name:
    """A name read."""
    return ast.Name(id=name, ctx=ast.Load())


def store(name: str) -> ast.Name:
    """A name assigned."""
    return ast.Name(id=name, ctx=ast.Store())


def tuple_of(elements: Iterable[ast.expr]) -> ast.Tuple:
    """A tuple display of ``elements``, read."""
    return ast.Tuple(elts=list(elements), ctx=ast.Load())


def runtime_call(helper: str, *args: ast.expr) -> ast.Call:
    """``_@gm_rt.<helper>(*args)``."""
    func = ast.Attribute(value=load(RUNTIME), attr=helper, ctx=ast.Load())
    return ast.Call(func=func, args=list(args), keywords=[])


def make_function(
    name: str,
    parameters: list[str],
    body: list[ast.stmt],
    decorators: list[ast.expr],
    vararg: str | None = None,
) -> ast.FunctionDef:
    """A generated module-level ``def`` with positional parameters (and ``*vararg``)."""
    arguments = ast.arguments(
        posonlyargs=[],
        args=[ast.arg(arg=parameter) for parameter in parameters],
        vararg=ast.arg(arg=vararg) if vararg is not None else None,
        kwonlyargs=[],
        kw_defaults=[],
        defaults=[],
    )
    function = ast.FunctionDef(
        name=name, args=arguments, body=body, decorator_list=decorators, returns=None
    )
    if "type_params" in ast.FunctionDef._fields:  # Python 3.12+
        function.type_params = []
    return mark_generated(function)  # type: ignore[return-value]


def dual_path(site: ast.stmt, tracing_body: list[ast.stmt], search: str | None = None) -> ast.If:
    """``if tracing(): <tracing_body> else: <site>`` located at ``site``.

    The original statement stays the eager path, untouched; TorchDynamo folds
    the test to a constant, so only one branch is ever traced.  Where the tracing body
    reads ``search``, the name of a search site's token, the test also binds it
    (``tracing() and (search := search_site()) is not None``, see
    :mod:`graphmend.runtime.searches`): a site marked to run as written takes ``site``.
    """
    test: ast.expr = ast.Call(func=load(TRACING), args=[], keywords=[])
    if search is not None and any(search in names_read(s) for s in tracing_body):
        token = ast.NamedExpr(target=store(search), value=runtime_call("search_site"))
        unmarked = ast.Compare(left=token, ops=[ast.IsNot()], comparators=[ast.Constant(None)])
        test = ast.BoolOp(op=ast.And(), values=[test, unmarked])
    node = ast.If(test=test, body=tracing_body, orelse=[site])
    for statement in tracing_body:
        locate(statement, site)
    return mark_generated(locate(node, site))  # type: ignore[return-value]


def is_tracing_test(test: ast.expr) -> bool:
    """Whether ``test`` is the test :func:`dual_path` writes."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        test = test.values[0]
    return (
        isinstance(test, ast.Call)
        and isinstance(test.func, ast.Name)
        and test.func.id == TRACING
        and not test.args
    )


@dataclass
class ModuleContext:
    """One module being rewritten: its facts, its findings, what it must inject."""

    filename: str
    text: str  # the source, newlines translated
    lines: list[str]
    scopes: ModuleScopes
    findings: list[Finding] = field(default_factory=list)
    module_level: list[ast.stmt] = field(default_factory=list)
    _counter: int = 0
    _tensor_names: dict[ast.AST, frozenset[str]] = field(default_factory=dict)
    _text_lines: list[str] = field(default_factory=list)
    _callees: Callees | None = None

    @property
    def callees(self) -> Callees:
        """The module's functions that its calls run (computed once)."""
        if self._callees is None:
            self._callees = Callees(self.scopes)
        return self._callees

    def tensor_names(self, function: ast.AST, functions: tuple[ast.AST, ...]) -> frozenset[str]:
        """Locals of ``function`` computed from tensor operations (computed once)."""
        if function not in self._tensor_names:
            self._tensor_names[function] = tensor_valued_names(function, self.scopes, functions)
        return self._tensor_names[function]

    def fresh_name(self, role: str) -> str:
        """A new injected name, unique in this module (not valid in source)."""
        self._counter += 1
        return f"{PREFIX}{role}{self._counter}"

    def fresh_names(self, *roles: str) -> dict[str, str]:
        """New injected names for the parts of one site, numbered alike (``_@gm_then3``...)."""
        self._counter += 1
        return {role: f"{PREFIX}{role}{self._counter}" for role in roles}

    def fresh_identifier(self, role: str) -> str:
        """A new valid identifier that no name of the module's source uses.

        For generated function parameters: TorchDynamo binds arguments with
        ``inspect.signature``, which accepts only identifiers.
        """
        while True:
            self._counter += 1
            name = f"gm_{role}{self._counter}_"
            if name not in self.text:  # a name the source uses is in its text
                return name

    def mentions(self, node: ast.AST, words: Iterable[str]) -> bool:
        """Whether the source lines of ``node`` hold one of ``words`` (as any text).

        A cheap syntactic pre-scan: a statement or function whose lines hold
        no ``if`` has no ``if`` statement nor conditional expression in it.
        """
        if not self._text_lines:
            self._text_lines = self.text.split("\n")  # numbered as the parser numbers them
        start, end = node.lineno - 1, node.end_lineno  # type: ignore[attr-defined]
        segment = "\n".join(self._text_lines[start:end])
        return any(word in segment for word in words)

    @property
    def changed(self) -> bool:
        return any(finding.rewritten for finding in self.findings)

    def record(
        self, rewrite: str, node: ast.AST, qualname: str, decision: Decision, reason: str
    ) -> None:
        """Record what ``rewrite`` decided at the site at ``node`` (shown by ``explain``)."""
        self.findings.append(
            Finding(
                rewrite=rewrite,
                filename=self.filename,
                lineno=node.lineno,  # type: ignore[attr-defined]
                col=node.col_offset,  # type: ignore[attr-defined]
                function=qualname,
                decision=decision,
                reason=reason,
                source=site_source(self.lines, node),
            )
        )


@dataclass(frozen=True)
class Enclosing:
    """Where a statement sits: its chain of enclosing functions, its qualified name and
    the innermost class around it (whose name private names are mangled with)."""

    functions: tuple[ast.AST, ...]
    qualname: str
    class_name: str | None = None


def mangled(name: str, class_name: str | None) -> str:
    """``name`` as Python compiles it inside class ``class_name``: a private name
    (``__cache``, not ``__dunder__``) becomes ``_Class__cache``.  A generated string
    naming an attribute (``attribute(self, "...")``) must hold the mangled name."""
    if class_name is None or not name.startswith("__") or name.endswith("__"):
        return name
    stripped = class_name.lstrip("_")
    return f"_{stripped}{name}" if stripped else name


class FunctionStatementRewriter:
    """Base for rewrites of statements inside function bodies.

    Subclasses implement :meth:`rewrite_statement`, which returns the statement
    unchanged or its replacement, and call :meth:`record` once per candidate
    site.  A statement is offered before the blocks it holds (an ``if`` before
    its branches); code a rewrite generated is not visited again.
    Module-level and class-level statements are left alone (TorchDynamo traces
    functions), and so are coroutines, which it does not trace, and definitions
    flagged by :func:`leave_alone`.
    """

    name: ClassVar[str]
    #: Keywords the source of every candidate site holds (``if``, ``assert``): a
    #: function or class whose lines hold none is passed over unread.  Empty
    #: when a site has no keyword of its own (a call).
    keywords: ClassVar[tuple[str, ...]] = ()

    def __init__(self, module: ModuleContext) -> None:
        self.module = module
        self._scopes: list[tuple[str, ast.AST | None]] = []
        self._catching = 0
        self._with_blocks = 0

    def run(self, tree: ast.Module) -> None:
        """Rewrite every function of the module in place, recording a finding per site."""
        tree.body = self._rewrite_block(tree.body, in_function=False)

    @property
    def enclosing(self) -> Enclosing:
        """The functions around the statement being rewritten, and its qualified name."""
        parts: list[str] = []
        for index, (name, function) in enumerate(self._scopes):
            parts.append(name)
            if function is not None and index < len(self._scopes) - 1:
                parts.append("<locals>")
        functions = tuple(function for _, function in self._scopes if function is not None)
        classes = [name for name, function in self._scopes if function is None]
        return Enclosing(functions, ".".join(parts), classes[-1] if classes else None)

    def local_reads(self, nodes: Iterable[ast.AST]) -> set[str]:
        """Names read in ``nodes`` that are locals of the enclosing functions."""
        functions = self.enclosing.functions
        return {
            name
            for node in nodes
            for name in names_read(node)
            if self.module.scopes.resolve(name, functions) is Resolution.LOCAL
        }

    def bound_at(self, statement: ast.stmt) -> frozenset[str]:
        """Names certainly bound when ``statement`` of the current function starts."""
        function = self.enclosing.functions[-1]
        assert isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef)
        try:
            return bound_before(function, statement)
        except ValueError:
            return frozenset()  # the statement was moved by an earlier rewrite

    def may_hold_tensor_data(self, condition: ast.expr) -> bool:
        """Whether a condition here may need tensor data (a candidate site)."""
        functions = self.enclosing.functions
        names = self.module.tensor_names(functions[-1], functions) if functions else frozenset()
        return may_hold_tensor_data(condition, self.module.scopes, functions, names)

    def record(self, node: ast.AST, decision: Decision, reason: str) -> None:
        """Record the decision on the site at ``node`` (shown by ``explain``)."""
        self.module.record(self.name, node, self.enclosing.qualname, decision, reason)

    def rewrite_statement(self, statement: ast.stmt) -> ast.stmt | list[ast.stmt]:
        """The replacement of one statement of a function (itself when not a site).

        Every rewrite overrides this.  It is called before the statement's own
        blocks are visited (outer sites first); generated statements it returns
        are not offered again, statements it moves out of the site are.
        """
        raise NotImplementedError

    def rewrite_tail(self, statement: ast.stmt, tail: list[ast.stmt]) -> list[ast.stmt] | None:
        """Rewrite ``statement`` together with the rest of its block, or ``None``."""
        return None

    def _rewrite_block(self, block: list[ast.stmt], in_function: bool) -> list[ast.stmt]:
        rewritten: list[ast.stmt] = []
        for index, statement in enumerate(block):
            if in_function and not is_generated(statement):
                merged = self.rewrite_tail(statement, block[index + 1 :])
                if merged is not None:
                    rewritten.extend(merged)
                    break
            if is_left_alone(statement) or self._without_sites(statement):
                rewritten.append(statement)
            elif isinstance(statement, ast.FunctionDef | ast.ClassDef):
                function = statement if isinstance(statement, ast.FunctionDef) else None
                traced = function is not None and not self._never_traced(function)
                self._scopes.append((statement.name, function))
                # a new frame (the functions nested in one never traced are still rewritten)
                outer = self._catching, self._with_blocks
                self._catching, self._with_blocks = 0, 0
                statement.body = self._rewrite_block(statement.body, traced)
                self._catching, self._with_blocks = outer
                self._scopes.pop()
                rewritten.append(statement)
            elif isinstance(statement, ast.AsyncFunctionDef) or is_generated(statement):
                rewritten.append(statement)
            elif not in_function:
                self._rewrite_nested_blocks(statement, in_function)
                rewritten.append(statement)
            else:
                rewritten.extend(self._rewrite_in_function(statement))
        return rewritten

    def _without_sites(self, statement: ast.stmt) -> bool:
        """A definition whose source holds none of :attr:`keywords` (so no site)."""
        return (
            bool(self.keywords)
            and isinstance(statement, ast.FunctionDef | ast.ClassDef)
            and not self.module.mentions(statement, self.keywords)
        )

    def _never_traced(self, function: ast.FunctionDef) -> bool:
        """A method that builds an object (``__init__``, ``__init_subclass__``): models are
        built before ``torch.compile`` traces them, so nothing there is a candidate site."""
        in_class = bool(self._scopes) and self._scopes[-1][1] is None
        return in_class and never_traced(function.name)

    def _rewrite_in_function(self, statement: ast.stmt) -> list[ast.stmt]:
        """Rewrite a statement, then what it holds (outer sites first)."""
        try:
            result = self.rewrite_statement(statement)
        except RecursionError:
            self.record(statement, Decision.DECLINED, TOO_DEEP)
            return [statement]
        results = result if isinstance(result, list) else [result]
        rewritten: list[ast.stmt] = []
        for node in results:
            if node is statement:
                self._rewrite_nested_blocks(node, in_function=True)
                rewritten.append(node)
            elif is_generated(node):
                rewritten.append(node)
            else:  # a statement moved out of the site (an `else:` after a guard)
                rewritten.extend(self._rewrite_block([node], in_function=True))
        return rewritten

    def _rewrite_nested_blocks(self, statement: ast.stmt, in_function: bool) -> None:
        for field_name in ("body", "orelse", "finalbody"):
            block = getattr(statement, field_name, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                catching = field_name == "body" and self._catches(statement)
                within = field_name == "body" and isinstance(statement, ast.With | ast.AsyncWith)
                self._catching += catching
                self._with_blocks += within
                try:
                    setattr(statement, field_name, self._rewrite_block(block, in_function))
                finally:
                    self._catching -= catching
                    self._with_blocks -= within
        for holder in [*getattr(statement, "handlers", []), *getattr(statement, "cases", [])]:
            holder.body = self._rewrite_block(holder.body, in_function)

    @property
    def may_catch(self) -> bool:
        """Whether the statement being rewritten sits where this function may catch what it
        raises (a ``try`` body, or a ``with`` whose manager could swallow exceptions)."""
        return self._catching > 0

    @property
    def in_with_block(self) -> bool:
        """Whether the statement being rewritten sits in a ``with`` block of this function
        (any manager: an exception raised from inside the graph skips the exit that the
        graph itself makes, and ``torch.no_grad()`` would stay in force)."""
        return self._with_blocks > 0

    def _catches(self, statement: ast.stmt) -> bool:
        if isinstance(statement, ast.Try) or type(statement).__name__ == "TryStar":
            return True
        if not isinstance(statement, ast.With | ast.AsyncWith):
            return False
        functions = self.enclosing.functions
        return not all(
            isinstance(item.context_expr, ast.Call)
            and (
                qualified_name(item.context_expr.func, self.module.scopes, functions) or ""
            ).startswith("torch.")
            for item in statement.items
        )
