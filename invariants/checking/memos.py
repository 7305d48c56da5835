"""The fast path's node memos: what lets a tree-node rule, a node sum or a node set be decided
from the nodes that changed since the last event, with the same answer as over every node.

Keeps the fast path's answers exact — each memo gives the value a full evaluation would:

- **Tree-node rules over the changed nodes only** (``NodeMemo``). A rule ``for_each:
  tree.nodes as n`` whose WHERE and EXPR read nothing but ``n``, constants, functions and
  attribute chains of the view (``tree.page_size``, ``tree.kind``) — its "context" — decides
  each node from the node's view and the context alone (the context's values are
  compared, and must be plain scalars). The node registry hands out its
  tuple with ``prior`` (the tuple it handed out before) and ``fresh`` (the views built since:
  changed and added nodes; every other view in the tuple is the same object as in
  ``prior``). So if the rule passed on every node of ``prior`` under an equal context, it
  passes on the new tuple iff it passes on ``fresh``: removed nodes cannot make it fail, and
  kept nodes are the very views it accepted. Anything else — another tuple than the one the
  rule last saw (a fixture, a view the checker did not see), a changed context, a failure
  last time — evaluates the rule over every node.
- **Node sums kept up to date** (``TermMemo``). A term ``sum(E for v in tree.nodes if C)``
  of a rule, E and C node-local as above, is replaced in the fused test by a name whose
  value is the last total minus the terms of ``gone`` plus those of ``fresh`` (the tuple
  is ``prior`` - ``gone`` + ``fresh``, as multisets of view objects). Integer addition is
  exact, so this is the sum itself; a total that is not an int (a float term) or any
  other case than above is summed over every node.
- **Node sets kept up to date** (``TermMemo``, as a set). A term ``{E for v in tree.nodes if C}``, E
  and C node-local, is likewise a name whose value is the set of the keys of a count of E
  over the nodes where C holds, counts moved by ``gone`` and ``fresh``: an element is in
  the set iff some node of the tuple yields it, which is the comprehension's set.
"""

from __future__ import annotations

import ast
import copy
from dataclasses import dataclass, field
from types import CodeType
from typing import Any, cast

from invariants.checking.dsl import FUNCTIONS, STATE_NAMES, compile_tree
from invariants.checking.fusion import COMPREHENSIONS
from invariants.checking.rule import Rule

FRESH = "_fresh"  # the DSL forbids names starting with "_": no rule can read or shadow it
_SCALARS = (int, float, str, bool, type(None))


@dataclass(slots=True, eq=False)
class NodeMemo:
    """What a tree-node (or block) rule last saw: the tuple, its context values, whether it
    passed."""

    context: CodeType  # the tuple of the rule's context values
    over_fresh: CodeType  # the rule's pass condition over the fresh views only
    full: CodeType  # the rule's pass condition over every node
    source: CodeType  # the tuple itself (``tree.nodes``, ``blocks``)
    seen: Any = None
    values: tuple[Any, ...] | None = None
    passed: bool = False

    def fresh(self) -> NodeMemo:
        return NodeMemo(self.context, self.over_fresh, self.full, self.source)

    def passes(self, env: dict[str, Any]) -> bool:
        """Whether the rule passes (over the fresh nodes only when that is enough)."""
        nodes, values = eval(self.source, env), self._values(env)
        if self.passed and values is not None and values == self.values and self.seen is not None:
            if nodes is self.seen:
                return True
            if getattr(nodes, "prior", None) is self.seen:
                env[FRESH] = nodes.fresh
                try:
                    ok = bool(eval(self.over_fresh, env))
                finally:
                    del env[FRESH]
                if ok:
                    self.seen = nodes
                return ok
        passed = bool(eval(self.full, env))
        self.seen, self.values, self.passed = nodes, values, passed
        return passed

    def record(self, env: dict[str, Any], passed: bool) -> None:
        """After a full evaluation: remember the tuple and context it was made on."""
        self.seen, self.values, self.passed = eval(self.source, env), self._values(env), passed

    def _values(self, env: dict[str, Any]) -> tuple[Any, ...] | None:
        return _context_values(self.context, env)


def _context_values(context: CodeType, env: dict[str, Any]) -> tuple[Any, ...] | None:
    """The context values, or None when one cannot be compared cheaply and exactly."""
    try:
        values = eval(context, env)
    except Exception:  # a broken context: the full evaluation reports it
        return None
    return values if all(isinstance(v, _SCALARS) for v in values) else None


