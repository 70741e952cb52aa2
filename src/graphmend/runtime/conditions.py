"""Conditions evaluated while tracing: Python parts stay Python, tensor parts become tensors.

Rewritten conditions call these helpers instead of ``not``, ``and``/``or``
between a tensor and a pure expression, comparisons of host values,
``torch.equal``, ``torch.allclose`` and ``in``/``not in``.  Given Python values they behave
exactly like the operators they replace; given single-element tensors they
return boolean tensors whose value is the truth the original would have
computed on the host.
"""

from __future__ import annotations

import operator
import sys
from collections.abc import Callable
from numbers import Number
from typing import Any

import torch

from graphmend.runtime.ahead_of_reads import read_as_written, speculate_or_none
from graphmend.runtime.formatting import symbolic_while_tracing

_COMPARISONS: dict[str, Callable[[Any, Any], Any]] = {
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


#: What ``Tensor.__contains__`` searches a tensor for (anything else raises).
_SEARCHABLE = (torch.Tensor, Number, torch.SymInt, torch.SymFloat, torch.SymBool)


def is_scalar_tensor(value: Any) -> bool:
    """A tensor whose truth Python could take (exactly one element)."""
    return isinstance(value, torch.Tensor) and value.numel() == 1


def without_data(*values: Any) -> bool:
    """Whether one of ``values`` is a meta tensor: it holds no data, so Python cannot take
    its truth (the original raises), and neither may a merge or a guard stand for it."""
    return any(isinstance(value, torch.Tensor) and value.device.type == "meta" for value in values)


def truth(value: torch.Tensor) -> torch.Tensor:
    """``bool(value)`` of a one-element tensor, as a 0-d boolean tensor."""
    return value.reshape(()).bool()


def not_(value: Any) -> Any:
    """``not value``.  A symbolic boolean (a comparison of a number read from a tensor)
    stays symbolic: its truth is read where the original reads it, not here."""
    if is_scalar_tensor(value):
        return torch.logical_not(truth(value))
    if _is_numpy_array(value):  # traced as a tensor by TorchDynamo, as the original's test
        return not_(torch.as_tensor(value))
    if not isinstance(value, torch.Tensor) and symbolic_while_tracing(value):
        # a symbolic number's truth is whether it is not 0 (TorchDynamo has no sym_not of
        # one: that was a graph break the original does not have); TorchDynamo gives a
        # symbolic boolean's type as bool
        return torch.sym_not(value) if isinstance(value, bool) else value == 0
    return not value


def _is_numpy_array(value: Any) -> bool:
    """A NumPy array or scalar (only where NumPy is imported: torch does not need it)."""
    numpy = sys.modules.get("numpy")
    return numpy is not None and isinstance(value, (numpy.ndarray, numpy.generic))


def speculated(
    rewrite: str,
    condition: str,
    function: Callable[..., tuple[Any]],
    arguments: tuple[Any, ...],
) -> tuple[Any] | None:
    """``function(*arguments)``, the right side of an ``and``/``or`` whose left side is a
    one-element tensor, in ``condition`` (its name), ``(value,)``, traced ahead of time
    as an attempt (its failure, or an operation in it that raises when it runs, is
    recorded for ``rewrite`` and taken back:
    :func:`graphmend.runtime.ahead_of_reads.speculate_or_none`); ``None`` where it fails or
    gives a tensor of other than one element: Python evaluates it, and takes its truth,
    only where the left side says so, and so does the original's jump then.  Called
    only while tracing."""
    result = speculate_or_none(rewrite, condition, function, arguments)
    if result is None:
        return None
    (value,) = result
    if isinstance(value, torch.Tensor) and not is_scalar_tensor(value):
        return None
    return result


def logical_and(left: torch.Tensor, right: Any) -> Any:
    """The truth of ``left and right`` for a one-element tensor ``left``."""
    if is_scalar_tensor(right):
        return torch.logical_and(truth(left), truth(right))
    return truth(left) if right else False


def logical_or(left: torch.Tensor, right: Any) -> Any:
    """The truth of ``left or right`` for a one-element tensor ``left``."""
    if is_scalar_tensor(right):
        return torch.logical_or(truth(left), truth(right))
    return True if right else truth(left)


def reads_a_tensor(value: Any) -> bool:
    """Whether a host read (``value.item()``, ``float(value)``) reads a tensor: what an
    object's own ``item()`` or ``__float__`` gives is no value read from a tensor, and a
    tensor it gives is compared as the original compares it (no ``.item()`` of it)."""
    return isinstance(value, torch.Tensor)


def host_value(value: Any, conversion: str, condition: str | None = None) -> Any:
    """``value.item()`` / ``float(value)`` / ``int(value)`` / ``bool(value)``, kept on the device.

    A one-element tensor is kept as it is where the Python number holds its
    value (what reads it brings it to float64 or int64, or takes its truth:
    :func:`compare`, :func:`truth`), so that nothing is computed on the device
    for a comparison that then reads it on the host; it is converted where the
    conversion changes it: ``bool()``, and ``float()`` of an integer (rounded
    beyond 2**53).  Anything else converts as the original did; a tensor read so, on the
    host, in ``condition`` (its name, where the translation noted its reads) is read
    where the original reads first (:func:`read_as_written`).
    """
    if not is_scalar_tensor(value) or value.is_complex():
        return _converted(value, conversion, condition)
    if conversion == "bool":
        return value.reshape(()).bool()
    if value.is_floating_point() and conversion == "int":
        # int() of NaN or inf raises; only the host conversion does that.
        return _converted(value, conversion, condition)
    if conversion == "float" and not value.is_floating_point():
        return value.reshape(()).double()
    return value


def _converted(value: Any, conversion: str, condition: str | None) -> Any:
    if condition is not None and isinstance(value, torch.Tensor):
        read_as_written(condition)
    return _convert(value, conversion)


def _convert(value: Any, conversion: str) -> Any:
    if conversion == "item":
        return value.item()
    return {"float": float, "int": int, "bool": bool}[conversion](value)


def compare(
    left: Any,
    operator_symbol: str,
    right: Any,
    left_host: bool,
    right_host: bool,
    condition: str | None = None,
) -> Any:
    """``left <op> right`` where the sides marked ``*_host`` came from :func:`host_value`
    reading a tensor (:func:`reads_a_tensor`).

    When each side is a host value or a Python number, both are brought to
    float64 if either is floating, else to int64, and compared on the device,
    where each side converts there exactly (:func:`_exactly_as`): Python
    compares an int with a float exactly, float64 only the ints up to 2**53.
    Any other mix is compared as the original did, reading the host values
    back (the original graph break), where ``condition`` (its name, where the
    translation noted its reads) reads where the original reads first
    (:func:`read_as_written`).
    """
    compare_values = _COMPARISONS[operator_symbol]
    if not compared_on_device(left, right, left_host, right_host):
        sides = ((left, left_host), (right, right_host))
        if condition is not None and any(
            host and isinstance(value, torch.Tensor) for value, host in sides
        ):
            read_as_written(condition)
        return compare_values(_on_host(left, left_host), _on_host(right, right_host))
    dtype = _common_dtype(left, right)
    return compare_values(_as(left, dtype), _as(right, dtype))


def compared_on_device(left: Any, right: Any, left_host: bool, right_host: bool) -> bool:
    """Whether :func:`compare` given these compares them on the device (else as the
    original did, on the host)."""
    sides = ((left, left_host), (right, right_host))
    dtype = _common_dtype(left, right)
    return (
        any(is_scalar_tensor(value) for value, _ in sides)
        and all(_is_number(value, host) for value, host in sides)
        and all(_exactly_as(value, dtype) for value, _ in sides)
    )


def _common_dtype(left: Any, right: Any) -> torch.dtype:
    return torch.float64 if _is_floating(left) or _is_floating(right) else torch.int64


def _is_number(value: Any, host: bool) -> bool:
    if isinstance(value, torch.Tensor):
        return host and value.numel() == 1
    return type(value) in (int, float, bool)


#: The ints that int64 holds, and those that float64 holds exactly (every one between).
_EXACT_INTS = {torch.int64: (-(2**63), 2**63 - 1), torch.float64: (-(2**53), 2**53)}


def _exactly_as(value: Any, dtype: torch.dtype) -> bool:
    """Whether every number ``value`` (a host value or a Python number) may hold converts
    to ``dtype`` exactly: a uint64 host value may not to int64, a Python int beyond
    int64 to neither (it raises).  A symbolic int (a size) is taken to be within range:
    comparing it would guard on it.  An int64 host value is taken to convert to float64
    exactly, which it does up to 2**53 (README, Known limits): compared on the host, a
    lowered guard's test (``assert n.max().item() <= 5.0``) would fail the compile."""
    if isinstance(value, torch.Tensor):
        return dtype != torch.int64 or value.dtype != torch.uint64
    if type(value) is not int or symbolic_while_tracing(value):
        return True
    low, high = _EXACT_INTS[dtype]
    return low <= value <= high


def _on_host(value: Any, host: bool) -> Any:
    return value.item() if host and isinstance(value, torch.Tensor) else value


def _is_floating(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.is_floating_point()
    return isinstance(value, float)


def _as(value: Any, dtype: torch.dtype) -> Any:
    if isinstance(value, torch.Tensor):
        return value.reshape(()).to(dtype)
    return float(value) if dtype == torch.float64 else int(value)


def contains(element: Any, container: Any, negated: bool) -> Any:
    """``element in container`` (``not in`` when ``negated``).

    A tensor searched for a number or a tensor gives the 0-d boolean tensor of
    the very ``(element == container).any()`` that ``Tensor.__contains__``
    reads on the host; anything else is tested as the original did.
    """
    if isinstance(container, torch.Tensor) and isinstance(element, _SEARCHABLE):
        found = (element == container).any()
        return torch.logical_not(found) if negated else found
    return element not in container if negated else element in container


def equal(left: Any, right: Any) -> Any:
    """``torch.equal(left, right)``: unequal shapes are unequal, never broadcast."""
    if not (isinstance(left, torch.Tensor) and isinstance(right, torch.Tensor)):
        return torch.equal(left, right)
    if left.shape != right.shape:
        return False  # known from the shapes alone
    if left.device != right.device:
        return torch.equal(left, right)  # raises, as the original does
    return (left == right).all()


def allclose(
    left: Any, right: Any, rtol: Any = 1e-05, atol: Any = 1e-08, equal_nan: Any = False
) -> Any:
    """``torch.allclose``: the very ``isclose(...).all()`` it computes, kept on the device;
    anything it would refuse (tensors of other dtypes or devices, a tolerance that is not
    a number at least 0) is ``torch.allclose``'s, which raises as the original does."""
    if (
        not (isinstance(left, torch.Tensor) and isinstance(right, torch.Tensor))
        or left.dtype != right.dtype
        or left.device != right.device
        or not all(_is_tolerance(tolerance) for tolerance in (rtol, atol))
        or type(equal_nan) is not bool
    ):
        return torch.allclose(left, right, rtol, atol, equal_nan)
    return torch.isclose(left, right, rtol, atol, equal_nan).all()


def _is_tolerance(value: Any) -> bool:
    return type(value) in (int, float) and value >= 0
