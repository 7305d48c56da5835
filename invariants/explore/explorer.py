"""The explorer: a coverage-guided campaign of runs (campaign.py) under the strict catalog;
failures shrunk and written as replayable JSON traces; what the runs reached reported — the
`sometimes` goals, the (event, feature) pairs and the engine's arcs.

Keeps: a run's result depends on its trace only and the campaign on (first seed, budget,
steps), so worker processes change the speed, never the output, and results are reported in
run order. A failure is named by a key — the first violated invariant's id (a crash is one:
``engine.*``), ``liveness`` for a drain that did not reach idle — and shrinking keeps that
key, so it cannot slide to another bug.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from invariants.checking.loader import Catalog, shipped_catalog
from invariants.explore.campaign import Campaign, Run, RunResult, failure_key, run_one
from invariants.explore.ddmin import SHRINK_BUDGET, shrink_counted
from invariants.explore.features import REQUIRED
from invariants.explore.parallel import spawn_pool
from invariants.scenarios.ops import Trace
from invariants.scenarios.trace_run import TraceOutcome, run_trace

DEFAULT_SEEDS = 200  # runs: half fresh seeds, half mutants of the runs that reached new ground
DEFAULT_STEPS = 300
FAILURE_DIR = Path("explore-failures")
MAX_SHRUNK = 3  # distinct failure keys shrunk per run (each shrink re-runs the trace many times)
default_catalog = shipped_catalog  # the explorer's name for the catalog loaded once per process


def check_trace(trace: Trace, catalog: Catalog | None = None) -> TraceOutcome:
    """Run ``trace`` at level 2: the run stops at the first violation."""
    return run_trace(trace, catalog or default_catalog(), stop_at_first=True)


def fails_like(key: str, catalog: Catalog | None = None) -> Callable[[Trace], bool]:
    """The shrink predicate: the trace still fails, with the same failure key."""
    return lambda trace: failure_key(check_trace(trace, catalog)) == key


def run_seed(seed: int, steps: int) -> RunResult:
    """The fresh run of ``seed`` (the campaign's first runs are these)."""
    return run_one(Run(0, seed), steps)


@dataclass(frozen=True, slots=True)
class Finding:
    """A failing run, shrunk: the trace written to ``path`` replays it."""

    seed: int
    key: str
    detail: str
    path: Path
    original_ops: int
    shrunk_ops: int
    shrink_runs: int
    name: str = ""


@dataclass(slots=True)
class ExploreReport:
    """A whole campaign: every run's result in run order, the shrunk findings, the coverage."""

    results: list[RunResult] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    seconds: float = 0.0
    corpus: int = 0  # runs kept for reaching something new

    @property
    def failed(self) -> list[RunResult]:
        return [r for r in self.results if r.failure is not None]

    @property
    def coverage(self) -> dict[str, int]:
        """Per required goal, how many runs met it (0: unmet)."""
        counts = dict.fromkeys(REQUIRED, 0)
        for result in self.results:
            for goal in result.goals:
                counts[goal] += 1
        return counts

    @property
    def unmet(self) -> list[str]:
        return [goal for goal, n in self.coverage.items() if n == 0]

    @property
    def features(self) -> frozenset[str]:
        return frozenset().union(*(r.features for r in self.results))

    @property
    def arcs(self) -> frozenset[str]:
        return frozenset().union(*(r.arcs for r in self.results))


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
    """Run a campaign of ``seeds`` runs from ``seed_start`` (``workers`` processes), then
    shrink the first failing run of each distinct failure key (at most ``max_shrunk``) into
    ``out_dir``."""
    start = time.perf_counter()
    campaign = Campaign(seeds, steps, seed_start)
    report = ExploreReport()
    for result in campaign_results(campaign, workers):
        report.results.append(result)
        if fail_fast and result.failure is not None:
            break
    keys: set[str] = set()
    for result in report.failed:
        if result.failure not in keys and len(keys) < max_shrunk and result.failure != "config":
            keys.add(result.failure)  # type: ignore[arg-type]
            trace = campaign.trace_of(result.index)
            report.findings.append(shrink_run(result, trace, out_dir, shrink_budget))
    report.corpus = len(campaign.corpus)
    report.seconds = time.perf_counter() - start
    return report


def campaign_results(campaign: Campaign, workers: int) -> Iterator[RunResult]:
    """Every run's result in run order, generation by generation (each generation's results
    taken into the campaign before the next is drawn), on one pool of ``workers``."""
    work = functools.partial(run_one, steps=campaign.steps)
    with ExitStack() as stack:
        pool = stack.enter_context(spawn_pool(workers)) if workers > 1 else None
        while not campaign.done:
            runs = campaign.next_generation()
            results = list(pool.map(work, runs) if pool is not None else map(work, runs))
            campaign.take(results)
            yield from results


def shrink_run(
    result: RunResult, trace: Trace, out_dir: Path, budget: int = SHRINK_BUDGET
) -> Finding:
    """Shrink the failing ``trace`` of ``result`` and write it as ``seed-<n>[-m<i>].json``."""
    assert result.failure is not None
    outcome = check_trace(trace)
    if outcome.stopped_at is not None and outcome.stopped_at < len(trace.ops):
        trace = trace.with_ops(trace.ops[: outcome.stopped_at + 1])  # later ops never ran
    small, runs = shrink_counted(trace, fails_like(result.failure), budget=budget)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = result.name.replace(" ", "-")
    path = out_dir / f"{stem}.json"
    small.model_copy(update={"name": f"explore-{stem}-shrunk"}).save(path)
    return Finding(
        result.seed,
        result.failure,
        result.detail,
        path,
        result.ops,
        len(small.ops),
        runs,
        result.name,
    )
