"""The checker: evaluates the invariants subscribed to each engine event against a state view.

Keeps: docs/design.md decision 1 and 3 — the checker consumes state views only; level 0 costs
nothing, level 1 records every violation and goes on, level 2 raises at the first one.
A rule that raises is reported as kind "error", never as a crash of the checker.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import IntEnum
from time import perf_counter_ns
from typing import Any, Protocol

from engine.observe.crosscheck import cross_check, crosscheck_enabled
from engine.view import OPTIONAL_PARTS, SECTIONS, SELECTIVE, StateView
from invariants.checking.dsl import make_env
from invariants.checking.fastpath import EventFastPath, build_fast_path
from invariants.checking.memos import NodeMemo
from invariants.checking.rule import Fixture, Rule
from invariants.checking.schema import EVENTS

MAX_WITNESSES = 8


class Level(IntEnum):
    """How the checker reacts to a violation."""

    OFF = 0
    RECORD = 1
    STRICT = 2


@dataclass(frozen=True, slots=True)
class Violation:
    """One invariant that did not hold at one event (kind "error": the rule itself raised)."""

    invariant: str
    title: str
    event: str
    step: int
    message: str
    kind: str = "violation"  # violation | error
    witnesses: tuple[str, ...] = ()
    num_failing: int = 1
    origin: tuple[str, ...] = ()

    def __str__(self) -> str:
        return f"[{self.invariant}] step {self.step} ({self.event}): {self.message}"


@dataclass(frozen=True, slots=True)
class RuleStats:
    """Evaluation count and time of one invariant."""

    evaluations: int = 0
    total_ns: int = 0
    violations: int = 0
    errors: int = 0

    @property
    def mean_ns(self) -> float:
        return self.total_ns / self.evaluations if self.evaluations else 0.0


@dataclass(slots=True, eq=False)
class _Tally:
    """The mutable counters behind one RuleStats."""

    evaluations: int = 0
    total_ns: int = 0
    violations: int = 0
    errors: int = 0


class InvariantViolation(Exception):
    """Raised at level 2 at the first violation; `.violation` holds the record."""

    def __init__(self, violation: Violation) -> None:
        super().__init__(str(violation))
        self.violation = violation


def _view_parts(
    rules: tuple[Rule, ...], by_event: dict[str, tuple[Rule, ...]], tracks_prev: bool
) -> dict[str, frozenset[str]]:
    """Per event, the optional view parts and the sections its rules read."""
    # prev may be read at any later event, so transition rules want every part always,
    # and every section (a rule reading prev.reqs needs reqs in the view before)
    always = frozenset().union(*(r.attrs for r in rules if r.uses_prev))
    sections = SECTIONS if tracks_prev else frozenset()
    return {
        event: (OPTIONAL_PARTS & always.union(*(r.attrs for r in event_rules)))
        | {SELECTIVE}
        | (SECTIONS & sections.union(*(r.names for r in event_rules)))
        for event, event_rules in by_event.items()
    }


def _fast_paths(by_event: dict[str, tuple[Rule, ...]]) -> dict[str, EventFastPath]:
    """Per event with rules, the fast path of those not reading ``prev`` (when one is built).
    A rule's node memo is one across its events: what it last passed on, under which context
    values (``event`` among them where it reads it), holds whichever event it was checked at
    — so an idle view after step views re-tests the records changed since, not every one."""
    fast_paths: dict[str, EventFastPath] = {}
    memos: dict[str, NodeMemo] = {}
    for event, rules in by_event.items():
        fast = build_fast_path([r for r in rules if not r.uses_prev], event) if rules else None
        if fast is not None:
            fast.memos = {
                rule_id: memos.setdefault(rule_id, m) for rule_id, m in fast.memos.items()
            }
            fast_paths[event] = fast
    return fast_paths


class Checker:
    """Per-event invariant evaluation with `prev`, `for_steps` grace, records and stats."""

    def __init__(
        self,
        catalog: Iterable[Rule],
        level: int = Level.RECORD,
        max_records: int = 10_000,
        fast_path: bool = True,
    ) -> None:
        self.rules: tuple[Rule, ...] = tuple(catalog)
        self.level = Level(level)
        self.max_records = max_records  # bound memory on long runs with a persistent failure
        self.violations: list[Violation] = []
        self.dropped = 0
        self.prev: StateView | None = None
        self._by_event: dict[str, tuple[Rule, ...]] = {
            event: tuple(r for r in self.rules if event in r.events) for event in EVENTS
        }
        self._tracks_prev = any(r.uses_prev for r in self.rules)
        self._parts = _view_parts(self.rules, self._by_event, self._tracks_prev)
        # fast_path: one fused test per event, node rules over changed nodes (fastpath.py);
        # the rules reading prev are always evaluated on their own
        self._fast = _fast_paths(self._by_event) if fast_path else {}
        self.crosscheck = crosscheck_enabled()  # every fast pass re-proved rule by rule
        self._with_prev: dict[str, tuple[Rule, ...]] = {
            event: tuple(r for r in rules if r.uses_prev) for event, rules in self._by_event.items()
        }
        self._streak: dict[str, int] = {r.id: 0 for r in self.rules}
        self._tally: dict[str, _Tally] = {r.id: _Tally() for r in self.rules}

    def view_parts(self, event: str) -> frozenset[str]:
        """The optional view parts (census, tree nodes) and the sections (``SELECTIVE``:
        requests, pools, tree …) some rule at `event` reads."""
        return self._parts.get(event, OPTIONAL_PARTS)

    def wants(self, event: str) -> bool:
        """Whether a view for `event` is needed (skip building it otherwise)."""
        return self.level > Level.OFF and (bool(self._by_event.get(event)) or self._tracks_prev)

    def check(self, event: str, view: StateView) -> tuple[Violation, ...]:
        """Evaluate the rules subscribed to `event`; return this call's violations."""
        if self.level == Level.OFF:
            return ()
        if event not in self._by_event:
            raise ValueError(f"unknown checker event {event!r} (events: {', '.join(EVENTS)})")
        prev, self.prev = self.prev, view
        env = make_env(view, prev)
        found: list[Violation] = []
        fast = self._fast.get(event)
        rules = self._by_event[event]
        if fast is not None:
            start = perf_counter_ns()
            if fast.all_pass(env):
                fast.passes += 1
                fast.ns += perf_counter_ns() - start
                if self.crosscheck:
                    _cross_check_pass(rules, event, view, env)
                for rule_id in fast.graced:
                    self._streak[rule_id] = 0
                rules = self._with_prev[event]
        for rule in rules:
            if rule.uses_prev and prev is None:
                continue  # transition rules start at the second view
            violation = self._evaluate(rule, event, view, env, fast)
            if violation is not None:
                found.append(violation)
                self._record(violation)
        return tuple(found)

    def _evaluate(
        self,
        rule: Rule,
        event: str,
        view: StateView,
        env: dict[str, Any],
        fast: EventFastPath | None = None,
    ) -> Violation | None:
        tally = self._tally[rule.id]
        error: Exception | None = None
        start = perf_counter_ns()
        try:
            failing = rule.failing(env)
        except Exception as exc:  # a broken rule is a finding, not a checker crash
            failing, error = [], exc
        tally.evaluations += 1
        tally.total_ns += perf_counter_ns() - start
        memo = fast.memos.get(rule.id) if fast is not None else None
        if memo is not None:
            memo.record(env, error is None and not failing)
        if error is not None:
            tally.errors += 1
            return _error(rule, event, view, error)
        if not failing:
            self._streak[rule.id] = 0
            return None
        self._streak[rule.id] += 1
        if self._streak[rule.id] <= rule.for_steps:
            return None  # tolerated for `for_steps` consecutive evaluations
        tally.violations += 1
        return _violation(rule, event, view, env, failing)

    def _record(self, violation: Violation) -> None:
        if len(self.violations) < self.max_records:
            self.violations.append(violation)
        else:
            self.dropped += 1
        if self.level >= Level.STRICT:
            raise InvariantViolation(violation)

    def reset(self) -> None:
        """Forget the previous view, streaks and records (stats are kept)."""
        self.prev = None
        self.violations.clear()
        self.dropped = 0
        self._streak = dict.fromkeys(self._streak, 0)

    def stats(self) -> dict[str, RuleStats]:
        """Per-invariant evaluations, total time (ns), violations and errors; an event that
        the fast path passed counts one evaluation of each of its rules, sharing its time."""
        fast: dict[str, list[int]] = {rid: [0, 0] for rid in self._tally}
        for path in self._fast.values():
            share = path.ns // max(1, len(path.rule_ids))
            for rid in path.rule_ids:
                fast[rid][0] += path.passes
                fast[rid][1] += share
        return {
            rid: RuleStats(
                t.evaluations + fast[rid][0], t.total_ns + fast[rid][1], t.violations, t.errors
            )
            for rid, t in self._tally.items()
        }


