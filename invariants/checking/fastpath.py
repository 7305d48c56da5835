"""The checker's fast path: one evaluation that says "every rule at this event passes", with
the same answer as evaluating each rule in full.

Keeps the checker's results unchanged; only the cost of a passing event drops:

- **One fused test per event.** The pass conditions of the event's rules (``RuleShape``:
  ``all(not WHERE or EXPR for VAR in ITER)`` or ``EXPR``) are joined with ``and`` into one
  compiled expression, evaluated once in the same environment the rules see; the rules
  over the same iterable share one loop (``all(h1 and h2 … for _e in ITER)`` is
  ``all(h1 …) and all(h2 …) …``). Expressions of
  the language are pure (no assignment, no call but the side-effect-free FUNCTIONS), so the
  conjunction is true exactly when every rule passes. When it is false or raises, the
  checker evaluates every rule on its own, as before, and records what it finds — so a
  failing or broken rule is reported exactly as without the fast path. Inside its loops,
  what reads no loop variable is evaluated once per event (``fusion.py``).
- **Tree-node rules, node sums and node sets over the changed nodes only** (memos.py:
  ``NodeMemo``, ``TermMemo``). What a rule reads of ``tree.nodes`` node by node
  (the node and its context, nothing else) is decided from the nodes changed since the tuple
  it last saw; in every other case, over every node.
"""

from __future__ import annotations

import ast
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import CodeType
from typing import Any, cast

from invariants.checking.dsl import compile_tree
from invariants.checking.fusion import Hoister, fuse
from invariants.checking.memos import NodeMemo, SumTerms, TermMemo, node_memo
from invariants.checking.rule import Rule, RuleShape

MAX_BUILT = 64  # fast paths kept compiled (per rule objects and event)
_BUILT: dict[tuple[tuple[int, ...], str], tuple[tuple[Rule, ...], EventFastPath | None]] = {}
_BUILT_LOCK = threading.Lock()


@dataclass(slots=True, eq=False)
class EventFastPath:
    """The fused test of the rules at one event, the node memos it consults, and how often
    (and how long) it found that every rule passed."""

    fused: CodeType | None
    memos: dict[str, NodeMemo] = field(default_factory=dict)
    sums: tuple[TermMemo, ...] = ()  # the node sums and sets of the fused test
    rule_ids: tuple[str, ...] = ()
    graced: tuple[str, ...] = ()  # rules with a for_steps grace (their streak ends on a pass)
    hoisted: tuple[tuple[str, ...], CodeType] | None = None  # the fused test's loop invariants
    passes: int = 0
    ns: int = 0

    def fresh(self) -> EventFastPath:
        """A copy that shares the compiled code and starts with no memory of any view."""
        return EventFastPath(
            self.fused,
            {rule_id: m.fresh() for rule_id, m in self.memos.items()},
            tuple(m.fresh() for m in self.sums),
            self.rule_ids,
            self.graced,
            self.hoisted,
        )

    def all_pass(self, env: dict[str, Any]) -> bool:
        """True only if every rule of the event passes on ``env``; False means "evaluate
        each rule" (some rule fails or raises, or the memos cannot tell)."""
        try:
            for memo in self.sums:
                env[memo.name] = memo.value(env)
            if self.hoisted is not None:
                names, code = self.hoisted
                env.update(zip(names, eval(code, env)))
            if self.fused is not None and not eval(self.fused, env):
                return False
            return all(memo.passes(env) for memo in self.memos.values())
        except Exception:
            return False


def build_fast_path(rules: Sequence[Rule], label: str) -> EventFastPath | None:
    """The fast path of these rules (none of which reads ``prev``); None if some rule was
    built without its trees. Compiled once per rule objects and label (the last few kept:
    a checker is built per run), each caller getting its own fresh memos."""
    key = (tuple(map(id, rules)), label)
    with _BUILT_LOCK:  # checkers may be built from several threads
        built = _BUILT.pop(key, None)
        if built is None:
            built = (
                tuple(rules),
                _build_fast_path(rules, label),
            )  # the rules: their ids stay theirs
        _BUILT[key] = built
        while len(_BUILT) > MAX_BUILT:
            del _BUILT[next(iter(_BUILT))]  # the least recently used
    return None if built[1] is None else built[1].fresh()


def _build_fast_path(rules: Sequence[Rule], label: str) -> EventFastPath | None:
    memos: dict[str, NodeMemo] = {}
    plain: list[RuleShape] = []
    for rule in rules:
        if rule.shape is None:
            return None
        memo = node_memo(rule)
        if memo is not None:
            memos[rule.id] = memo
        else:
            plain.append(rule.shape)
    sums, hoister = SumTerms(label), Hoister(label)
    tests = [cast(ast.expr, hoister.visit(sums.visit(test))) for test in fuse(plain)]
    fused = None
    if tests:
        fused = compile_tree(
            tests[0] if len(tests) == 1 else ast.BoolOp(ast.And(), tests), f"fused:{label}"
        )
    return EventFastPath(
        fused,
        memos,
        tuple(sums.memos),
        tuple(r.id for r in rules),
        tuple(r.id for r in rules if r.for_steps),
        hoister.compiled(),
    )
