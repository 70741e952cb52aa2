"""Which calls are pure, and which expressions may hold tensor data.

The tables list the torch functions, tensor methods and builtins that return
a new value and change nothing (no in-place update, no random numbers); the
speculation checker builds on them.  Calls are recognised by what the source
proves they are (``torch.isnan`` through an ``import torch``) or, for methods,
by name, since the receiver's type is known only at trace time.  The rest of
the module decides which conditions are candidate sites: those that may need
tensor data rather than metadata known at trace time.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence

from graphmend.analysis.bindings import stored_names
from graphmend.analysis.scopes import BindingKind, ModuleScopes, Resolution
from graphmend.analysis.walking import walk

#: Tensor methods that read their receiver and return a new value.
PURE_TENSOR_METHODS = frozenset(
    """
    abs absolute all allclose amax amin any argmax argmin bfloat16 bool byte ceil char clamp
    clip clone contiguous cos count_nonzero cpu cumsum detach dim div double element_size eq
    equal exp expand expand_as flatten float floor ge gt half int is_complex is_contiguous
    is_floating_point isclose isfinite isinf isnan isneginf isposinf item le log logical_and
    logical_not logical_or logical_xor long lt masked_fill matmul max mean min mul ne neg
    new_full new_ones new_zeros norm numel permute pow prod reshape reshape_as round rsqrt short
    sigmoid sign sin size softmax sqrt squeeze std sub sum t tanh to transpose trunc type_as
    unsqueeze var view view_as tile repeat narrow roll flip movedim swapaxes unflatten
    clamp_min clamp_max log1p expm1 square reciprocal add argsort sort topk cumprod exp2
    """.split()
)

#: Functions of the ``torch`` module that return a new value and change nothing.
PURE_TORCH_FUNCTIONS = frozenset(
    "torch." + name
    for name in """
    abs all allclose amax amin any arange argmax argmin bmm cat clamp clip count_nonzero cumsum
    einsum eq equal exp finfo flatten full full_like ge gt iinfo is_complex is_floating_point
    is_tensor isclose isfinite isinf isnan isneginf isposinf le log log_softmax logical_and
    logical_not logical_or logical_xor lt masked_fill matmul max maximum mean min minimum mm ne
    norm numel ones ones_like permute pow prod reshape round rsqrt sigmoid sign softmax sqrt
    squeeze stack sum tanh tensor transpose tril triu trunc unsqueeze where zeros zeros_like
    """.split()
) | frozenset(
    "torch.nn.functional." + name
    for name in """
    elu gelu layer_norm leaky_relu linear log_softmax logsigmoid mish normalize pad relu relu6
    rms_norm sigmoid silu softmax softplus tanh
    """.split()
)

#: Builtins that return a value and change nothing.
PURE_BUILTINS = frozenset(
    """
    abs bool callable float getattr hasattr int isinstance issubclass len list max min range
    repr round str tuple type
    """.split()
)

#: Calls that read a tensor's value on the host, and the builtin conversions among them.
HOST_CONVERSION_METHODS = frozenset({"item"})
HOST_CONVERSION_BUILTINS = frozenset({"float", "int", "bool"})
_HOST_CONVERSION_NAMES = frozenset(f"builtins.{name}" for name in HOST_CONVERSION_BUILTINS)

#: Calls whose result is metadata known at trace time, never tensor data.
_METADATA_METHODS = frozenset(
    {"size", "dim", "numel", "is_floating_point", "element_size", "is_contiguous"}
)
_METADATA_ATTRIBUTES = frozenset({"shape", "dtype", "device", "ndim", "is_cuda", "requires_grad"})
#: Methods of strings and sequences, which no tensor has: ``key.startswith("text_")``.
_PYTHON_VALUED_METHODS = frozenset({"startswith", "endswith", "count"})
#: Modules whose functions compute a Python value from their arguments, so that they read
#: tensor data only where an argument does (``math.prod(x.shape)``, ``re.match(p, name)``).
_READ_THROUGH_MODULES = ("math.", "re.")
#: Builtins whose result is a Python value whatever their arguments hold.
_PYTHON_VALUED_BUILTINS = frozenset(
    f"builtins.{name}"
    for name in ("isinstance", "issubclass", "hasattr", "callable", "len", "type")
)


def qualified_name(
    expr: ast.expr, scopes: ModuleScopes, functions: Sequence[ast.AST]
) -> str | None:
    """The dotted name an attribute chain refers to, through the module's imports.

    ``F.gelu`` gives ``torch.nn.functional.gelu`` after ``import torch.nn.functional as
    F``; a builtin gives ``builtins.<name>``; anything not proven gives ``None``.
    """
    attributes: list[str] = []
    while isinstance(expr, ast.Attribute):
        attributes.append(expr.attr)
        expr = expr.value
    if not isinstance(expr, ast.Name):
        return None
    resolution = scopes.resolve(expr.id, functions)
    if resolution is Resolution.BUILTIN:
        root = f"builtins.{expr.id}"
    else:
        binding = scopes.sole_global_binding(expr.id, functions)
        if binding is None or binding.kind not in (BindingKind.IMPORT, BindingKind.IMPORT_FROM):
            return None
        root = binding.imported or ""
        if root.startswith("."):
            return None
    return ".".join([root, *reversed(attributes)])


def is_host_conversion(call: ast.Call, scopes: ModuleScopes, functions: Sequence[ast.AST]) -> bool:
    """``x.item()``, ``float(x)``, ``int(x)``, ``bool(x)``: a value read on the host."""
    if isinstance(call.func, ast.Attribute):
        return call.func.attr in HOST_CONVERSION_METHODS and not call.args and not call.keywords
    name = qualified_name(call.func, scopes, functions)
    return name in _HOST_CONVERSION_NAMES and len(call.args) == 1 and not call.keywords


def _python_valued(name: str | None) -> bool:
    """``torch.jit.is_tracing()``, ``is_torchdynamo_compiling()``...: flags, never tensor data."""
    return name is not None and name.rsplit(".", 1)[-1].startswith("is_")


def _called_name(func: ast.expr, scopes: ModuleScopes, functions: Sequence[ast.AST]) -> str | None:
    """The qualified name of a callee, or for a name imported relatively (``from ...utils
    import is_torchdynamo_compiling``) the dotted name it imports."""
    name = qualified_name(func, scopes, functions)
    if name is None and isinstance(func, ast.Name):
        binding = scopes.sole_global_binding(func.id, functions)
        if binding is not None and binding.kind is BindingKind.IMPORT_FROM:
            return binding.imported
    return name


def _is_python_value(expr: ast.expr, scopes: ModuleScopes, functions: Sequence[ast.AST]) -> bool:
    """Whether ``expr`` is a Python value at trace time whatever the names in it hold:
    metadata (``x.shape``, ``x.size()``), an identity test (``m is None``), a type check
    (``isinstance``, ``len``...), a flag (``is_torchdynamo_compiling()``), a string test
    (``key.startswith("text_")``, ``"batch" in mode``), or ``any``/``all`` of such values
    (``any(m is None for m in masks)``)."""
    if isinstance(expr, ast.Attribute):
        return expr.attr in _METADATA_ATTRIBUTES
    if isinstance(expr, ast.Compare):
        identity = all(isinstance(op, ast.Is | ast.IsNot) for op in expr.ops)
        substring = (
            isinstance(expr.left, ast.Constant)
            and isinstance(expr.left.value, str)
            and all(isinstance(op, ast.In | ast.NotIn) for op in expr.ops)
        )
        return identity or substring
    if isinstance(expr, ast.Call):
        if isinstance(expr.func, ast.Attribute) and (
            expr.func.attr in _METADATA_METHODS or expr.func.attr in _PYTHON_VALUED_METHODS
        ):
            return True
        name = _called_name(expr.func, scopes, functions)
        if name in ("builtins.any", "builtins.all") and len(expr.args) == 1:
            (values,) = expr.args
            return isinstance(values, ast.GeneratorExp | ast.ListComp) and _is_python_value(
                values.elt, scopes, functions
            )
        return _python_valued(name) or name in _PYTHON_VALUED_BUILTINS
    return False


def is_number_search(expr: ast.expr) -> bool:
    """``0.0 in mask``, ``-1 not in ids``: a number literal searched in a name or attribute,
    which reads the host when that holds a tensor (``Tensor.__contains__``)."""
    if not (
        isinstance(expr, ast.Compare)
        and len(expr.ops) == 1
        and isinstance(expr.ops[0], ast.In | ast.NotIn)
        and isinstance(expr.comparators[0], ast.Name | ast.Attribute)
    ):
        return False
    element = expr.left
    if isinstance(element, ast.UnaryOp) and isinstance(element.op, ast.USub | ast.UAdd):
        element = element.operand
    return (
        isinstance(element, ast.Constant)
        and type(element.value) in (int, float)
        and not (
            isinstance(expr.comparators[0], ast.Attribute)
            and expr.comparators[0].attr in _METADATA_ATTRIBUTES
        )
    )


def _reads_through(call: ast.Call, scopes: ModuleScopes, functions: Sequence[ast.AST]) -> bool:
    """``getattr(o, "a")``, ``kwargs.get("a")``, ``math.prod(x.shape)``: the value is what
    ``o`` or the mapping holds, or computed from the arguments, so it may hold tensor data
    only where they may."""
    if isinstance(call.func, ast.Attribute) and call.func.attr == "get":
        return True
    name = qualified_name(call.func, scopes, functions) or ""
    return name == "builtins.getattr" or name.startswith(_READ_THROUGH_MODULES)


def may_hold_tensor_data(
    expr: ast.expr,
    scopes: ModuleScopes,
    functions: Sequence[ast.AST],
    tensor_names: frozenset[str] = frozenset(),
) -> bool:
    """Whether evaluating ``expr`` as a condition may need tensor data.

    True when it calls something other than a query whose value is Python at
    trace time (metadata, type checks, flags, string tests: see
    :func:`_is_python_value`): a reduction, a comparison helper, a host read
    such as ``.item()``; when it searches for a number (``0.0 in mask``,
    :func:`is_number_search`); or when it uses one of ``tensor_names`` (locals
    computed from such calls) other than for its metadata.  Conditions on
    names, attributes, shapes and dtypes alone are Python values at trace time
    and never break a graph.
    """
    if _is_python_value(expr, scopes, functions):
        return False
    if isinstance(expr, ast.Name):
        return expr.id in tensor_names
    if is_number_search(expr):
        return True
    if isinstance(expr, ast.Call) and not _reads_through(expr, scopes, functions):
        return True
    return any(
        may_hold_tensor_data(child, scopes, functions, tensor_names)
        for child in ast.iter_child_nodes(expr)
        if isinstance(child, ast.expr)
    )


def _may_produce_tensor(
    expr: ast.expr, scopes: ModuleScopes, functions: Sequence[ast.AST], names: frozenset[str]
) -> bool:
    """Whether ``expr`` is computed by a torch function or tensor method, or from such a local
    (other than through its metadata or another Python value)."""
    if _is_python_value(expr, scopes, functions):
        return False
    if isinstance(expr, ast.Name):
        return expr.id in names
    if isinstance(expr, ast.Call):
        func = expr.func
        if isinstance(func, ast.Attribute) and func.attr in PURE_TENSOR_METHODS:
            return True
        name = qualified_name(func, scopes, functions)
        if name is not None and name.startswith("torch."):
            return True
    return any(
        _may_produce_tensor(child, scopes, functions, names)
        for child in ast.iter_child_nodes(expr)
        if isinstance(child, ast.expr)
    )


def tensor_valued_names(
    function: ast.AST, scopes: ModuleScopes, functions: Sequence[ast.AST]
) -> frozenset[str]:
    """Locals of ``function`` assigned from torch functions, tensor methods, or such locals."""
    assignments = [
        (node.targets if isinstance(node, ast.Assign) else [node.target], node.value)
        for node in walk(function)
        if isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign) and node.value is not None
    ]
    names: set[str] = set()
    changed = True
    while changed:
        changed = False
        for targets, value in assignments:
            if not _may_produce_tensor(value, scopes, functions, frozenset(names)):
                continue
            for target in targets:
                for name in stored_names(target) - names:
                    names.add(name)
                    changed = True
    return frozenset(names)
