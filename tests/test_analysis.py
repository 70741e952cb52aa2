"""Static analysis: module patterns and name resolution."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

from graphmend.analysis.bindings import identity_used_after, live_after, used_in_place_after
from graphmend.analysis.scopes import BindingKind, ModuleScopes, Resolution
from graphmend.analysis.walking import walk
from graphmend.patterns import ModuleMatcher, PatternError


@pytest.mark.parametrize(
    ("patterns", "name", "claimed"),
    [
        (["transformers.models.*"], "transformers.models.llama.modeling_llama", True),
        (["transformers.models.*"], "transformers.models", False),
        (["transformers.models.*"], "transformers.modeling_utils", False),
        (["transformers.modeling_*"], "transformers.modeling_rope_utils", True),
        (["mypkg"], "mypkg", True),
        (["mypkg"], "mypkg.sub.mod", True),
        (["mypkg"], "mypkg_other", False),
        (["*.modeling_*"], "anything.modeling_x", True),
        (["transformers_modules.*"], "transformers_modules.abc123.modeling_x", True),
        ([], "anything", False),
    ],
)
def test_module_patterns(patterns, name, claimed):
    assert ModuleMatcher(patterns).matches(name) is claimed


@pytest.mark.parametrize("pattern", ["", " ", "a b", ".rel", "a..b", "a/b"])
def test_bad_patterns_are_refused(pattern):
    with pytest.raises(PatternError):
        ModuleMatcher([pattern])


def _scopes(source: str) -> tuple[ModuleScopes, ast.Module]:
    tree = ast.parse(textwrap.dedent(source))
    return ModuleScopes(tree), tree


def _function(tree: ast.Module, name: str) -> ast.AST:
    return next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)


def test_resolution_follows_python_scoping():
    scopes, tree = _scopes(
        """
        import logging as log
        from warnings import warn
        logger = log.getLogger(__name__)
        counter = 0

        def outer(a):
            local = 1
            def inner(b):
                return a + local + b
            [z for z in range(3)]
            if (walrus := a):
                pass
            return inner

        def rebinds():
            global counter
            counter = 1
        """
    )
    outer, inner = _function(tree, "outer"), _function(tree, "inner")
    assert scopes.resolve("a", [outer, inner]) is Resolution.LOCAL
    assert scopes.resolve("local", [outer, inner]) is Resolution.LOCAL
    assert scopes.resolve("walrus", [outer]) is Resolution.LOCAL
    assert scopes.resolve("z", [outer]) is Resolution.BUILTIN  # comprehension-local
    assert scopes.resolve("print", [outer]) is Resolution.BUILTIN
    assert scopes.resolve("logger", [outer]) is Resolution.GLOBAL
    binding = scopes.sole_global_binding("logger", [outer])
    assert binding is not None and binding.kind is BindingKind.ASSIGN
    assert scopes.sole_global_binding("log", [outer]).imported == "logging"
    assert scopes.sole_global_binding("warn", [outer]).imported == "warnings.warn"
    # `global counter` plus an assignment is a second module-level binding.
    assert scopes.sole_global_binding("counter", [outer]) is None


def test_star_import_makes_unbound_names_unknown():
    scopes, tree = _scopes("from torch import *\ndef f():\n    print(1)\n")
    assert scopes.resolve("print", [_function(tree, "f")]) is Resolution.UNKNOWN


@pytest.mark.parametrize(
    ("nested", "live"),
    [
        ("def g():\n        return y", True),  # reads the outer y
        ("def g():\n        y = 2\n        return y", False),  # its own local y
        ("def g(y):\n        return y", False),  # a parameter
        ("def g():\n        nonlocal y\n        y = 2\n        return y", True),
        ("h = lambda: y", True),
        ("h = lambda y: y", False),
        ("def g():\n        z = [y for y in range(2)]\n        return y", True),
        ("class C:\n        z = y", True),
    ],
)
def test_live_after_follows_python_scoping_of_nested_functions(nested, live):
    source = f"def f(x):\n    y = 1\n    if x:\n        y = 2\n    {nested}\n    return x\n"
    tree = ast.parse(source)
    function = _function(tree, "f")
    site = function.body[1]
    assert live_after(function, site, "y") is live


@pytest.mark.parametrize(
    ("after", "updated"),
    [
        ("y.add_(1)", True),
        ("z = y.view(-1)\n    z.add_(1)", True),
        ("z = y[0]\n    w = z.T\n    w += 1", True),
        ("a, b = y.chunk(2)\n    b.mul_(2)", True),
        ("a, b = y, x\n    a[0] = 1", True),
        ("z = torch.transpose(y, 0, 1)\n    torch.add(z, 1, out=z)", True),
        ("z = y if x else x\n    z.zero_()", True),
        ("for row in y:\n        row.add_(1)", True),
        # through an expression that may be y or a view of it, unbound
        ("y.data.add_(1)", True),
        ("y.view(-1)[0] = 1", True),
        ("y[0] += 1", True),
        ("torch.add(x, 1, out=y.t())", True),
        ("(y * 2).add_(1)", False),
        # new tensors, or containers holding y, are not y
        ("z = y * 2\n    z.add_(1)", False),
        ("outputs = (y,)\n    outputs += (x,)", False),
        ("a, b = x, y\n    a.add_(1)", False),
        ("z = x.view(-1)\n    z.add_(1)", False),
    ],
)
def test_updates_in_place_after_a_site_follow_views_of_the_name(after, updated):
    source = f"def f(x):\n    if x:\n        y = x\n    else:\n        y = x * 2\n    {after}\n"
    function = _function(ast.parse(source), "f")
    assert used_in_place_after(function, function.body[0], "y") is updated


@pytest.mark.parametrize(
    ("after", "used"),
    [
        ("print(y is x)", True),
        ("z = y.view(-1)\n    print(z is not x)", True),
        ("outputs = (y, x)\n    print(outputs[0] is x)", True),  # the container holds y
        ("print(pick(y) is x)", True),
        ("print(id(y))", True),
        ("print(y.data_ptr())", True),
        ("print(y[:]._base is x)", True),
        ("y.tag = 1", True),  # an attribute of the very object
        ("z = y * 2\n    z.tag = 1", False),
        ("print(y.view(-1).data_ptr())", True),
        ("print({y.view(-1): 1})", True),
        # a tensor hashes by identity: looked up, or made a key or an element
        ("print(y in seen)", True),
        ("print(y not in seen)", True),
        ("print(len({y, x}))", True),
        ("print({y: 1})", True),
        ("print(hash(y))", True),
        ("print(seen.get(y, 0))", True),
        ("print(outputs.index(y))", True),
        # against a constant, the type of a value, or names that never hold y
        ("print(y is None)", False),
        ("print(type(y) is torch.Tensor)", False),
        ("z = y * 2\n    print(z is x)", False),
        ("print(x in y, {x: y})", False),  # y's values, y as a dict's value
    ],
)
def test_identity_used_after_a_site_follows_what_may_hold_the_name(after, used):
    source = f"def f(x):\n    if x:\n        y = x\n    else:\n        y = x * 2\n    {after}\n"
    function = _function(ast.parse(source), "f")
    assert identity_used_after(function, function.body[0], "y") is used


def test_walk_gives_the_nodes_of_ast_walk_in_its_order():
    import graphmend.rewrites.predicate as module

    tree = ast.parse(Path(module.__file__).read_text())
    assert walk(tree) == list(ast.walk(tree))
