"""Runs one zoo entry: the trigger clean, then under its mutant (or, for a checker bug, with
the pre-fix rules beside the catalog), and says which invariant caught it, where, how fast,
and how short the shrunk reproducer is.

Keeps: a catch counts only when the trigger is clean without the mutant, a ``.yaml``
trigger meets its ``expect`` goals there (otherwise the catch means nothing), and an
expected invariant fires at the first violating event; a false-positive entry counts only
when the old rules fire and the catalog stays silent on the same views; a
planted entry counts only when the fixed state is clean and the bug's state is caught. There
is no passing status other than "caught".
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from invariants.checking.checker import Checker, CheckerHook, Level, Violation
from invariants.checking.loader import Catalog, load_catalog
from invariants.mutants.base import Entry, FalsePositive, Mutant, Planted, PlantedViews
from invariants.scenarios.ops import Trace
from invariants.scenarios.runner import unmet_goals
from invariants.scenarios.scenario import build_trace
from invariants.scenarios.spec import load_spec
from invariants.scenarios.trace_run import TraceOutcome, run_trace

Shrinker = Callable[[Trace, Callable[[Trace], bool]], Trace]


@dataclass(frozen=True, slots=True)
class Finding:
    """What one entry's hunt found (``caught_by``: the invariants of the first violating
    event; for a false positive, the old rules that fired)."""

    entry: Entry
    status: (
        str  # caught | missed | unexpected | false-positive-fired | dirty-trigger | weak-trigger
    )
    caught_by: tuple[str, ...] = ()
    event: str = ""
    step: int = -1
    seconds: float = 0.0
    trace_ops: int = 0
    shrunk_ops: int | None = None
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "caught"


def load_trigger(path: Path) -> Trace:
    """A trigger as an op trace: ``.json`` is one already, ``.yaml`` a scenario spec whose
    workload becomes the same ops ``run_spec`` runs."""
    if path.suffix == ".json":
        return Trace.load(path)
    return build_trace(load_spec(path))


def trigger_goals(path: Path, clean: TraceOutcome) -> list[str]:
    """The ``expect`` goals of a ``.yaml`` trigger that its clean run fell short of (a
    ``.json`` trace has none): a trigger that never reaches its scenario proves nothing."""
    return [] if path.suffix == ".json" else unmet_goals(load_spec(path), clean.stats)


def weak_trigger(
    entry: Mutant | FalsePositive, trace: Trace, clean: TraceOutcome
) -> Finding | None:
    """A failing row when the clean run missed the trigger's goals; None when it met them."""
    unmet = trigger_goals(entry.trigger_path, clean)
    if not unmet:
        return None
    return Finding(
        entry,
        "weak-trigger",
        trace_ops=len(trace.ops),
        detail="the clean run missed the trigger's expect: " + "; ".join(unmet),
    )


def first_event(outcome: TraceOutcome) -> tuple[tuple[str, ...], str, int]:
    """The invariants that fired at the first violating (step, event), in catalog order."""
    first = outcome.first_violation
    if first is None:
        return (), "", -1
    same = [
        v.invariant for v in outcome.violations if (v.step, v.event) == (first.step, first.event)
    ]
    return tuple(dict.fromkeys(same)), first.event, first.step


def fires(entry: Mutant, catalog: Catalog, invariant: str) -> Callable[[Trace], bool]:
    """The shrink predicate: under the mutant, ``invariant`` (the one that caught it) fires."""

    def predicate(trace: Trace) -> bool:
        with entry.patch():
            outcome = run_trace(trace, catalog)
        return any(v.invariant == invariant for v in outcome.violations)

    return predicate


def run_rules(entry: Mutant | Planted, catalog: Catalog) -> Catalog:
    """The rules an entry runs under: the catalog less ``catalog_off``, plus probe rules."""
    kept = tuple(r for r in catalog if r.id not in entry.catalog_off)
    probe = entry.probe_rules_path if isinstance(entry, Mutant) else None
    return Catalog(kept + (tuple(load_catalog([probe])) if probe is not None else ()))