def _cross_check_pass(
    rules: tuple[Rule, ...], event: str, view: StateView, env: dict[str, Any]
) -> None:
    """The fused test said every rule passes: each rule evaluated on its own must agree."""
    for rule in rules:
        if rule.uses_prev:
            continue  # never in the fused test
        try:
            failing = rule.failing(env)
            said = _violation(rule, event, view, env, failing).message if failing else ""
        except Exception as exc:
            said = f"raises {type(exc).__name__}: {exc}"
        if said:
            what = f"{rule.id} at {event}, step {view.step}"
            cross_check(what, "passes (fused test)", f"fails: {said}")


def _violation(
    rule: Rule, event: str, view: StateView, env: dict[str, Any], failing: list[Any]
) -> Violation:
    witnesses = tuple(rule.render(env, x) for x in failing[:MAX_WITNESSES]) if rule.var else ()
    message = witnesses[0] if witnesses else rule.render(env, failing[0])
    return Violation(
        rule.id,
        rule.title,
        event,
        view.step,
        message,
        "violation",
        witnesses,
        len(failing),
        rule.origin,
    )


def _error(rule: Rule, event: str, view: StateView, exc: Exception) -> Violation:
    message = f"rule raised {type(exc).__name__}: {exc}"
    return Violation(rule.id, rule.title, event, view.step, message, "error", (), 0, rule.origin)