@dataclass(slots=True, eq=False)
class TermMemo:
    """One node term of a rule — ``sum(E for v in tree.nodes if C)``, or the set
    ``{E for v in tree.nodes if C}`` — kept up to date from the node tuples' changes: the
    elements ``gone`` yields are taken out of the kept fold, those ``fresh`` yields put in."""

    name: str  # what stands for it in the fused test
    is_set: bool
    context: CodeType
    elements: CodeType  # [E for v in tree.nodes if C]
    over: CodeType  # the same list over FRESH
    seen: Any = None
    values: tuple[Any, ...] | None = None
    total: Any = 0  # a sum's
    counts: dict[Any, int] = field(default_factory=dict)  # a set's: element -> nodes yielding it

    def fresh(self) -> TermMemo:
        return TermMemo(self.name, self.is_set, self.context, self.elements, self.over)

    def value(self, env: dict[str, Any]) -> Any:
        nodes, values = env["tree"].nodes, _context_values(self.context, env)
        if self.seen is not None and values is not None and values == self.values:
            if nodes is not self.seen and getattr(nodes, "prior", None) is self.seen:
                self.seen = None  # until both moves are done (an element may raise)
                gone, fresh = self._over(env, nodes.gone), self._over(env, nodes.fresh)
                self._move(gone, -1)
                self._move(fresh, 1)
                self.seen = nodes if self._exact() else None
            if nodes is self.seen:
                return self._result()
        self.total, self.counts, self.seen = 0, {}, None
        self._move(eval(self.elements, env), 1)
        exact = values is not None and self._exact()
        self.seen, self.values = (nodes if exact else None), values
        return self._result()

    def _move(self, elements: list[Any], step: int) -> None:
        if not self.is_set:
            self.total += sum(elements) if step > 0 else -sum(elements)
            return
        counts = self.counts
        for element in elements:
            left = counts.get(element, 0) + step
            if left:
                counts[element] = left
            else:
                del counts[element]

    def _exact(self) -> bool:
        """A set is kept exactly; a sum only while it is an int (float terms: summed anew)."""
        return self.is_set or type(self.total) is int

    def _result(self) -> Any:
        return set(self.counts) if self.is_set else self.total

    def _over(self, env: dict[str, Any], views: tuple[Any, ...]) -> list[Any]:
        env[FRESH] = views
        try:
            return eval(self.over, env)
        finally:
            del env[FRESH]


