"""The checker: levels, per-event subscription, prev, for_steps grace, witnesses, stats, errors."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from engine.view import PoolView, ReqView, StateView
from invariants.checking.checker import Checker, CheckerHook, InvariantViolation, Level, Violation
from invariants.checking.rule import Rule

MakeRule = Callable[..., Rule]


def view(step: int = 0, free: int = 4, reqs: tuple[ReqView, ...] = ()) -> StateView:
    return StateView(step=step, pools=(PoolView(name="full", capacity=4, free=free),), reqs=reqs)


@pytest.fixture
def sum_rule(make_rule: MakeRule) -> Rule:
    return make_rule(
        "p.free == p.capacity",
        id="t.sum",
        for_each="pools as p",
        message="{p.name}: free={p.free}",
        when=["step", "idle"],
    )


def test_level_off_does_nothing(sum_rule: Rule) -> None:
    """Level 0: check returns at once — no evaluation, no record, no raise."""
    checker = Checker([sum_rule], Level.OFF)
    assert checker.check("step", view(free=0)) == ()
    assert checker.violations == [] and checker.stats()["t.sum"].evaluations == 0
    assert not checker.wants("step")


def test_level_record_keeps_going(sum_rule: Rule) -> None:
    """Level 1: every violation is recorded and checking continues."""
    checker = Checker([sum_rule], Level.RECORD)
    checker.check("step", view(step=1, free=0))
    checker.check("step", view(step=2, free=4))
    checker.check("idle", view(step=3, free=1))
    assert [(v.invariant, v.step, v.event, v.message) for v in checker.violations] == [
        ("t.sum", 1, "step", "full: free=0"),
        ("t.sum", 3, "idle", "full: free=1"),
    ]


def test_level_strict_raises_at_first_violation(sum_rule: Rule, make_rule: MakeRule) -> None:
    """Level 2: InvariantViolation at the first violation, carrying the record."""
    later = make_rule("False", id="t.later")
    checker = Checker([sum_rule, later], Level.STRICT)
    with pytest.raises(InvariantViolation) as err:
        checker.check("step", view(step=5, free=0))
    assert err.value.violation.invariant == "t.sum"
    assert str(err.value) == "[t.sum] step 5 (step): full: free=0"
    assert checker.stats()["t.later"].evaluations == 0


def test_only_subscribed_rules_run(make_rule: MakeRule) -> None:
    """A rule runs only at the events in its `when`."""
    idle_only = make_rule("False", id="t.idle", when=["idle"])
    checker = Checker([idle_only])
    assert checker.check("step", view()) == ()
    assert [v.invariant for v in checker.check("idle", view())] == ["t.idle"]
    assert checker.wants("idle") and not checker.wants("step")


def test_unknown_event_is_an_error(sum_rule: Rule) -> None:
    """A misspelt event name fails loudly instead of silently checking nothing."""
    with pytest.raises(ValueError, match="unknown checker event 'stepp'"):
        Checker([sum_rule]).check("stepp", view())


def test_for_steps_tolerates_n_consecutive_failures(make_rule: MakeRule) -> None:
    """for_steps: N reports only from the (N+1)-th consecutive failure; a pass resets the count."""
    rule = make_rule("p.free == p.capacity", id="t.grace", for_each="pools as p", for_steps=2)
    checker = Checker([rule])
    outcomes = [
        bool(checker.check("step", view(step=i, free=free)))
        for i, free in enumerate([0, 0, 4, 0, 0, 0, 0])
    ]
    assert outcomes == [False, False, False, False, False, True, True]


def test_prev_rules_start_at_the_second_view(make_rule: MakeRule) -> None:
    """`prev` is the previous view passed to check(); rules reading it skip the first view."""
    rule = make_rule(
        "all(q.kv_committed_len <= r.kv_committed_len for q in prev.reqs if q.rid == r.rid)",
        id="t.monotone",
        for_each="reqs as r",
        message="{r.rid} shrank",
    )
    checker = Checker([rule])
    assert checker.check("step", view(reqs=(ReqView(rid="a", kv_committed_len=9),))) == ()
    assert checker.stats()["t.monotone"].evaluations == 0
    assert checker.check("idle", view(reqs=(ReqView(rid="a", kv_committed_len=12),))) == ()
    found = checker.check("step", view(reqs=(ReqView(rid="a", kv_committed_len=3),)))
    assert [v.message for v in found] == ["a shrank"]


def test_witnesses_are_first_eight_failing_elements(make_rule: MakeRule) -> None:
    """A for_each violation carries up to 8 rendered witnesses and the count of failures."""
    rule = make_rule(
        "r.kv_committed_len <= r.kv_allocated_len",
        id="t.le",
        for_each="reqs as r",
        where="r.rid != 'skip'",
        message="{r.rid}: {r.kv_committed_len}",
    )
    reqs = tuple(ReqView(rid=f"r{i}", kv_committed_len=i + 1) for i in range(10))
    (found,) = Checker([rule]).check(
        "step", view(reqs=(ReqView(rid="skip", kv_committed_len=5),) + reqs)
    )
    assert found.num_failing == 10 and found.kind == "violation"
    assert found.witnesses == tuple(f"r{i}: {i + 1}" for i in range(8))
    assert found.message == "r0: 1"


def test_scalar_rule_message_uses_view(make_rule: MakeRule) -> None:
    """A rule without for_each renders its message against the whole view, no witnesses."""
    rule = make_rule("len(reqs) < 2", id="t.few", message="{len(reqs)} requests at step {step}")
    (found,) = Checker([rule]).check("step", view(step=4, reqs=(ReqView(), ReqView())))
    assert (found.message, found.witnesses, found.num_failing) == ("2 requests at step 4", (), 1)


def test_rule_that_raises_is_an_error_kind(make_rule: MakeRule, sum_rule: Rule) -> None:
    """A rule raising at evaluation yields kind 'error'; the checker goes on with other rules."""
    broken = make_rule("step // (len(reqs) - len(reqs)) == 0", id="t.broken")
    checker = Checker([broken, sum_rule])
    found = checker.check("step", view(free=0))
    assert [(v.invariant, v.kind) for v in found] == [("t.broken", "error"), ("t.sum", "violation")]
    assert found[0].message.startswith("rule raised ZeroDivisionError")
    assert checker.stats()["t.broken"].errors == 1
    with pytest.raises(InvariantViolation, match=r"t\.broken"):
        Checker([broken], Level.STRICT).check("step", view())


def test_stats_count_evaluations_and_time(sum_rule: Rule, make_rule: MakeRule) -> None:
    """stats() counts evaluations, violations and nanoseconds per invariant."""
    other = make_rule("True", id="t.true", when=["idle"])
    checker = Checker([sum_rule, other])
    for free in (4, 0, 4):
        checker.check("step", view(free=free))
    checker.check("idle", view())
    stats = checker.stats()
    assert (stats["t.sum"].evaluations, stats["t.sum"].violations) == (4, 1)
    assert stats["t.true"].evaluations == 1
    assert stats["t.sum"].total_ns > 0 and stats["t.sum"].mean_ns == stats["t.sum"].total_ns / 4


def test_records_are_bounded(sum_rule: Rule) -> None:
    """Past max_records the checker counts dropped violations instead of growing."""
    checker = Checker([sum_rule], max_records=2)
    for _ in range(5):
        checker.check("step", view(free=0))
    assert (len(checker.violations), checker.dropped) == (2, 3)
    checker.reset()
    assert (checker.violations, checker.dropped, checker.prev) == ([], 0, None)


def test_violation_is_frozen() -> None:
    """Violation records are immutable."""
    record = Violation("t.x", "title", "step", 1, "msg")
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.step = 2


class FakeEngine:
    """Counts the state views it is asked for."""

    def __init__(self, free: int) -> None:
        self.free = free
        self.built: list[str] = []

    def state_view(self, event: str, parts: frozenset[str] = frozenset()) -> StateView:
        self.built.append(event)
        return dataclasses.replace(view(free=self.free), event=event)


def test_hook_checks_engine_views(sum_rule: Rule) -> None:
    """CheckerHook.on_event builds the engine's view and checks it; no view for unwatched events."""
    engine = FakeEngine(free=0)
    hook = CheckerHook(Checker([sum_rule]))
    for event in ("schedule", "step", "idle"):
        hook.on_event(event, engine)
    assert engine.built == ["step", "idle"]
    assert [v.event for v in hook.checker.violations] == ["step", "idle"]


def test_hook_at_level_off_builds_nothing(sum_rule: Rule) -> None:
    """At level 0 the hook never asks the engine for a view."""
    engine = FakeEngine(free=0)
    CheckerHook(Checker([sum_rule], Level.OFF)).on_event("step", engine)
    assert engine.built == []
