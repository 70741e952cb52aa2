"""Hypothesis strategies for small ``nn.Module`` programs that mix the patterns GraphMend
rewrites, and the calls that drive them.

A program is the body of ``M.forward(self, x, t)`` inside a fixed module
(:data:`MODULE`): ``x`` is the caller's float32 tensor of shape ``(n, 4)``, ``t`` a
Python float that changes from call to call, ``self.lin`` an ``nn.Linear(4, 4)`` and
``self.buf`` a registered buffer.  The body is written by :class:`_Writer` from
*patterns*, one function each in :data:`PATTERNS`: a pattern writes one statement and
may nest blocks written from the same patterns (``if`` arms, guards, loop bodies: a
loop may hold a break no rewrite removes, which gives the frame up), so patterns
compose to any depth up to :data:`MAX_DEPTH`.  Every choice is a Hypothesis draw,
listed simplest first, so a failing program shrinks to a short one.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace

import torch
from hypothesis import strategies as st

MODULE = """\
import logging
import warnings

import torch
from torch import nn

logger = logging.getLogger(__name__)


class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("buf", torch.zeros(4))

    def forward(self, x, t):
{body}"""

#: How deep ``if`` statements nest inside one another.
MAX_DEPTH = 3
#: Columns of ``x``; every shape-changing pattern keeps them, so ``self.lin`` applies.
COLUMNS = 4
#: Input values, simplest first: some take each arm, some make a guard fail.
VALUES = (0.0, 1.0, -1.0, 0.5, 2.0, -3.0, 4.0, math.nan)
#: Python values of ``t``.
TIMES = (0.5, 1.5, 2.5, 3.5)

_THRESHOLDS = ("0.0", "1.0", "0.5", "2.0", "-1.0")
_CONDITIONS = (
    "x.sum() > {c}",
    "(x > {c}).any()",
    "x.mean() < {c}",
    "x.norm() > {c}",
    "x.abs().max() < {c}",
    "x.sum() > t",
    "{c} in x",
    "x.sum() is not None and (x == {c}).all()",
)
_EXPRESSIONS = (
    "x * 2",
    "x + 1",
    "torch.tanh(x)",
    "x.abs()",
    "x - x.mean()",
    "-x",
    "x / 2",
    "x * t",
    "x + self.buf",
)
#: Arms that ``torch.where`` cannot merge with a float32 ``(n, 4)`` tensor.
_UNMERGEABLE = ("x.double()", "x[:1]", "torch.cat([x, x])", "x.sum(0, keepdim=True)")
_IN_PLACE = ("x[0] = 0", "x.add_(1)", "x[:, 0] = t")
_STORES = ("self.buf = x", "x = x + self.buf.mean()", "self.buf.add_(1)")
_OUTPUTS = (
    'logger.debug("shape %s", x.shape)',
    'logger.info("n=%d", x.shape[0])',
    "print(tuple(x.shape), x.dtype)",
    'warnings.warn(f"rows={x.shape[0]}")',
    'warnings.warn("checking input")',
    'logger.warning("t=%s", t)',
    'logger.info("batch of shape %s", tuple(x.shape))',
    'print("sum", x.sum())',
    'print(f"t={t}")',
)
_GUARDS = (
    'if (x > {g}).any():\n    raise ValueError(f"bad t={{t}}")',
    'if x.abs().max() > {g}:\n    raise ValueError("invalid input")',
    'assert (x < {g}).all(), f"too large for t={{t}}"',
    "assert x.sum() < {g}",
    'if torch.isnan(x).any():\n    raise ValueError(f"nan in {{tuple(x.shape)}}")',
)
_GUARD_THRESHOLDS = ("3.0", "1.0", "5.0")
#: Breaks no rewrite removes, each breaking inside the loop it is written in, which makes
#: TorchDynamo give the whole frame up: an explicit break (on some values of ``t``), and
#: a number read from a tensor (``int(...item())``) that a Python branch tests.  (Not
#: ``if x.sum().item() > c``: test_properties'
#: ``test_a_kept_branch_on_a_host_read_breaks_at_its_jump``.)
_LOOP_BREAKS = (
    "torch._dynamo.graph_break()",
    "k = int(x.abs().sum().item())\nif k > 2:\n    x = x * 2",
    "if t > 2.0:\n    torch._dynamo.graph_break()",
)
#: Loop headers: a fixed count, and one read from the input's size (a size that turns
#: dynamic is specialized by the loop).
_LOOP_HEADERS = ("for _i in range(2):", "for _i in range(x.shape[0]):")
#: Patterns that open a GraphMend site before a loop that breaks.
_SITES = ("if", "conditional", "output", "guard", "store_in_arm")
#: Kinds of tensor values an assignment or an arm computes.
VALUE_KINDS = ("pure", "linear", "unmergeable")
_RETURNS = ("x", "x + 1", "x.to(torch.int64)", "self.buf", "(x, self.buf)", "{lin}")
#: Arms giving sizes, numbers read from sizes, or slices whose row counts follow the
#: input's (equal for some row counts only), each with a use of what they give.
_SIZED_ARMS = (
    ("s = x.shape", "s = (x * 2).shape", "x = x.reshape(s) * 2"),
    ("k = x.shape[0]", "k = 2", "x = x * k"),
    ("y = x[1:] * 2", "y = x[: x.shape[0] // 2 + 1] * 3", "x = x + y.sum()"),
    ("y = x[:2]", "y = x[1:] * 2", "x = x * y.mean()"),
)


#: How a call's ``x`` is laid out: dense, transposed (dense, not contiguous), with gaps
#: (every other column of a wider tensor), with gaps at an offset (below another row).
LAYOUTS = ("dense", "transposed", "gaps", "gaps at an offset")


@dataclass(frozen=True)
class Call:
    """One call ``forward(x, t)``: the rows of ``x``, the value of ``t``, and how ``x`` is
    laid out (:data:`LAYOUTS`)."""

    rows: tuple[tuple[float, ...], ...]
    t: float
    layout: str = "dense"

    def tensor(self) -> torch.Tensor:
        """A fresh float32 tensor holding :attr:`rows`, laid out as :attr:`layout` says."""
        dense = torch.tensor(self.rows, dtype=torch.float32)
        if self.layout == "transposed":
            return dense.t().contiguous().t()
        if self.layout == "dense":
            return dense
        above = 1 if self.layout == "gaps at an offset" else 0
        wide = torch.zeros(len(self.rows) + above, 2 * COLUMNS)
        wide[above:, ::2] = dense
        return wide[above:, ::2]


@dataclass(frozen=True)
class Program:
    """A generated ``forward`` body and the calls that drive it, with autograd recording
    (``grad``: ``self.lin``'s results require grad) or not (inference)."""

    body: str
    calls: tuple[Call, ...]
    grad: bool = True

    @property
    def source(self) -> str:
        """The whole module's source text."""
        return MODULE.format(body=textwrap.indent(self.body, " " * 8))

    def steady(self) -> Program:
        """The same program, every call with the first call's ``t`` and number of rows:
        graphs are counted on calls that recompile only where the data decide a branch."""
        first = self.calls[0]
        rows = len(first.rows)
        calls = tuple(
            replace(call, rows=tuple((call.rows * rows)[:rows]), t=first.t) for call in self.calls
        )
        return replace(self, calls=calls)

    def resized(self) -> Program:
        """The same program, every call with the first call's ``t`` and the rows drawn:
        graphs are counted on calls that recompile only for a new size (automatic dynamic
        shapes) or where the data decide a branch."""
        first = self.calls[0]
        return replace(self, calls=tuple(replace(call, t=first.t) for call in self.calls))

    def describe(self) -> str:
        """The forward body and the calls, as a failure message shows them."""
        calls = "\n".join(
            f"  forward(x=torch.tensor({c.rows!r}) ({c.layout}), t={c.t!r})".replace(
                "nan", 'float("nan")'
            )
            for c in self.calls
        )
        body = textwrap.indent(self.body, "    ")
        return f"def forward(self, x, t):\n{body}calls (grad={self.grad}):\n{calls}"


class _Writer:
    """Writes one ``forward`` body from the allowed patterns, drawing every choice."""

    def __init__(
        self,
        draw: st.DrawFn,
        patterns: Collection[str],
        arm_patterns: Collection[str],
        values: Collection[str],
        returns: bool,
    ) -> None:
        self.draw = draw
        self.patterns = [name for name in PATTERNS if name in patterns]
        self.arm_patterns = [name for name in PATTERNS if name in arm_patterns]
        self.values = [kind for kind in VALUE_KINDS if kind in values]
        self.returns = returns
        self.dtype_may_change = False  # after ``x.double()``, ``self.lin`` reads ``x.float()``
        self.uses_mask = False

    def pick(self, choices: Collection[str]) -> str:
        return self.draw(st.sampled_from(tuple(choices)))

    def condition(self) -> str:
        return self.pick(_CONDITIONS).format(c=self.pick(_THRESHOLDS))

    def linear(self) -> str:
        return "self.lin(x.float())" if self.dtype_may_change else "self.lin(x)"

    def value(self) -> str:
        """A tensor expression of ``x``: pure, a submodule call or an unmergeable one."""
        kind = self.pick(self.values)
        if kind == "linear":
            return self.linear()
        if kind == "unmergeable":
            expression = self.pick(_UNMERGEABLE)
            self.dtype_may_change |= expression == "x.double()"
            return expression
        return self.pick(_EXPRESSIONS)

    def block(self, depth: int, *, top: bool = False, returns: bool = True) -> list[str]:
        """Statements for a function body (``top``) or an arm; an arm may end in ``return``
        (unless not ``returns``: one that code follows)."""
        count = self.draw(st.integers(1, 4 if top else 2))
        lines: list[str] = []
        for _ in range(count):
            if self.returns and returns and not top and self.draw(st.integers(0, 5)) == 5:
                lines.append(f"return {self.returned()}")
                return lines
            pattern = PATTERNS[self.pick(self.patterns if top else self.arm_patterns)]
            lines.extend(pattern(self, depth))
        return lines

    def returned(self) -> str:
        return self.pick(_RETURNS).format(lin=self.linear())

    def body(self) -> str:
        lines = self.block(0, top=True)
        lines.append(f"return {self.returned()}")
        if self.uses_mask:
            lines.insert(0, "m = None")
        return "".join(line + "\n" for line in lines)


def _indented(lines: list[str]) -> list[str]:
    return ["    " + line for line in lines]


def _if(writer: _Writer, depth: int) -> list[str]:
    """A tensor-valued ``if``/``elif``/``else``; arms are blocks of any pattern, nested."""
    if depth >= MAX_DEPTH:
        return [f"x = {writer.value()}"]
    lines = [f"if {writer.condition()}:", *_indented(writer.block(depth + 1))]
    for _ in range(writer.draw(st.integers(0, 1))):
        lines += [f"elif {writer.condition()}:", *_indented(writer.block(depth + 1))]
    if writer.draw(st.booleans()):
        lines += ["else:", *_indented(writer.block(depth + 1))]
    return lines


def _assign(writer: _Writer, depth: int) -> list[str]:
    """``x = <value>``: mergeable with another arm's, a submodule call, or not mergeable."""
    return [f"x = {writer.value()}"]


def _conditional(writer: _Writer, depth: int) -> list[str]:
    """``x = a if <tensor condition> else b``."""
    return [f"x = {writer.value()} if {writer.condition()} else {writer.value()}"]


def _sized(writer: _Writer, depth: int) -> list[str]:
    """A tensor ``if`` whose arms give sizes or values sized after the input
    (:data:`_SIZED_ARMS`), then a use of them: deciding whether such arms merge must not
    guard on a symbolic size."""
    then, other, use = writer.draw(st.sampled_from(_SIZED_ARMS))
    if writer.draw(st.booleans()):
        then, other = other, then
    return [f"if {writer.condition()}:", f"    {then}", "else:", f"    {other}", use]


def _mask(writer: _Writer, depth: int) -> list[str]:
    """A mask that is ``None`` or a tensor (set in an arm), and a use of it."""
    writer.uses_mask = True
    if writer.draw(st.booleans()):
        return [writer.pick(("m = x > 0", "m = None"))]
    return ["if m is not None:", "    x = x * m.float().mean()"]


def _in_place(writer: _Writer, depth: int) -> list[str]:
    """An in-place update of ``x`` (the caller's tensor until ``x`` is rebound)."""
    return [writer.pick(_IN_PLACE)]


def _store(writer: _Writer, depth: int) -> list[str]:
    """An attribute store to, or in-place update of, the registered buffer."""
    return [writer.pick(_STORES)]


def _store_in_arm(writer: _Writer, depth: int) -> list[str]:
    """A tensor ``if`` whose one arm stores (in place, or to the buffer) and whose other
    arm, if any, rebinds ``x``: the store may reach the caller only when taken."""
    store = writer.pick(_IN_PLACE + _STORES)
    other = writer.pick(("none", "else", "then"))
    if other == "none":
        return [f"if {writer.condition()}:", f"    {store}"]
    arms = [store, f"x = {writer.pick(_EXPRESSIONS)}"]
    if other == "then":
        arms.reverse()
    return [f"if {writer.condition()}:", f"    {arms[0]}", "else:", f"    {arms[1]}"]


def _output(writer: _Writer, depth: int) -> list[str]:
    """print / logging / warnings.warn with trace-time-known or tensor arguments."""
    return [writer.pick(_OUTPUTS)]


def _guard(writer: _Writer, depth: int) -> list[str]:
    """A tensor guard: ``if <check>: raise`` or ``assert``, messages with changing ``t``."""
    guard = writer.pick(_GUARDS).format(g=writer.pick(_GUARD_THRESHOLDS))
    return guard.splitlines()


def _output_then_guard(writer: _Writer, depth: int) -> list[str]:
    """Output right before a guard that may fail."""
    return _output(writer, depth) + _guard(writer, depth)


def _loop(writer: _Writer, depth: int) -> list[str]:
    """``for _i in range(2):`` around a block of any pattern (TorchDynamo unrolls it; a
    break inside it gives the whole frame up), which a tensor ``if`` may first leave
    (``break``) or skip (``continue``)."""
    if depth >= MAX_DEPTH:
        return [f"x = {writer.value()}"]
    lines = writer.block(depth + 1)
    leave = writer.pick(("", "break", "continue"))
    if leave:
        lines = [f"if {writer.condition()}:", f"    {leave}", *lines]
    return [_loop_header(writer, depth), *_indented(lines)]


def _loop_header(writer: _Writer, depth: int) -> str:
    """A loop's header; one counting the input's rows only outside other blocks (nested,
    it would multiply the rows a ``torch.cat`` inside doubles)."""
    return writer.pick(_LOOP_HEADERS if depth == 0 else _LOOP_HEADERS[:1])


def _break_in_loop(writer: _Writer, depth: int) -> list[str]:
    """A loop holding a break no rewrite removes (:data:`_LOOP_BREAKS`), before or after a
    block of any pattern, or alone."""
    broken = writer.pick(_LOOP_BREAKS).format(c=writer.pick(_THRESHOLDS)).splitlines()
    where = writer.pick(("alone", "after", "before"))
    alone = where == "alone" or depth >= MAX_DEPTH
    block = [] if alone else writer.block(depth + 1, returns=where == "before")
    lines = block + broken if where == "after" else broken + block
    return [_loop_header(writer, depth), *_indented(lines)]


def _site_then_break_in_loop(writer: _Writer, depth: int) -> list[str]:
    """A site GraphMend rewrites (:data:`_SITES`), then a loop that breaks: plain compile
    breaks at the site first and compiles what precedes it."""
    return PATTERNS[writer.pick(_SITES)](writer, depth) + _break_in_loop(writer, depth)


def _paired(writer: _Writer, depth: int) -> list[str]:
    """A view pairing rows, which fails for an odd number of rows, eagerly and while
    tracing (a failed trace after a site)."""
    return [f"x = x.reshape(-1, {2 * COLUMNS}).reshape(-1, {COLUMNS})"]


Pattern = Callable[[_Writer, int], list[str]]

#: Every pattern by name, simplest first (a failing program shrinks towards the first).
PATTERNS: dict[str, Pattern] = {
    "assign": _assign,
    "if": _if,
    "conditional": _conditional,
    "mask": _mask,
    "sized": _sized,
    "in_place": _in_place,
    "store": _store,
    "store_in_arm": _store_in_arm,
    "output": _output,
    "guard": _guard,
    "output_then_guard": _output_then_guard,
    "loop": _loop,
    "break_in_loop": _break_in_loop,
    "site_then_break_in_loop": _site_then_break_in_loop,
    "paired": _paired,
}


@st.composite
def bodies(
    draw: st.DrawFn,
    patterns: Collection[str] = tuple(PATTERNS),
    values: Collection[str] = VALUE_KINDS,
    returns: bool = True,
    arm_patterns: Collection[str] | None = None,
) -> str:
    """The body of ``forward`` written from ``patterns`` (names in :data:`PATTERNS`),
    ``if`` arms from ``arm_patterns`` (default: ``patterns``), assigning ``values``
    (kinds in :data:`VALUE_KINDS`), with early ``return`` in arms when ``returns``."""
    arm_patterns = patterns if arm_patterns is None else arm_patterns
    unknown = (set(patterns) | set(arm_patterns)) - set(PATTERNS)
    unknown |= set(values) - set(VALUE_KINDS)
    if unknown:
        raise ValueError(f"unknown patterns or values {sorted(unknown)}")
    return _Writer(draw, patterns, arm_patterns, values, returns).body()


@st.composite
def calls(draw: st.DrawFn) -> tuple[Call, ...]:
    """Two or three calls, each with a different ``t``; row counts vary (1 to 3); ``x``
    laid out one way for all of them."""
    times = draw(st.lists(st.sampled_from(TIMES), min_size=2, max_size=3, unique=True))
    layout = draw(st.sampled_from(LAYOUTS))
    result = []
    for t in times:
        count = draw(st.integers(1, 3))
        values = st.lists(st.sampled_from(VALUES), min_size=COLUMNS, max_size=COLUMNS)
        rows = draw(st.lists(values, min_size=count, max_size=count))
        result.append(Call(tuple(tuple(row) for row in rows), t, layout))
    return tuple(result)


def programs(
    patterns: Collection[str] = tuple(PATTERNS),
    values: Collection[str] = VALUE_KINDS,
    returns: bool = True,
    arm_patterns: Collection[str] | None = None,
    grad: bool | None = None,
) -> st.SearchStrategy[Program]:
    """Programs written from ``patterns`` (see :func:`bodies`), with the calls that drive
    them, with or without autograd (``grad``; ``None``: either)."""
    return st.builds(
        Program,
        bodies(patterns, values, returns, arm_patterns),
        calls(),
        st.booleans() if grad is None else st.just(grad),
    )