class SumTerms(ast.NodeTransformer):
    """Replaces each node-local ``sum(E for v in tree.nodes if C)`` and each node-local
    ``{E for v in tree.nodes if C}`` by the name of its TermMemo."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.memos: list[TermMemo] = []

    def visit_SetComp(self, node: ast.SetComp) -> ast.expr:
        memo = _set_memo(node, f"_set{len(self.memos)}", self.label)
        if memo is None:
            return cast(ast.expr, self.generic_visit(node))
        self.memos.append(memo)
        return ast.Name(memo.name, ast.Load())

    def visit_Call(self, node: ast.Call) -> ast.expr:
        memo = _sum_memo(node, f"_sum{len(self.memos)}", self.label)
        if memo is None:
            return cast(ast.expr, self.generic_visit(node))
        self.memos.append(memo)
        return ast.Name(memo.name, ast.Load())


def _sum_memo(node: ast.Call, name: str, label: str) -> TermMemo | None:
    if not (
        isinstance(node.func, ast.Name)
        and node.func.id == "sum"
        and len(node.args) == 1
        and not node.keywords
        and isinstance(node.args[0], ast.GeneratorExp)
    ):
        return None
    gen = node.args[0]
    return _term_memo(name, label, gen.elt, gen.generators, is_set=False)


def _set_memo(node: ast.SetComp, name: str, label: str) -> TermMemo | None:
    return _term_memo(name, label, node.elt, node.generators, is_set=True)


def _term_memo(
    name: str, label: str, elt: ast.expr, generators: list[ast.comprehension], is_set: bool
) -> TermMemo | None:
    """The memo of a node term over ``for v in tree.nodes if C`` yielding ``elt``, when
    ``elt`` and ``C`` read the node and its context only; None otherwise."""
    loop = generators[0]
    if len(generators) != 1 or not _is_tree_nodes(loop.iter):
        return None
    if not isinstance(loop.target, ast.Name):
        return None
    context = _context_chains(ast.Tuple([elt, *loop.ifs], ast.Load()), loop.target.id)
    if context is None:
        return None
    elements = ast.ListComp(copy.deepcopy(elt), [copy.deepcopy(loop)])
    over = copy.deepcopy(elements)
    over.generators[0].iter = ast.Name(FRESH, ast.Load())
    kind = "set" if is_set else "sum"
    return TermMemo(
        name,
        is_set,
        compile_tree(ast.Tuple([_copy(c) for c in context], ast.Load()), f"context:{label}"),
        compile_tree(elements, f"{kind}:{label}"),
        compile_tree(over, f"{kind}:{label}"),
    )


def node_memo(rule: Rule) -> NodeMemo | None:
    """A memo for a rule over ``tree.nodes`` (or ``blocks``: vLLM's, kept the same way by
    invariants/targets/vllm/blocks.py) that decides each element from the element and its
    context; None for any other rule."""
    shape = rule.shape
    if shape is None or shape.var is None or shape.iterable is None:
        return None
    if not (_is_tree_nodes(shape.iterable) or _is_blocks(shape.iterable)):
        return None
    context = _context_chains(shape.holds, shape.var)
    if context is None:
        return None
    values = ast.Tuple([_copy(c) for c in context], ast.Load())
    gen = ast.comprehension(ast.Name(shape.var, ast.Store()), ast.Name(FRESH, ast.Load()), [], 0)
    over_fresh = ast.Call(ast.Name("all", ast.Load()), [ast.GeneratorExp(shape.holds, [gen])], [])
    return NodeMemo(
        compile_tree(values, f"context:{rule.id}"),
        compile_tree(over_fresh, f"fresh:{rule.id}"),
        compile_tree(shape.passes(), f"full:{rule.id}"),
        compile_tree(_copy(shape.iterable), f"source:{rule.id}"),
    )


def _is_blocks(tree: ast.expr) -> bool:
    return isinstance(tree, ast.Name) and tree.id == "blocks"


def _is_tree_nodes(tree: ast.expr | None) -> bool:
    return (
        isinstance(tree, ast.Attribute)
        and tree.attr == "nodes"
        and isinstance(tree.value, ast.Name)
        and tree.value.id == "tree"
    )


def _context_chains(tree: ast.expr, var: str) -> list[ast.expr] | None:
    """The maximal sub-expressions of ``tree`` not involving ``var``, if each is a constant, a
    function name or an expression of view fields (``tree.page_size``, ``tree.kind ==
    "swa_radix"``); None otherwise (e.g. a comprehension over the view: not a per-node rule)."""
    found: list[ast.expr] = []

    def visit(node: ast.AST) -> bool:
        if not any(isinstance(n, ast.Name) and n.id == var for n in ast.walk(node)):
            if _literal(node) or (isinstance(node, ast.Name) and node.id in FUNCTIONS):
                return True
            if _view_expression(node):
                found.append(node)  # type: ignore[arg-type]
                return True
            return False
        if isinstance(node, (ast.GeneratorExp, ast.ListComp, ast.SetComp)):
            return False  # an inner comprehension: kept out of the memo, to stay simple
        return all(
            visit(child)
            for child in ast.iter_child_nodes(node)
            if not isinstance(
                child, (ast.expr_context, ast.operator, ast.unaryop, ast.cmpop, ast.boolop)
            )
        )

    return found if visit(tree) else None


def _literal(node: ast.AST) -> bool:
    """A constant, or a display of constants (``[]``, ``(0, 1)``): the same at every event
    (a context value must be a scalar to be compared, so a list is never one)."""
    return all(not isinstance(part, (ast.Name, *COMPREHENSIONS)) for part in ast.walk(node))


def _view_expression(node: ast.AST) -> bool:
    """An expression of view fields, constants and functions, without comprehensions."""
    for part in ast.walk(node):
        if isinstance(part, (ast.GeneratorExp, ast.ListComp, ast.SetComp)):
            return False
        if isinstance(part, ast.Name) and part.id not in STATE_NAMES and part.id not in FUNCTIONS:
            return False
    return isinstance(node, ast.expr)


def _copy(node: ast.expr) -> ast.expr:
    return ast.parse(ast.unparse(node), mode="eval").body