def run_fixture(rules: Iterable[Rule], fixture: Fixture) -> list[Violation]:
    """Violations of `rules` on a fixture, repeated past the longest `for_steps` grace."""
    subject = tuple(rules)
    checker = Checker(subject, Level.RECORD)
    for _ in range(1 + max((r.for_steps for r in subject), default=0)):
        checker.prev = fixture.prev
        checker.check(fixture.event, fixture.view)
    return checker.violations


class ViewSource(Protocol):
    """What the hook needs from an engine: a state view for an event."""

    def state_view(self, event: str, parts: frozenset[str] = OPTIONAL_PARTS) -> StateView: ...


class CheckerHook:
    """The engine step hook (`on_event(event, engine)`) that feeds a Checker."""

    __slots__ = ("checker",)

    def __init__(self, checker: Checker) -> None:
        self.checker = checker

    def on_event(self, event: str, engine: ViewSource) -> None:
        if self.checker.wants(event):  # building a view is the expensive part
            self.checker.check(event, engine.state_view(event, self.checker.view_parts(event)))


def summarize(violations: Iterable[Violation]) -> Mapping[str, int]:
    """Violation count per invariant id (for reports)."""
    counts: dict[str, int] = {}
    for v in violations:
        counts[v.invariant] = counts.get(v.invariant, 0) + 1
    return counts


__all__ = [
    "Checker",
    "CheckerHook",
    "InvariantViolation",
    "Level",
    "RuleStats",
    "Violation",
    "run_fixture",
    "summarize",
]
