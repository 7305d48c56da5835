"""How the checker's fused test (``fastpath.py``) is built: the rules over the same
iterable share one loop (``fuse``), and in its loops what reads no loop variable is
evaluated once per event (``Hoister``).

Loop-invariant code motion: a sub-expression inside a comprehension that reads no variable
of an enclosing comprehension has one value at every element, so it is evaluated once per
event, before the test, into a name the test reads (``_h0``, ``_h1`` …: the DSL forbids
names starting with "_").

Keeps the fused test's answer: the language's expressions are pure (no assignment, no call
but the side-effect-free FUNCTIONS) and the environment does not change while one event is
checked, so an invariant sub-expression has the same value wherever and however often the
test would have evaluated it. Evaluating it up front may evaluate what a short circuit
would have skipped; if that raises, ``EventFastPath.all_pass`` answers "evaluate each rule",
which records what the rules record on their own — only slower.

Worth hoisting: anything but a constant, a bare name (whose lookup costs what the hoisted
name's does) and a bare generator (used up by its first reader). The first iterable of a
comprehension is evaluated once already (in the enclosing scope) and is left where it is.
``fuse`` works on copies: a rule's own trees are never rewritten (its fast paths at other
events are built from them again). tests/invariants/checking/test_fusion.py.
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Sequence
from types import CodeType
from typing import cast

from invariants.checking.dsl import compile_tree
from invariants.checking.rule import RuleShape

HOISTED = "_h"
ELEMENT = "_e"  # the shared loop's variable (a name the language cannot write)
COMPREHENSIONS = (ast.GeneratorExp, ast.ListComp, ast.SetComp, ast.DictComp)
Comprehension = ast.GeneratorExp | ast.ListComp | ast.SetComp | ast.DictComp


class Hoister(ast.NodeTransformer):
    """Replaces the maximal loop-invariant sub-expressions of the trees it visits by names
    (an expression met twice gets one name); ``hoisted`` lists them, in first-seen order,
    and ``compiled`` evaluates them all at once."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.hoisted: list[tuple[str, ast.expr]] = []
        self._names: dict[str, str] = {}  # ast.dump of an expression -> its name
        self._bound: list[set[str]] = []  # the variables of the comprehensions around
        self._free: dict[int, tuple[ast.AST, frozenset[str]]] = {}  # free_names' memo

    def visit(self, node: ast.AST) -> ast.AST:
        if (
            isinstance(node, ast.expr)
            and self._bound
            and _worth_hoisting(node)
            and not free_names(node, self._free) & set().union(*self._bound)
        ):
            return self._name_for(node)
        if isinstance(node, COMPREHENSIONS):
            return self._visit_comprehension(node)
        return self.generic_visit(node)

    def _visit_comprehension(self, node: Comprehension) -> ast.expr:
        first = node.generators[0]
        first.iter = cast(ast.expr, self.visit(first.iter))  # once, in the enclosing scope
        self._bound.append(set[str]().union(*(_targets(g.target) for g in node.generators)))
        try:
            for gen in node.generators:
                if gen is not first:
                    gen.iter = cast(ast.expr, self.visit(gen.iter))
                gen.ifs = [cast(ast.expr, self.visit(test)) for test in gen.ifs]
            for part in ("elt", "key", "value"):
                if hasattr(node, part):
                    setattr(node, part, self.visit(getattr(node, part)))
        finally:
            self._bound.pop()
        return node

    def _name_for(self, node: ast.expr) -> ast.Name:
        key = ast.dump(node)
        name = self._names.get(key)
        if name is None:
            name = self._names[key] = f"{HOISTED}{len(self.hoisted)}"
            self.hoisted.append((name, copy.deepcopy(node)))
        return ast.Name(name, ast.Load())

    def compiled(self) -> tuple[tuple[str, ...], CodeType] | None:
        """The names, and one code object giving the tuple of their values (one evaluation
        per event, not one per name); None when nothing was hoisted."""
        if not self.hoisted:
            return None
        names, trees = zip(*self.hoisted)
        return names, compile_tree(ast.Tuple(list(trees), ast.Load()), f"hoisted:{self.label}")


def free_names(
    node: ast.AST, memo: dict[int, tuple[ast.AST, frozenset[str]]] | None = None
) -> frozenset[str]:
    """The names ``node`` reads from outside it (a comprehension's own variables excluded);
    ``memo`` spares recounting a subtree (it holds the node: its id stays the node's)."""
    memo = {} if memo is None else memo
    found = memo.get(id(node))
    if found is None:
        found = memo[id(node)] = (node, _free_names(node, memo))
    return found[1]


def _free_names(node: ast.AST, memo: dict[int, tuple[ast.AST, frozenset[str]]]) -> frozenset[str]:
    if isinstance(node, ast.Name):
        return frozenset({node.id})
    if isinstance(node, COMPREHENSIONS):
        first, *rest = node.generators
        bound = set[str]().union(*(_targets(g.target) for g in node.generators))
        inner = [g.iter for g in rest] + [t for g in node.generators for t in g.ifs]
        inner += [getattr(node, p) for p in ("elt", "key", "value") if hasattr(node, p)]
        return free_names(first.iter, memo) | (
            frozenset().union(*(free_names(n, memo) for n in inner)) - bound
        )
    return frozenset().union(*(free_names(child, memo) for child in ast.iter_child_nodes(node)))


def _targets(target: ast.expr) -> set[str]:
    return {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}


def _worth_hoisting(node: ast.AST) -> bool:
    # a generator is used up by its first reader: hoisted, every later element would see it
    # empty (its parts are hoisted instead; a call consuming it gives a value, and is)
    return isinstance(node, ast.expr) and not isinstance(
        node, (ast.Constant, ast.Name, ast.Starred, ast.Slice, ast.GeneratorExp)
    )


def fuse(shapes: Sequence[RuleShape]) -> list[ast.expr]:
    """One test per iterable: the rules ``for_each`` over the same expression share one
    loop, their variables renamed to ELEMENT (a rule's variable cannot be rebound inside
    it, and ELEMENT cannot be written in the language); the other rules as they are."""
    loops: dict[str, tuple[ast.expr, list[ast.expr]]] = {}
    tests: list[ast.expr] = []
    for shape in shapes:
        if shape.iterable is None or shape.var is None:
            tests.append(copy.deepcopy(shape.holds))  # the caller rewrites it in place
            continue
        holds = _Rename(shape.var).visit(copy.deepcopy(shape.holds))
        loops.setdefault(ast.dump(shape.iterable), (copy.deepcopy(shape.iterable), []))[1].append(
            holds
        )
    for iterable, holds in loops.values():
        body = holds[0] if len(holds) == 1 else ast.BoolOp(ast.And(), holds)
        gen = ast.comprehension(ast.Name(ELEMENT, ast.Store()), iterable, [], 0)
        tests.append(ast.Call(ast.Name("all", ast.Load()), [ast.GeneratorExp(body, [gen])], []))
    return tests


class _Rename(ast.NodeTransformer):
    def __init__(self, var: str) -> None:
        self.var = var

    def visit_Name(self, node: ast.Name) -> ast.Name:
        return ast.Name(ELEMENT, node.ctx) if node.id == self.var else node
