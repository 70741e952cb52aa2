"""Name binding and resolution: what a name at a site refers to.

Follows Python's scoping rules closely enough to answer the questions the
rewrites ask: is ``print`` at this line the builtin, is ``logger`` the module
global bound once by ``logging.getLogger(...)``, is ``warnings`` the stdlib
module.  Anything the analysis cannot pin down (a star import, several
bindings) resolves to "unknown" and the rewrites decline.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum

from graphmend.analysis.bindings import parameter_names
from graphmend.analysis.walking import walk

_FunctionScope = ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda


class BindingKind(Enum):
    """How a name is bound."""

    IMPORT = "import"  # import a.b as c
    IMPORT_FROM = "import-from"  # from a import b
    ASSIGN = "assign"  # name = value (a single plain target)
    DEF = "def"
    CLASS = "class"
    OTHER = "other"  # loop targets, augmented assignment, del, with, except, match...


#: Module-level bindings to a module, a function or a class: not data the module holds.
STATIC_KINDS = (BindingKind.IMPORT, BindingKind.DEF, BindingKind.CLASS)


@dataclass(frozen=True)
class Binding:
    """One statement that binds a name in a scope."""

    name: str
    kind: BindingKind
    node: ast.AST
    value: ast.expr | None = None  # the right-hand side of an ASSIGN
    imported: str | None = None  # the dotted module (or module.attribute) an import binds


class Resolution(Enum):
    """Where a name read in a function is bound."""

    LOCAL = "local"  # bound in the function or in an enclosing function
    GLOBAL = "global"  # a module-level name
    BUILTIN = "builtin"  # bound nowhere in the module
    UNKNOWN = "unknown"  # a star import could bind it


@dataclass
class _Scope:
    bindings: dict[str, list[Binding]] = field(default_factory=dict)
    declared_global: set[str] = field(default_factory=set)
    declared_nonlocal: set[str] = field(default_factory=set)
    star_import: bool = False
    nested: list[ast.AST] = field(default_factory=list)

    def bind(self, binding: Binding) -> None:
        self.bindings.setdefault(binding.name, []).append(binding)


class _Collector(ast.NodeVisitor):
    """Collects the bindings of one scope without entering nested scopes."""

    def __init__(self, scope: _Scope) -> None:
        self.scope = scope

    def _bind(self, name: str, kind: BindingKind, node: ast.AST, **extra: object) -> None:
        self.scope.bind(Binding(name, kind, node, **extra))  # type: ignore[arg-type]

    def _visit_function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self._bind(node.name, BindingKind.DEF, node)
        for expr in [*node.decorator_list, *node.args.defaults, *node.args.kw_defaults]:
            if expr is not None:
                self.visit(expr)
        self.scope.nested.append(node)

    visit_FunctionDef = _visit_function
    visit_AsyncFunctionDef = _visit_function

    def visit_Lambda(self, node: ast.Lambda) -> None:
        for expr in [*node.args.defaults, *node.args.kw_defaults]:
            if expr is not None:
                self.visit(expr)
        self.scope.nested.append(node)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._bind(node.name, BindingKind.CLASS, node)
        for expr in [*node.decorator_list, *node.bases, *(k.value for k in node.keywords)]:
            self.visit(expr)
        self.scope.nested.append(node)

    def _visit_comprehension(self, node: ast.AST) -> None:
        # Comprehension targets are local to the comprehension; only walrus
        # targets leak into the enclosing scope.
        for child in walk(node):
            if isinstance(child, ast.NamedExpr) and isinstance(child.target, ast.Name):
                self._bind(child.target.id, BindingKind.OTHER, child)
            elif isinstance(child, ast.Lambda):
                self.scope.nested.append(child)

    visit_ListComp = _visit_comprehension
    visit_SetComp = _visit_comprehension
    visit_DictComp = _visit_comprehension
    visit_GeneratorExp = _visit_comprehension

    def visit_Assign(self, node: ast.Assign) -> None:
        if len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            self._bind(node.targets[0].id, BindingKind.ASSIGN, node, value=node.value)
            self.visit(node.value)
            return
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if isinstance(node.target, ast.Name):
            kind = BindingKind.ASSIGN if node.value is not None else BindingKind.OTHER
            self._bind(node.target.id, kind, node, value=node.value)
            if node.value is not None:
                self.visit(node.value)
            return
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Store | ast.Del):
            self._bind(node.id, BindingKind.OTHER, node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.asname:
                self._bind(alias.asname, BindingKind.IMPORT, node, imported=alias.name)
            else:
                top = alias.name.split(".", 1)[0]
                self._bind(top, BindingKind.IMPORT, node, imported=top)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = "." * node.level + (node.module or "")
        for alias in node.names:
            if alias.name == "*":
                self.scope.star_import = True
                continue
            self._bind(
                alias.asname or alias.name,
                BindingKind.IMPORT_FROM,
                node,
                imported=f"{module}.{alias.name}",
            )

    def visit_Global(self, node: ast.Global) -> None:
        self.scope.declared_global.update(node.names)

    def visit_Nonlocal(self, node: ast.Nonlocal) -> None:
        self.scope.declared_nonlocal.update(node.names)

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if node.name:
            self._bind(node.name, BindingKind.OTHER, node)
        self.generic_visit(node)

    def visit_MatchAs(self, node: ast.MatchAs) -> None:
        if node.name:
            self._bind(node.name, BindingKind.OTHER, node)
        self.generic_visit(node)

    def visit_MatchStar(self, node: ast.MatchStar) -> None:
        if node.name:
            self._bind(node.name, BindingKind.OTHER, node)

    def visit_MatchMapping(self, node: ast.MatchMapping) -> None:
        if node.rest:
            self._bind(node.rest, BindingKind.OTHER, node)
        self.generic_visit(node)


def _collect(body: Sequence[ast.AST] | ast.expr) -> _Scope:
    scope = _Scope()
    collector = _Collector(scope)
    for node in body if isinstance(body, Sequence) else [body]:
        collector.visit(node)
    return scope


class ModuleScopes:
    """Scope facts for one module, computed once and shared by the rewrites."""

    def __init__(self, tree: ast.Module) -> None:
        self.tree = tree
        module = _collect(tree.body)
        self.star_import = module.star_import
        self._module_bindings = module.bindings
        self._function_locals: dict[ast.AST, frozenset[str]] = {}
        self._walk_nested(module.nested)

    def _walk_nested(self, pending: list[ast.AST]) -> None:
        while pending:
            node = pending.pop()
            if isinstance(node, ast.ClassDef):
                scope = _collect(node.body)
            else:
                assert isinstance(node, _FunctionScope)
                scope = _collect(node.body)
                for name in sorted(parameter_names(node)):
                    scope.bind(Binding(name, BindingKind.OTHER, node))
                for name in scope.declared_global:
                    for binding in scope.bindings.get(name, []):
                        self._module_bindings.setdefault(name, []).append(binding)
                self._function_locals[node] = frozenset(
                    set(scope.bindings) - scope.declared_global - scope.declared_nonlocal
                )
            pending.extend(scope.nested)

    def locals_of(self, function: ast.AST) -> frozenset[str]:
        """Names local to ``function`` (parameters included)."""
        return self._function_locals.get(function, frozenset())

    def resolve(self, name: str, enclosing: Sequence[ast.AST]) -> Resolution:
        """How ``name`` resolves inside the innermost of ``enclosing`` functions."""
        if any(name in self.locals_of(function) for function in enclosing):
            return Resolution.LOCAL
        if name in self._module_bindings:
            return Resolution.GLOBAL
        return Resolution.UNKNOWN if self.star_import else Resolution.BUILTIN

    def sole_global_binding(self, name: str, enclosing: Sequence[ast.AST]) -> Binding | None:
        """The one module-level binding ``name`` refers to here, if there is exactly one."""
        if self.resolve(name, enclosing) is not Resolution.GLOBAL:
            return None
        bindings = self._module_bindings[name]
        first = bindings[0]
        # `import torch` and `import torch.utils.checkpoint` both bind torch to torch.
        same_import = all(
            b.kind is BindingKind.IMPORT and b.imported == first.imported for b in bindings
        )
        return first if len(bindings) == 1 or same_import else None
