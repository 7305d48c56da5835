"""The explorer: many seeds, each a generated trace run under the strict catalog; failures
shrunk and written as replayable JSON traces; `sometimes` goals aggregated over the seeds.

Keeps: a seed's result depends on the seed and the step budget only (the trace is generated
from them and the run is deterministic), so worker processes change the speed, never the
output, and results are reported in seed order. A failure is named by a key — the first
violated invariant's id, ``error:<exception>`` for an engine crash, ``liveness`` for a drain
that did not reach idle — and shrinking keeps that key, so it cannot slide to another bug.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from engine.errors import ConfigError
from invariants.checking.loader import Catalog, shipped_catalog
from invariants.explore.coverage import SlotReuseObserver, coverage, goals_met
from invariants.explore.ddmin import SHRINK_BUDGET, shrink_counted
from invariants.explore.generate import generate_trace
from invariants.explore.parallel import map_in_order
from invariants.explore.swarm import sample_swarm
from invariants.scenarios.ops import Idle, Trace
from invariants.scenarios.trace_run import TraceOutcome, run_trace

DEFAULT_SEEDS = 200
DEFAULT_STEPS = 300
FAILURE_DIR = Path("explore-failures")
MAX_SHRUNK = 3  # distinct failure keys shrunk per run (each shrink re-runs the trace many times)
default_catalog = shipped_catalog  # the explorer's name for the catalog loaded once per process


def failure_key(outcome: TraceOutcome) -> str | None:
    """What failed: the first violated invariant, an engine crash, a drain short of idle."""
    if outcome.violations:
        return outcome.violations[0].invariant
    if outcome.error is not None:
        return "error:" + outcome.error.split(":", 1)[0]
    ops = outcome.trace.ops
    if any(r.status == "incomplete" and isinstance(ops[r.index], Idle) for r in outcome.results):
        return "liveness"
    return None


def check_trace(trace: Trace, catalog: Catalog | None = None) -> TraceOutcome:
    """Run ``trace`` at level 2: the run stops at the first violation."""
    return run_trace(trace, catalog or default_catalog(), stop_at_first=True)


def fails_like(key: str, catalog: Catalog | None = None) -> Callable[[Trace], bool]:
    """The shrink predicate: the trace still fails, with the same failure key."""
    return lambda trace: failure_key(check_trace(trace, catalog)) == key


@dataclass(frozen=True, slots=True)
class SeedResult:
    """One seed's run: its configuration, what failed (None: nothing), its goals."""

    seed: int
    label: str
    failure: str | None
    detail: str
    goals: frozenset[str]
    ops: int
    steps: int
    seconds: float


def run_seed(seed: int, steps: int) -> SeedResult:
    """Generate and run the trace of ``seed`` (module-level: worker processes call it)."""
    start = time.perf_counter()
    label = sample_swarm(seed).label
    trace = generate_trace(seed, steps)
    reuse = SlotReuseObserver()
    try:
        outcome = run_trace(trace, default_catalog(), stop_at_first=True, observers=[reuse])
    except ConfigError as exc:  # the swarm drew a configuration the engine refuses
        return SeedResult(seed, label, "config", str(exc), frozenset(), len(trace.ops), 0, 0.0)
    key = failure_key(outcome)
    detail = (
        "" if key is None else outcome.describe(1) or "drain did not reach idle within its budget"
    )
    return SeedResult(
        seed,
        label,
        key,
        detail,
        goals_met(outcome, reuse),
        len(trace.ops),
        outcome.steps,
        time.perf_counter() - start,
    )


@dataclass(frozen=True, slots=True)
class Finding:
    """A failing seed, shrunk: the trace written to ``path`` replays it."""

    seed: int
    key: str
    detail: str
    path: Path
    original_ops: int
    shrunk_ops: int
    shrink_runs: int


@dataclass(slots=True)
class ExploreReport:
    """A whole run: every seed's result in seed order, the shrunk findings, the coverage."""

    results: list[SeedResult] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def failed(self) -> list[SeedResult]:
        return [r for r in self.results if r.failure is not None]

    @property
    def coverage(self) -> dict[str, int]:
        return coverage(r.goals for r in self.results)

    @property
    def unmet(self) -> list[str]:
        return [goal for goal, n in self.coverage.items() if n == 0]


def explore(
    seeds: int = DEFAULT_SEEDS,
    steps: int = DEFAULT_STEPS,
    *,
    seed_start: int = 0,
    workers: int = 1,
    fail_fast: bool = False,
    out_dir: Path = FAILURE_DIR,
    max_shrunk: int = MAX_SHRUNK,
    shrink_budget: int = SHRINK_BUDGET,
) -> ExploreReport:
    """Run seeds ``seed_start …`` (``workers`` processes), then shrink the first failing
    seed of each distinct failure key (at most ``max_shrunk``) into ``out_dir``."""
    start = time.perf_counter()
    report = ExploreReport()
    for result in _results(range(seed_start, seed_start + seeds), steps, workers):
        report.results.append(result)
        if fail_fast and result.failure is not None:
            break
    keys: set[str] = set()
    for result in report.failed:
        if result.failure not in keys and len(keys) < max_shrunk and result.failure != "config":
            keys.add(result.failure)
            report.findings.append(shrink_seed(result, steps, out_dir, shrink_budget))
    report.seconds = time.perf_counter() - start
    return report


def _results(seeds: range, steps: int, workers: int) -> Iterator[SeedResult]:
    """Each seed's result, in seed order, on ``workers`` spawned processes."""
    return map_in_order(functools.partial(run_seed, steps=steps), seeds, workers)


def shrink_seed(
    result: SeedResult, steps: int, out_dir: Path, budget: int = SHRINK_BUDGET
) -> Finding:
    """Shrink the failing trace of ``result``'s seed and write it as ``seed-<n>.json``."""
    assert result.failure is not None
    trace = generate_trace(result.seed, steps)
    outcome = check_trace(trace)
    if outcome.stopped_at is not None and outcome.stopped_at < len(
        trace.ops
    ):  # later ops never ran
        trace = trace.with_ops(trace.ops[: outcome.stopped_at + 1])
    small, runs = shrink_counted(trace, fails_like(result.failure), budget=budget)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"seed-{result.seed}.json"
    small.model_copy(update={"name": f"explore-seed-{result.seed}-shrunk"}).save(path)
    return Finding(
        result.seed, result.failure, result.detail, path, result.ops, len(small.ops), runs
    )
