"""The invariant expression language: a restricted Python expression subset, validated and compiled.

Keeps: a catalog author can read the state view and compute over it, nothing else — no imports,
no method calls, no attribute outside the view schema, no assignment, so an expression can
neither run code nor mutate the engine (docs/design.md §5).
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields
from operator import attrgetter
from types import CodeType, MappingProxyType
from typing import Any

from engine.view import StateView, view_field_names

FUNCTIONS: Mapping[str, Callable[..., Any]] = MappingProxyType(
    {
        "sum": sum,
        "len": len,
        "all": all,
        "any": any,
        "min": min,
        "max": max,
        "set": set,
        "abs": abs,
        "sorted": sorted,
    }
)
STATE_NAMES: tuple[str, ...] = tuple(f.name for f in fields(StateView))
_state_fields = attrgetter(*STATE_NAMES)  # every StateView field, in order, in one call
ATTRIBUTES: frozenset[str] = view_field_names()

_BINOPS: dict[type, str] = {
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.FloorDiv: "//",
    ast.Mod: "%",
}
_UNARY: dict[type, str] = {ast.Not: "not", ast.USub: "-", ast.UAdd: "+"}
_COMPARE: tuple[type, ...] = (
    ast.Eq,
    ast.NotEq,
    ast.Lt,
    ast.LtE,
    ast.Gt,
    ast.GtE,
    ast.In,
    ast.NotIn,
    ast.Is,
    ast.IsNot,
)
_CONSTANTS: tuple[type, ...] = (int, float, str, bool, type(None))
_SYMBOLS: dict[type, str] = {
    ast.Pow: "**",
    ast.MatMult: "@",
    ast.Div: "/",
    ast.LShift: "<<",
    ast.RShift: ">>",
    ast.BitOr: "|",
    ast.BitXor: "^",
    ast.BitAnd: "&",
    ast.Invert: "~",
}
_DESCRIBE: dict[str, str] = {
    "Lambda": "lambda",
    "NamedExpr": "assignment expression ':='",
    "JoinedStr": "f-string",
    "FormattedValue": "f-string",
    "Dict": "dict display",
    "DictComp": "dict comprehension",
    "Starred": "star expression",
    "Await": "await",
    "Yield": "yield",
    "YieldFrom": "yield",
}


class DslError(ValueError):
    """An expression or message template outside the language; the text names construct and
    column."""


def _where(node: ast.AST, offset: int) -> str:
    line = getattr(node, "end_lineno" if isinstance(node, ast.Attribute) else "lineno", 1) or 1
    col = _column(node) + 1 + (offset if line == 1 else 0)
    return f"col {col}" if line == 1 else f"line {line} col {col}"


def _column(node: ast.AST) -> int:
    if isinstance(node, ast.Attribute) and node.end_col_offset is not None:
        return node.end_col_offset - len(node.attr)  # point at the attribute name itself
    return getattr(node, "col_offset", 0)


class _Validator:
    """Walks an expression tree; raises DslError at the first construct outside the language."""

    def __init__(self, offset: int) -> None:
        self.offset = offset  # column of the expression inside its enclosing text (templates)

    def error(self, node: ast.AST, what: str) -> DslError:
        return DslError(f"{_where(node, self.offset)}: {what}")

    def check(self, node: ast.AST, scope: frozenset[str]) -> None:
        method = getattr(self, "_v_" + type(node).__name__, None)
        if method is None:
            name = type(node).__name__
            raise self.error(node, f"{_DESCRIBE.get(name, name)} is not allowed")
        method(node, scope)

    def _v_BoolOp(self, node: ast.BoolOp, scope: frozenset[str]) -> None:
        for value in node.values:
            self.check(value, scope)

    def _v_BinOp(self, node: ast.BinOp, scope: frozenset[str]) -> None:
        if type(node.op) not in _BINOPS:
            sym = _SYMBOLS.get(type(node.op), type(node.op).__name__)
            raise self.error(node, f"operator '{sym}' is not allowed (allowed: + - * // %)")
        self.check(node.left, scope)
        self.check(node.right, scope)

    def _v_UnaryOp(self, node: ast.UnaryOp, scope: frozenset[str]) -> None:
        if type(node.op) not in _UNARY:
            sym = _SYMBOLS.get(type(node.op), type(node.op).__name__)
            raise self.error(node, f"operator '{sym}' is not allowed (allowed: not - +)")
        self.check(node.operand, scope)

    def _v_Compare(self, node: ast.Compare, scope: frozenset[str]) -> None:
        operands = [node.left, *node.comparators]
        for op, left, right in zip(node.ops, operands, operands[1:]):
            if type(op) not in _COMPARE:
                raise self.error(node, f"comparison {type(op).__name__} is not allowed")
            if isinstance(op, (ast.Is, ast.IsNot)) and not (_is_none(left) or _is_none(right)):
                raise self.error(node, "'is' / 'is not' may only compare with None")
        for operand in operands:
            self.check(operand, scope)

    def _v_IfExp(self, node: ast.IfExp, scope: frozenset[str]) -> None:
        for part in (node.test, node.body, node.orelse):
            self.check(part, scope)

    def _v_Name(self, node: ast.Name, scope: frozenset[str]) -> None:
        if node.id in scope:
            return
        if node.id in FUNCTIONS:
            raise self.error(node, f"function '{node.id}' may only be called")
        raise self.error(node, f"unknown name '{node.id}' (known: {', '.join(sorted(scope))})")

    def _v_Constant(self, node: ast.Constant, scope: frozenset[str]) -> None:
        if type(node.value) not in _CONSTANTS:
            raise self.error(node, f"constant of type {type(node.value).__name__} is not allowed")

    def _v_Attribute(self, node: ast.Attribute, scope: frozenset[str]) -> None:
        self.check(node.value, scope)  # innermost first: errors come in reading order
        if node.attr not in ATTRIBUTES:  # schema names only: blocks gi_frame, pop, __class__
            raise self.error(node, f"attribute '{node.attr}' is not a view field")

    def _v_Subscript(self, node: ast.Subscript, scope: frozenset[str]) -> None:
        self.check(node.value, scope)
        self.check(node.slice, scope)

    def _v_Slice(self, node: ast.Slice, scope: frozenset[str]) -> None:
        for part in (node.lower, node.upper, node.step):
            if part is not None:
                self.check(part, scope)

    def _v_Tuple(self, node: ast.Tuple | ast.List | ast.Set, scope: frozenset[str]) -> None:
        for elt in node.elts:
            self.check(elt, scope)

    _v_List = _v_Set = _v_Tuple

    def _v_GeneratorExp(
        self, node: ast.GeneratorExp | ast.ListComp | ast.SetComp, scope: frozenset[str]
    ) -> None:
        inner = scope
        for gen in node.generators:
            if gen.is_async:
                raise self.error(node, "async comprehension is not allowed")
            self.check(gen.iter, inner)  # the iterable sees only the names bound before it
            inner = inner | self.targets(gen.target, inner)
            for cond in gen.ifs:
                self.check(cond, inner)
        self.check(node.elt, inner)

    _v_ListComp = _v_SetComp = _v_GeneratorExp

    def targets(self, node: ast.expr, scope: frozenset[str]) -> frozenset[str]:
        if isinstance(node, ast.Tuple):
            return frozenset().union(*(self.targets(elt, scope) for elt in node.elts))
        if not isinstance(node, ast.Name):
            raise self.error(node, "a comprehension variable must be a name or a tuple of names")
        if node.id in scope or node.id in FUNCTIONS or node.id.startswith("_"):
            raise self.error(
                node, f"comprehension variable '{node.id}' shadows a name or is private"
            )
        return frozenset((node.id,))

    def _v_Call(self, node: ast.Call, scope: frozenset[str]) -> None:
        func = node.func
        if isinstance(func, ast.Attribute):
            self.check(func.value, scope)  # report `__import__` before `.getpid`
        if not (isinstance(func, ast.Name) and func.id in FUNCTIONS):
            raise self.error(
                node, f"call to {_callee(func)} is not allowed (callable: {' '.join(FUNCTIONS)})"
            )
        if node.keywords:
            raise self.error(node.keywords[0], "keyword arguments are not allowed")
        for arg in node.args:
            self.check(arg, scope)


def _is_none(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def _callee(func: ast.expr) -> str:
    if isinstance(func, ast.Name):
        return f"'{func.id}'"
    if isinstance(func, ast.Attribute):
        return f"method '.{func.attr}'"
    return "a lambda" if isinstance(func, ast.Lambda) else "a computed value"


def parse_expr(source: str, names: Iterable[str], offset: int = 0) -> ast.expr:
    """Parse and validate `source` against the declared `names`; return the expression tree."""
    text = source.strip()
    if not text:
        raise DslError(f"col {offset + 1}: empty expression")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        col = (exc.offset or 1) + offset
        raise DslError(f"col {col}: syntax error: {exc.msg}") from None
    except (ValueError, RecursionError) as exc:  # null bytes, absurd nesting
        raise DslError(f"col {offset + 1}: cannot parse: {exc}") from None
    _Validator(offset).check(tree.body, frozenset(names))
    return tree.body


def compile_tree(tree: ast.expr, label: str) -> CodeType:
    """Compile a validated expression tree once (evaluated later with `evaluate`)."""
    return compile(ast.fix_missing_locations(ast.Expression(tree)), f"<{label}>", "eval")


@dataclass(frozen=True, slots=True, eq=False)
class Expr:
    """A validated, compiled expression, the free names and the attribute names it reads."""

    source: str
    tree: ast.expr
    code: CodeType
    reads: frozenset[str]
    attrs: frozenset[str] = frozenset()

    def __call__(self, env: dict[str, Any]) -> Any:
        return eval(self.code, env)


def compile_expr(source: str, names: Iterable[str], offset: int = 0, label: str = "expr") -> Expr:
    """Validate and compile `source`; raise DslError naming the construct and its column."""
    declared = frozenset(names)
    tree = parse_expr(source, declared, offset)
    reads = frozenset(n.id for n in ast.walk(tree) if isinstance(n, ast.Name)) & declared
    attrs = frozenset(n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute))
    return Expr(source, tree, compile_tree(tree, label), reads, attrs)


_BASE_ENV: dict[str, Any] = {
    "__builtins__": {},
    **FUNCTIONS,
}  # copied per view (validated code writes no global)


def make_env(
    view: StateView, prev: StateView | None = None, extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The evaluation globals: view fields, `prev`, the function table, no builtins."""
    env = _BASE_ENV.copy()
    env["prev"] = prev
    env.update(
        zip(STATE_NAMES, _state_fields(view))
    )  # in globals: comprehension bodies resolve them
    if extra:
        env.update(extra)
    return env
