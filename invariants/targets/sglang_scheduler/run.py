"""A trace (or a spec's trace) on SGLang's real scheduler, every iteration checked by the same
catalog, and what SGLang's own checkers said of each iteration recorded beside it.

Keeps: two verdicts per iteration, never merged. kvspec's catalog sees SGLang's counters and
the exact census taken from SGLang's own objects; SGLang's checkers (its busy sum and page
invariants, its idle checks) are recorded as they speak. Where only one fires, that is a
finding in itself (``Disagreement``): SGLang fires while kvspec's census and sums hold → a
false-positive candidate in SGLang's checker; kvspec fires while SGLang is silent → a bug
SGLang cannot see. A release whose internals moved raises ``ShimDrift`` (never a finding);
a spec the real scheduler cannot express is ``unsupported`` before anything runs.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field, replace
from typing import Any

from invariants.checking.checker import Checker, InvariantViolation, Level, Violation
from invariants.checking.loader import Catalog
from invariants.scenarios.ops import Trace, op_label
from invariants.scenarios.runner import spec_catalog
from invariants.scenarios.scenario import build_trace
from invariants.scenarios.spec import Spec
from invariants.targets.sglang.run import unmet_goals
from invariants.targets.sglang_scheduler.target import SchedulerDriver
from invariants.targets.sglang_scheduler.trace import SchedulerTrace, config_op, unsupported
from invariants.targets.sglang.target import DriverError
from invariants.targets.sglang.views import to_state_view

DRAIN_STEPS = 200_000  # kvspec's runner's drain budget (scenarios/trace_run.py)
# spec ``expect`` counters (kvspec's SchedulerStats names) -> the driver's counts
GOALS = {
    "finished_reqs": "finished",
    "cached_tokens": "cached_tokens",
    "aborted_reqs": "aborted",
    "retracted_reqs": "retracted",
}


@dataclass(frozen=True, slots=True)
class SchedulerStats:
    """What the real scheduler did (SGLang's own outputs and calls, counted by the driver)."""

    iterations: int = 0
    submitted: int = 0
    finished: int = 0
    aborted: int = 0
    cached_tokens: int = 0
    forwards: int = 0
    retracted: int = 0


@dataclass(frozen=True, slots=True)
class SGLangFinding:
    """One message of SGLang's own checkers, at the iteration it was said."""

    iteration: int
    message: str


@dataclass(frozen=True, slots=True)
class Disagreement:
    """An iteration where only one side's checks fired."""

    iteration: int
    kind: str  # "sglang-only" | "kvspec-only"
    detail: str

    def __str__(self) -> str:
        meaning = {
            "sglang-only": "SGLang's checker fired, kvspec's census and sums held: "
            "a false-positive candidate in SGLang's checker",
            "kvspec-only": "kvspec fired, SGLang's checkers were silent: a bug SGLang cannot see",
        }[self.kind]
        return f"iteration {self.iteration}: {meaning} — {self.detail}"


@dataclass(frozen=True, slots=True)
class SchedulerOutcome:
    """One trace on one release: kvspec's violations, SGLang's findings, the op it stopped in."""

    trace: Trace
    version: str
    stats: SchedulerStats
    violations: tuple[Violation, ...]
    sglang: tuple[SGLangFinding, ...]
    checks: int
    seconds: float
    error: str | None = None
    stopped_at: int | None = None  # index of the op the first violation (or error) came in
    spec: Spec | None = None
    unsupported: tuple[str, ...] = ()
    unmet: tuple[str, ...] = ()  # spec goals short of their minimum (shown, not failed)
    waived: tuple[str, ...] = ()  # "id: why" of the invariants this release does not promise
    views: tuple[Any, ...] = field(default=(), repr=False)
    setup_seconds: float = 0.0  # of ``seconds``: building the release's Scheduler

    @property
    def ok(self) -> bool:
        """Nothing fired on either side, nothing crashed, and the trace ran."""
        return not (self.violations or self.sglang or self.error or self.unsupported)

    @property
    def iterations(self) -> int:
        return self.stats.iterations

    @property
    def engine_findings(self) -> tuple[SGLangFinding, ...]:
        """SGLang's own checkers' findings (the real-engine explorer's protocol)."""
        return self.sglang

    @property
    def disagreements(self) -> tuple[Disagreement, ...]:
        """Iterations where exactly one side fired (the first message of each side)."""
        ours: dict[int, str] = {}
        for violation in self.violations:
            ours.setdefault(violation.step, f"[{violation.invariant}] {violation.message}")
        theirs: dict[int, str] = {}
        for finding in self.sglang:
            theirs.setdefault(finding.iteration, finding.message)
        found = [Disagreement(i, "sglang-only", m) for i, m in theirs.items() if i not in ours]
        found += [Disagreement(i, "kvspec-only", m) for i, m in ours.items() if i not in theirs]
        return tuple(sorted(found, key=lambda d: d.iteration))

    @property
    def replay_op(self) -> str | None:
        """The op the run stopped in, as ``kvspec replay`` names it."""
        if self.stopped_at is None:
            return None
        if self.stopped_at == len(self.trace.ops):
            return "the drain after the last op"
        return f"op #{self.stopped_at} ({op_label(self.trace.ops[self.stopped_at])})"


def run_spec_on_scheduler(
    spec: Spec, catalog: Catalog, level: int = Level.STRICT, **kwargs: Any
) -> SchedulerOutcome:
    """``spec``'s trace (kvspec runner's own ``build_trace``) on the real scheduler, checked
    by the spec's invariant set."""
    outcome = run_trace_on_scheduler(
        build_trace(spec), spec_catalog(spec, catalog), level, **kwargs
    )
    return replace(outcome, spec=spec, unmet=unmet_goals(spec, outcome.stats, GOALS))


def run_trace_on_scheduler(
    trace: Trace,
    catalog: Catalog,
    level: int = Level.STRICT,
    *,
    version: str | None = None,
    python: str | None = None,
    driver: SchedulerDriver | None = None,
    keep_views: bool = False,
    observe: bool = True,
) -> SchedulerOutcome:
    """Config, every op, the drain, each iteration's views through the checker (level 2:
    stop at the first view with a violation, every invariant of that view evaluated — a real
    engine's first failing state is worth every name the catalog has for it). ``driver``: a
    running one (explore and history reuse one per release: each trace gets a fresh Scheduler
    in its own child), else a new one. ``observe`` False: the driver only steps (no view, no
    check of either side; the benchmark's baseline)."""
    missing = tuple(unsupported(trace, version or (driver.version if driver else None)))
    if missing:
        return SchedulerOutcome(
            trace, version or "", SchedulerStats(), (), (), 0, 0.0, unsupported=missing
        )
    start = time.perf_counter()
    with contextlib.ExitStack() as stack:
        live = driver or stack.enter_context(SchedulerDriver(version, python))
        checker = Checker(applicable(catalog, live), level=min(level, Level.RECORD))
        run = _Run(live, checker, keep_views, stop_at_first=level >= Level.STRICT)
        run.drive(trace, observe)
    return _outcome(trace, live, run, time.perf_counter() - start)


def _outcome(trace: Trace, live: SchedulerDriver, run: _Run, seconds: float) -> SchedulerOutcome:
    """A finished run as its outcome; the waivers shown are those the trace could meet (a
    ``spec.`` rule's only under speculation)."""
    checks = sum(s.evaluations for s in run.checker.stats().values())
    shown = {
        rid: why
        for rid, why in live.not_applicable.items()
        if trace.engine.speculative is not None or not rid.startswith("spec.")
    }
    return SchedulerOutcome(
        trace,
        live.version,
        run.stats,
        tuple(run.checker.violations),
        tuple(run.sglang),
        checks,
        seconds,
        run.error,
        run.stopped_at,
        views=tuple(run.kept),
        waived=tuple(f"{rid}: {why}" for rid, why in shown.items()),
        setup_seconds=run.setup_seconds,
    )


def applicable(catalog: Catalog, driver: SchedulerDriver) -> Catalog:
    """The catalog less the ids the release's design does not promise (its shim says why)."""
    waived = driver.not_applicable
    if not any(rule.id in waived for rule in catalog):
        return catalog
    return Catalog(tuple(r for r in catalog if r.id not in waived), catalog.paths)


class _Run:
    """One trace through one driver: the checker and SGLang's findings, op by op."""

    def __init__(
        self, driver: SchedulerDriver, checker: Checker, keep_views: bool, stop_at_first: bool
    ) -> None:
        self.driver, self.checker, self.keep_views = driver, checker, keep_views
        self.stop_at_first = stop_at_first
        self.sglang: list[SGLangFinding] = []
        self.kept: list[Any] = []
        self.error: str | None = None
        self.stopped_at: int | None = None
        self.stats = SchedulerStats()
        self.setup_seconds = 0.0

    def drive(self, trace: Trace, observe: bool = True) -> None:
        ops = SchedulerTrace(self.driver)
        self.ops = ops
        began = time.perf_counter()
        self.driver.send({**config_op(trace.engine, trace.seed), "observe": observe})
        self.setup_seconds = time.perf_counter() - began  # the fork and Scheduler.__init__
        try:
            for index, op in enumerate(trace.ops):
                self.stopped_at = index
                for answer in ops.apply(op):
                    self.check(answer)
            self.stopped_at = len(trace.ops)  # the drain after the last op, as kvspec's runner
            for answer in ops.drain(DRAIN_STEPS):
                self.check(answer)
            self.stopped_at = None
        except InvariantViolation:
            pass
        except DriverError as exc:  # SGLang's own crash included (SGLangCrash)
            self.error = f"{exc}"
        if self.driver.in_trace:
            self.stats = SchedulerStats(**self.driver.send({"op": "stats"})["result"])
            self.driver.end()
        else:  # the trace's child ended with SGLang's crash: what this side counted
            self.stats = SchedulerStats(iterations=ops.iterations)

    def check(self, answer: dict[str, Any]) -> None:
        views = [to_state_view(raw) for raw in answer["views"]]
        if views:
            self.sglang += [SGLangFinding(views[0].step, m) for m in answer.get("sglang", ())]
        for view in views:
            if self.keep_views:
                self.kept.append(view)
            if self.checker.check(view.event, view) and self.stop_at_first:
                raise InvariantViolation(self.checker.violations[0])
