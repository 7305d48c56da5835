"""Loop-invariant code motion for the checker's fused test (``fastpath.py``): a
sub-expression inside a comprehension that reads no variable of an enclosing comprehension
has one value at every element, so it is evaluated once per event, before the test, into a
name the test reads (``_h0``, ``_h1`` …: the DSL forbids names starting with "_").

Keeps the fused test's answer: the language's expressions are pure (no assignment, no call
but the side-effect-free FUNCTIONS) and the environment does not change while one event is
checked, so an invariant sub-expression has the same value wherever and however often the
test would have evaluated it. Evaluating it up front may evaluate what a short circuit
would have skipped; if that raises, ``EventFastPath.all_pass`` answers "evaluate each rule",
which records what the rules record on their own — only slower.

Worth hoisting: anything but a constant or a bare name (whose lookup costs what the hoisted
name's does). The first iterable of a comprehension is evaluated once already (in the
enclosing scope) and is left where it is. tests/invariants/test_hoist.py.
"""

from __future__ import annotations

import ast
import copy
from functools import reduce
from types import CodeType

from invariants.dsl import compile_tree

HOISTED = "_h"
COMPREHENSIONS = (ast.GeneratorExp, ast.ListComp, ast.SetComp, ast.DictComp)


class Hoister(ast.NodeTransformer):
    """Replaces the maximal loop-invariant sub-expressions of the trees it visits by names;
    ``hoisted`` lists each name with its compiled expression, in first-seen order (an
    expression met twice gets one name)."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.hoisted: list[tuple[str, CodeType]] = []
        self._names: dict[str, str] = {}  # ast.dump of an expression -> its name
        self._bound: list[set[str]] = []  # the variables of the comprehensions around

    def visit(self, node: ast.AST) -> ast.AST:
        if self._bound and _worth_hoisting(node) and not free_names(node) & set().union(*self._bound):
            return self._name_for(node)  # type: ignore[arg-type]
        if isinstance(node, COMPREHENSIONS):
            return self._visit_comprehension(node)
        return self.generic_visit(node)

    def _visit_comprehension(self, node: ast.expr) -> ast.expr:
        first, *rest = node.generators  # type: ignore[attr-defined]
        first.iter = self.visit(first.iter)  # evaluated once, in the enclosing scope
        self._bound.append(reduce(set.union, (_targets(g.target) for g in node.generators), set()))  # type: ignore[attr-defined]
        try:
            for gen in node.generators:  # type: ignore[attr-defined]
                if gen is not first:
                    gen.iter = self.visit(gen.iter)
                gen.ifs = [self.visit(test) for test in gen.ifs]
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
            self.hoisted.append((name, compile_tree(copy.deepcopy(node), f"hoisted:{self.label}")))
        return ast.Name(name, ast.Load())


def free_names(node: ast.AST) -> set[str]:
    """The names ``node`` reads from outside it (a comprehension's own variables excluded)."""
    if isinstance(node, ast.Name):
        return {node.id}
    if isinstance(node, COMPREHENSIONS):
        first, *rest = node.generators
        bound = reduce(set.union, (_targets(g.target) for g in node.generators), set())
        inner = [g.iter for g in rest] + [t for g in node.generators for t in g.ifs]
        inner += [getattr(node, p) for p in ("elt", "key", "value") if hasattr(node, p)]
        return free_names(first.iter) | (set().union(*map(free_names, inner)) - bound)
    return set().union(*map(free_names, ast.iter_child_nodes(node)))


def _targets(target: ast.expr) -> set[str]:
    return {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}


def _worth_hoisting(node: ast.AST) -> bool:
    return isinstance(node, ast.expr) and not isinstance(node, (ast.Constant, ast.Name, ast.Starred, ast.Slice))
