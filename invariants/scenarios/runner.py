"""Runs a scenario spec: its workload as an op trace (scenario.py) through ``run_trace`` with the
spec's invariant set, then its ``expect`` goals and response oracles.

Keeps: the run is a pure function of the spec (one seed drives the trace and the engine),
so a failing cell replays exactly with `kvspec run SPEC`; nothing found is hidden — a
violation, an unmet goal, a failed oracle, a wait that ran out of steps and an engine error
each make ``ok`` false.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.hooks import Observer
from engine.sched.stats import SchedulerStats
from invariants.checking.checker import Level, Violation
from invariants.checking.loader import Catalog
from invariants.scenarios.ops import Trace
from invariants.scenarios.scenario import build_trace
from invariants.scenarios.scenario_oracles import check_oracles
from invariants.scenarios.spec import Spec
from invariants.scenarios.trace_run import TraceOutcome, run_trace


@dataclass(frozen=True, slots=True)
class SpecOutcome:
    """What one spec run did and found: the trace run (``trace_outcome``: violations tied to
    their ops, the responses, each op's result) plus what the spec itself asked for."""

    spec: Spec
    trace_outcome: TraceOutcome
    unmet: tuple[str, ...]  # expect goals that did not happen, failed oracles, incomplete waits
    oracle_failures: tuple[str, ...] = ()

    @property
    def trace(self) -> Trace:
        return self.trace_outcome.trace

    @property
    def stats(self) -> SchedulerStats:
        return self.trace_outcome.stats

    @property
    def violations(self) -> tuple[Violation, ...]:
        return tuple(v.violation for v in self.trace_outcome.violations)

    @property
    def checks(self) -> int:
        return self.trace_outcome.checks

    @property
    def seconds(self) -> float:
        return self.trace_outcome.seconds

    @property
    def error(self) -> str | None:
        """The engine raised: a finding too, never hidden."""
        return self.trace_outcome.error

    @property
    def ok(self) -> bool:
        return not self.violations and not self.unmet and self.error is None


def unmet_goals(spec: Spec, stats: SchedulerStats) -> list[str]:
    """The spec's ``expect`` goals the run's counters fall short of, as ``name >= n (got m)``."""
    return [
        f"{name} >= {least} (got {getattr(stats, name)})"
        for name, least in spec.expect.items()
        if getattr(stats, name) < least
    ]


def spec_catalog(spec: Spec, catalog: Catalog) -> Catalog:
    """The invariants the spec selects (``invariants:`` ids or globs; default all)."""
    if spec.invariants == ["*"]:
        return catalog
    return Catalog(tuple(r for r in catalog if spec.selects(r.id)), catalog.paths)


def run_spec(
    spec: Spec, catalog: Catalog, level: int = Level.RECORD, *, observers: Sequence[Observer] = ()
) -> SpecOutcome:
    """Run ``spec`` to idle with the checker after every event (level 2: stop at the first
    violation), then check its goals and oracles."""
    trace = build_trace(spec)
    out = run_trace(trace, spec_catalog(spec, catalog), level, observers=observers)
    goals = unmet_goals(spec, out.stats)
    waits = [
        f"op #{r.index} {trace.ops[r.index].op}: {r.detail}"
        for r in out.results
        if r.status == "incomplete"
    ]
    config = spec.engine.engine_config(spec.seed)
    oracles = (
        []
        if out.error
        else check_oracles(spec.oracles, out, config.max_req_len, spec.engine.eos_prob)
    )
    return SpecOutcome(spec, out, tuple(goals + waits + oracles), tuple(oracles))
