"""Loop-invariant code motion in the fused test (invariants/checking/fusion.py): what reads no
comprehension variable around it is evaluated once, under one name per distinct
expression; what reads one stays in the loop; and a hoisted expression that raises (where a
short circuit would have skipped it) only sends the event to the per-rule evaluation — the
records are those of a checker without the fast path."""

from __future__ import annotations

import ast
from pathlib import Path

from engine.view import ReqView, SchedView, StateView
from invariants.checking.checker import Checker, Level
from invariants.checking.fusion import Hoister, free_names
from invariants.checking.loader import load_catalog


def _hoist(source: str) -> tuple[str, list[str]]:
    hoister = Hoister("test")
    tree = hoister.visit(ast.parse(source, mode="eval").body)
    return ast.unparse(tree), [name for name, _ in hoister.hoisted]


def test_invariant_parts_of_a_loop_are_hoisted_once() -> None:
    """``sched.overlap`` and the set over sessions read no loop variable: each becomes one
    name (the same expression twice: one name); ``r.rid`` and the loop's iterable stay."""
    text, names = _hoist(
        "all(r.n <= (1 if sched.overlap else 0) and r.rid in {s.id for s in sessions}"
        " and r.m <= (1 if sched.overlap else 0) for r in reqs)"
    )
    assert names == ["_h0", "_h1"]
    assert text == "all((r.n <= _h0 and r.rid in _h1 and (r.m <= _h0) for r in reqs))"


def test_what_reads_a_loop_variable_stays() -> None:
    """An inner comprehension that reads the outer variable is not hoisted; its own
    invariant parts are; a bare name or constant is never worth a name."""
    text, names = _hoist(
        "all(len([q for q in reqs if q.row == r.row and q.n > sched.limit]) <= 1"
        " and r.n % page_size == 0 for r in reqs)"
    )
    assert names == ["_h0"]
    assert (
        text == "all((len([q for q in reqs if q.row == r.row and q.n > _h0]) <= 1 "
        "and r.n % page_size == 0 for r in reqs))"
    )


def test_outside_a_loop_nothing_moves() -> None:
    """At the top level an expression is evaluated once already."""
    assert _hoist("sched.a + sched.b == len(reqs)") == ("sched.a + sched.b == len(reqs)", [])


def test_free_names_exclude_a_comprehensions_own_variables() -> None:
    """The names an expression reads from outside: not those its comprehensions bind."""
    tree = ast.parse("[x.a + y for x in xs if x.b > z]", mode="eval").body
    assert free_names(tree) == {"xs", "y", "z"}


def test_a_hoisted_expression_that_raises_falls_back_to_the_rules(tmp_path: Path) -> None:
    """``sched.max_running_requests // 0`` is guarded by a short circuit in the rule (only
    for a request r3, and there is none), but the fast path evaluates it up front and it
    raises: the event is checked rule by rule, and the records (r2 fails, nothing raised)
    equal those of a checker without the fast path."""
    path = tmp_path / "cat.yaml"
    path.write_text(RAISING_RULE)
    rules = load_catalog([path]).rules
    view = StateView(
        event="step",
        sched=SchedView(max_running_requests=4),
        reqs=(ReqView(rid="r1", kv_committed_len=1), ReqView(rid="r2", kv_committed_len=9)),
    )
    fast, slow = Checker(rules, Level.RECORD), Checker(rules, Level.RECORD, fast_path=False)
    for checker in (fast, slow):
        checker.check("step", view)
    assert [(v.invariant, v.witnesses) for v in fast.violations] == [
        (v.invariant, v.witnesses) for v in slow.violations
    ]
    assert [v.witnesses for v in fast.violations] == [("req r2",)]
    assert fast._fast["step"].passes == 0


RAISING_RULE = """\
version: 1
invariants:
  - id: test.guarded
    title: A guarded expression that would raise
    when: [step]
    for_each: reqs as r
    expr: r.kv_committed_len < 5 or (r.rid == "r3" and sched.max_running_requests // 0 > 0)
    message: "req {r.rid}"
    fixtures:
      pass: {event: step, view: {reqs: [{rid: r1, kv_committed_len: 1}]}}
      fail:
        event: step
        view: {sched: {max_running_requests: 1}, reqs: [{rid: r2, kv_committed_len: 9}]}
"""


def test_a_generator_is_not_hoisted_alone() -> None:
    """A generator is used up by its first reader: ``r.x not in (q.y for q in reqs)`` keeps
    it in the loop (hoisted, every element after the first would find it empty)."""
    source = "all((r.x not in (q.y + k.z for q in reqs) for r in reqs))"
    assert _hoist(source) == ("all((r.x not in (q.y + _h0 for q in reqs) for r in reqs))", ["_h0"])


def _check_both(tmp_path: Path, text: str, event: str, view: StateView) -> tuple[list, list]:
    path = tmp_path / "cat.yaml"
    path.write_text(text)
    rules = load_catalog([path]).rules
    fast, slow = Checker(rules, Level.RECORD), Checker(rules, Level.RECORD, fast_path=False)
    for checker in (fast, slow):
        checker.check(event, view)
    return (
        [(v.invariant, v.witnesses) for v in fast.violations],
        [(v.invariant, v.witnesses) for v in slow.violations],
    )


def test_membership_in_a_generator_gives_the_rules_answer(tmp_path: Path) -> None:
    """r2's committed length is in the generator's values: the fast path records it too."""
    rule = RAISING_RULE.replace("test.guarded", "test.in_gen").replace(
        'r.kv_committed_len < 5 or (r.rid == "r3" and sched.max_running_requests // 0 > 0)',
        "r.kv_committed_len not in (q.kv_committed_len + 8 for q in reqs)",
    )
    view = StateView(
        event="step",
        reqs=(ReqView(rid="r1", kv_committed_len=1), ReqView(rid="r2", kv_committed_len=9)),
    )
    fast, slow = _check_both(tmp_path, rule, "step", view)
    assert fast == slow == [("test.in_gen", ("req r2",))]


def test_a_rules_own_trees_are_not_rewritten(tmp_path: Path) -> None:
    """Building the fused tests of two events leaves each rule's iterable as written (a
    rewritten one would name another event's hoisted value), and both events give the
    rules' records."""
    rule = (
        RAISING_RULE.replace("test.guarded", "test.filtered")
        .replace("when: [step]", "when: [schedule, step]")
        .replace(
            "for_each: reqs as r",
            'for_each: "[q for q in reqs if q.kv_committed_len > sched.max_running_requests] as r"',
        )
    )
    path = tmp_path / "cat.yaml"
    path.write_text(rule)
    rules = load_catalog([path]).rules
    before = [ast.unparse(r.shape.iterable) for r in rules]
    fast, slow = Checker(rules, Level.RECORD), Checker(rules, Level.RECORD, fast_path=False)
    view = StateView(
        event="step",
        sched=SchedView(max_running_requests=4),
        reqs=(ReqView(rid="r1", kv_committed_len=1), ReqView(rid="r2", kv_committed_len=9)),
    )
    for event in ("schedule", "step"):
        for checker in (fast, slow):
            checker.check(event, view)
    assert [(v.event, v.witnesses) for v in fast.violations] == [
        (v.event, v.witnesses) for v in slow.violations
    ]
    assert len(slow.violations) == 2 and [ast.unparse(r.shape.iterable) for r in rules] == before
