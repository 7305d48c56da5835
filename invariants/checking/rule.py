"""A compiled invariant: one code object that returns the failing elements, plus its message.

Keeps: a `for_each` rule is evaluated in a single compiled list comprehension
`[x for x in ITER if WHERE if not (EXPR)]`, so a passing rule costs one `eval` whatever the
number of elements, and the failing elements come back as witnesses.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import CodeType, MappingProxyType
from typing import Any, TypeVar

from engine.view import StateView
from invariants.checking.dsl import (
    FUNCTIONS,
    STATE_NAMES,
    DslError,
    Expr,
    compile_expr,
    compile_tree,
)
from invariants.checking.message import Template, compile_template
from invariants.checking.schema import InvariantSpec

T = TypeVar("T")
BASE_NAMES: frozenset[str] = frozenset(STATE_NAMES) | {"prev"}
_FOR_EACH = re.compile(r"^(?P<iter>.+)\s+as\s+(?P<var>[A-Za-z][A-Za-z0-9_]*)\s*$", re.DOTALL)


@dataclass(frozen=True, slots=True)
class Fixture:
    """A state (and optional previous state) on which an invariant must pass or fail."""

    event: str
    view: StateView
    prev: StateView | None = None
    source: str = "<memory>"  # path:line of the fixture


class RuleError(ValueError):
    """Compile errors of one entry, as (field, reason) pairs."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        super().__init__("; ".join(f"{f}: {r}" for f, r in problems))
        self.problems = problems


@dataclass(frozen=True, slots=True, eq=False)
class RuleShape:
    """A rule's validated trees: it passes iff ``all(holds for var in iterable)`` (for_each)
    or ``holds`` is true; ``holds`` is ``not WHERE or EXPR`` (or EXPR)."""

    holds: ast.expr
    iterable: ast.expr | None = None
    var: str | None = None

    def passes(self) -> ast.expr:
        """The expression that is true iff the rule passes."""
        if self.iterable is None or self.var is None:
            return self.holds
        gen = ast.comprehension(ast.Name(self.var, ast.Store()), self.iterable, [], 0)
        return ast.Call(ast.Name("all", ast.Load()), [ast.GeneratorExp(self.holds, [gen])], [])


@dataclass(frozen=True, slots=True, eq=False)
class Rule:
    """One loaded invariant, ready to evaluate against `dsl.make_env` globals."""

    id: str
    title: str
    events: frozenset[str]
    test: CodeType
    message: Template
    var: str | None = None  # the for_each variable
    for_steps: int = 0
    origin: tuple[str, ...] = ()
    uses_prev: bool = False
    attrs: frozenset[str] = frozenset()  # view attribute names read (which parts to build)
    names: frozenset[str] = frozenset()  # top-level view fields read (which sections to build)
    shape: RuleShape | None = None  # the validated trees, for the checker's fast paths
    fixtures: Mapping[str, Fixture] = field(default_factory=lambda: MappingProxyType({}))
    source: str = "<memory>"  # path:line of the entry

    def failing(self, env: dict[str, Any]) -> list[Any]:
        """The failing elements (for_each), or one `None` standing for the whole view."""
        result = eval(self.test, env)
        if self.var is None:
            return [] if result else [None]
        return result

    def render(self, env: dict[str, Any], element: Any = None) -> str:
        """The message filled with the values of one failing element."""
        if self.var is None:
            return self.message.render(env)
        return self.message.render({**env, self.var: element})


def split_for_each(text: str) -> tuple[str, str]:
    """'<expr> as <name>' → (expr, name)."""
    match = _FOR_EACH.match(text.strip())
    if match is None:
        raise DslError("col 1: for_each must read '<expr> as <name>'")
    var = match["var"]
    if var in BASE_NAMES or var in FUNCTIONS:
        raise DslError(f"col {match.start('var') + 1}: for_each variable '{var}' shadows a name")
    return match["iter"], var


def compile_rule(
    spec: InvariantSpec, fixtures: Mapping[str, Fixture] | None = None, source: str = "<memory>"
) -> Rule:
    """Validate and compile every expression of `spec`; RuleError lists all failing fields."""
    problems: list[tuple[str, str]] = []
    iterable, var = _for_each(spec, problems)
    names = BASE_NAMES | ({var} if var else set())
    if spec.where is not None and spec.for_each is None:
        problems.append(("where", "where needs for_each"))
    where = _attempt(problems, "where", compile_expr, spec.where, names, spec.id)
    test = _attempt(problems, "expr", compile_expr, spec.expr, names, spec.id)
    message = _attempt(problems, "message", compile_template, spec.message, names, spec.id)
    if problems or test is None or message is None:
        raise RuleError(problems)
    reads = test.reads | message.reads | _reads(iterable) | _reads(where)
    attrs = test.attrs | message.attrs | _attrs(iterable) | _attrs(where)
    return Rule(
        id=spec.id,
        title=spec.title,
        events=frozenset(spec.when),
        test=_combine(spec.id, test, iterable, where, var),
        message=message,
        var=var,
        for_steps=spec.for_steps,
        origin=tuple(spec.origin),
        uses_prev="prev" in reads,
        attrs=attrs,
        names=reads & frozenset(STATE_NAMES),
        shape=_shape(test, iterable, where, var),
        fixtures=MappingProxyType(dict(fixtures or {})),
        source=source,
    )


def _for_each(
    spec: InvariantSpec, problems: list[tuple[str, str]]
) -> tuple[Expr | None, str | None]:
    if spec.for_each is None:
        return None, None
    try:
        text, var = split_for_each(spec.for_each)
        return compile_expr(text, BASE_NAMES, label=spec.id), var
    except DslError as exc:
        problems.append(("for_each", str(exc)))
        return None, None


def _attempt(
    problems: list[tuple[str, str]],
    name: str,
    compiler: Callable[..., T],
    source: str | None,
    names: frozenset[str],
    label: str,
) -> T | None:
    if source is None:
        return None
    try:
        return compiler(source, names, label=label)
    except DslError as exc:
        problems.append((name, str(exc)))
        return None


def _reads(expr: Expr | None) -> frozenset[str]:
    return expr.reads if expr is not None else frozenset()


def _attrs(expr: Expr | None) -> frozenset[str]:
    return expr.attrs if expr is not None else frozenset()


def _shape(test: Expr, iterable: Expr | None, where: Expr | None, var: str | None) -> RuleShape:
    holds = (
        test.tree
        if where is None
        else ast.BoolOp(ast.Or(), [ast.UnaryOp(ast.Not(), where.tree), test.tree])
    )
    return RuleShape(holds, iterable.tree if iterable is not None else None, var)


def _combine(
    label: str, test: Expr, iterable: Expr | None, where: Expr | None, var: str | None
) -> CodeType:
    if iterable is None or var is None:
        return test.code
    ifs = ([where.tree] if where is not None else []) + [ast.UnaryOp(ast.Not(), test.tree)]
    comp = ast.ListComp(
        elt=ast.Name(var, ast.Load()),
        generators=[ast.comprehension(ast.Name(var, ast.Store()), iterable.tree, ifs, 0)],
    )
    return compile_tree(comp, label)