def hunt(entry: Entry, catalog: Catalog | None = None, shrinker: Shrinker | None = None) -> Finding:
    """Run ``entry`` (shrinking the reproducer with ``shrinker`` when given)."""
    catalog = catalog if catalog is not None else load_catalog()
    if isinstance(entry, Planted):
        return _hunt_planted(entry, catalog)
    trace = load_trigger(entry.trigger_path)
    if isinstance(entry, FalsePositive):
        return _hunt_false_positive(entry, catalog, trace)
    rules = run_rules(entry, catalog)
    clean = run_trace(trace, rules)
    if not clean.ok:
        return Finding(entry, "dirty-trigger", trace_ops=len(trace.ops), detail=clean.describe(3))
    weak = weak_trigger(entry, trace, clean)
    if weak is not None:
        return weak
    start = time.perf_counter()
    with entry.patch():
        outcome = run_trace(trace, rules)
    seconds = time.perf_counter() - start
    caught_by, event, step = first_event(outcome)
    status = (
        "caught" if set(caught_by) & entry.expect else ("unexpected" if caught_by else "missed")
    )
    shrunk = None
    if status == "caught" and shrinker is not None:
        caught = next(i for i in caught_by if i in entry.expect)
        shrunk = len(shrinker(trace, fires(entry, rules, caught)).ops)
    detail = outcome.describe(1) if caught_by else (outcome.error or "no invariant fired")
    return Finding(entry, status, caught_by, event, step, seconds, len(trace.ops), shrunk, detail)


def check_views(views: PlantedViews, catalog: Catalog) -> tuple[Violation, ...]:
    """The violations of the first (event, view) pair that has any (empty: all clean)."""
    checker = Checker(catalog, Level.RECORD)
    for event, view in views:
        found = checker.check(event, view)
        if found:
            return found
    return ()


def _hunt_planted(entry: Planted, catalog: Catalog) -> Finding:
    """The fixed state must be clean; the bug's state must be caught by ``expect``."""
    catalog = run_rules(entry, catalog)
    clean = check_views(entry.plant(False), catalog)
    if clean:
        return Finding(
            entry,
            "dirty-trigger",
            tuple(dict.fromkeys(v.invariant for v in clean)),
            detail=f"the fixed state is not clean: {clean[0]}",
        )
    start = time.perf_counter()
    found = check_views(entry.plant(True), catalog)
    seconds = time.perf_counter() - start
    caught_by = tuple(dict.fromkeys(v.invariant for v in found))
    status = (
        "caught" if set(caught_by) & entry.expect else ("unexpected" if caught_by else "missed")
    )
    first = found[0] if found else None
    detail = (
        f"{first} (planted: {entry.why})"
        if first
        else f"no invariant fired on the planted state ({entry.why})"
    )
    return Finding(
        entry,
        status,
        caught_by,
        first.event if first else "",
        first.step if first else -1,
        seconds,
        0,
        None,
        detail,
    )


def _hunt_false_positive(entry: FalsePositive, catalog: Catalog, trace: Trace) -> Finding:
    """One run of the correct engine; the old rules watch the same views as the catalog."""
    old = Checker(load_catalog([entry.old_rules_path]), Level.RECORD)
    start = time.perf_counter()
    outcome = run_trace(trace, catalog, observers=[CheckerHook(old)])
    seconds = time.perf_counter() - start
    fired = tuple(dict.fromkeys(v.invariant for v in old.violations))
    first = old.violations[0] if old.violations else None
    if not outcome.ok:
        return Finding(
            entry,
            "false-positive-fired",
            fired,
            seconds=seconds,
            trace_ops=len(trace.ops),
            detail=f"the shipped catalog fired on correct code: {outcome.describe(2)}",
        )
    weak = weak_trigger(entry, trace, outcome)
    if weak is not None:
        return weak
    status = "caught" if set(fired) & entry.expect else "missed"
    detail = (
        str(first)
        if first is not None
        else "the old formula did not fire: the trigger is not the scenario"
    )
    return Finding(
        entry,
        status,
        fired,
        first.event if first else "",
        first.step if first else -1,
        seconds,
        len(trace.ops),
        None,
        detail,
    )


__all__ = [
    "Finding",
    "check_views",
    "fires",
    "first_event",
    "hunt",
    "load_trigger",
    "run_rules",
    "trigger_goals",
]
