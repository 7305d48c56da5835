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

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from invariants.checking.loader import Catalog, shipped_catalog
from invariants.explore.campaign import Run, RunResult, failure_key, run_one
from invariants.explore.ddmin import shrink_counted
from invariants.explore.features import REQUIRED
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

    def record(self) -> dict[str, Any]:
        """The finding as a journal record (JSON)."""
        return {f.name: getattr(self, f.name) for f in fields(self)} | {"path": str(self.path)}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Finding:
        return cls(**(record | {"path": Path(record["path"])}))


@dataclass(slots=True)
class ExploreReport:
    """A whole campaign: every run's result in run order, the shrunk findings, the coverage."""

    results: list[RunResult] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    seconds: float = 0.0
    corpus: int = 0  # runs kept for reaching something new
    infra: list[str] = field(default_factory=list)  # runs no worker could finish, and why
    where: str = "this process"  # the fleet it ran on

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


def shrink_failing(arg: tuple[Trace, str, int]) -> tuple[Trace, int, int]:
    """A fleet task: the failing ``trace`` cut after its first violation and shrunk keeping
    its failure ``key`` (at most ``budget`` runs) → (small trace, runs, ops before)."""
    trace, key, budget = arg
    outcome = check_trace(trace)
    if outcome.stopped_at is not None and outcome.stopped_at < len(trace.ops):
        trace = trace.with_ops(trace.ops[: outcome.stopped_at + 1])  # later ops never ran
    small, runs = shrink_counted(trace, fails_like(key), budget=budget)
    return small, runs, len(trace.ops)


def run_task(arg: tuple[Run, int]) -> RunResult:
    """A fleet task: one campaign run (``run_one`` of (run, steps))."""
    return run_one(*arg)
