"""The coverage-guided campaign behind `kvspec explore`: fresh seeds first (each a swarm
configuration and its generated trace), then generations of mutants of the runs that reached
something new — an (event, feature) pair (features.py) or an engine arc (branches.py) no
earlier run had — until the budget of runs is spent.

Keeps: the campaign is a pure function of (first seed, budget, steps): generation ``g``'s
mutants are drawn from ``default_rng([first seed, g])`` over the corpus as it stood after
every earlier run, and results are taken in run order, so worker processes change the speed,
never the runs; a run's result depends on its trace alone (run_one), and every mutant's trace
is kept so a failing one is shrunk and replayed like a seed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from engine.errors import ConfigError
from engine.hooks import Observer
from invariants.checking.loader import shipped_catalog
from invariants.explore.branches import BranchMeter
from invariants.explore.features import FeatureProbe, goals_of, outcome_features
from invariants.explore.generate import generate_trace
from invariants.explore.mutate import mutate
from invariants.explore.swarm import sample_swarm
from invariants.scenarios.ops import Idle, Trace
from invariants.scenarios.trace_run import TraceOutcome, run_trace

FRESH_SHARE = 0.5  # of the budget: fresh seeds before the first mutant
GENERATION = 16  # runs issued together (mutants of the corpus as it stood before them)
FEATURE_WEIGHT = 8  # a new (event, feature) pair counts as this many new engine arcs


@dataclass(frozen=True, slots=True)
class Run:
    """One run of the campaign: a fresh seed (``trace`` None: generated in the worker) or a
    mutant of a kept run (``trace`` set); ``seed`` is the seed its lineage started from."""

    index: int
    seed: int
    trace: Trace | None = None

    @property
    def name(self) -> str:
        return f"seed {self.seed}" if self.trace is None else f"seed {self.seed} m{self.index}"


@dataclass(frozen=True, slots=True)
class RunResult:
    """What one run did: its failure key (None: clean), what it reached, how long it took."""

    index: int
    seed: int
    name: str
    label: str
    failure: str | None
    detail: str
    features: frozenset[str]
    arcs: frozenset[str]
    ops: int
    steps: int
    seconds: float

    @property
    def goals(self) -> frozenset[str]:
        return goals_of(self.features)

    def record(self) -> dict[str, Any]:
        """The result as a journal record (JSON)."""
        record = {f.name: getattr(self, f.name) for f in fields(self)}
        return record | {"features": sorted(self.features), "arcs": sorted(self.arcs)}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> RunResult:
        sets = {"features": frozenset(record["features"]), "arcs": frozenset(record["arcs"])}
        return cls(**(record | sets))


def failure_key(outcome: TraceOutcome) -> str | None:
    """What failed: the first violated invariant (a crash is one: engine.*), a drain short
    of idle (``liveness``)."""
    if outcome.violations:
        return outcome.violations[0].invariant
    if outcome.error is not None:
        return "error:" + outcome.error.split(":", 1)[0]
    ops = outcome.trace.ops
    if any(r.status == "incomplete" and isinstance(ops[r.index], Idle) for r in outcome.results):
        return "liveness"
    return None


def run_one(run: Run, steps: int, observers: Sequence[Observer] = ()) -> RunResult:
    """Run one campaign run at level 2 (module-level: worker processes call it);
    ``observers`` watch beside the checker (the gate's pre-fix rules)."""
    start = time.perf_counter()
    trace = run.trace if run.trace is not None else generate_trace(run.seed, steps)
    label = _label(trace, run)
    probe, meter = FeatureProbe(), BranchMeter()
    try:
        outcome = run_trace(
            trace,
            shipped_catalog(),
            stop_at_first=True,
            observers=[probe, *observers],
            before_op=_metering(meter, trace),
        )
        arcs = meter.arcs()
    except ConfigError as exc:  # a configuration the engine refuses
        refused = (frozenset[str](), frozenset[str](), len(trace.ops), 0, 0.0)
        return RunResult(run.index, run.seed, run.name, label, "config", str(exc), *refused)
    key = failure_key(outcome)
    detail = "" if key is None else outcome.describe(1) or "drain did not reach idle"
    features = frozenset(probe.features | outcome_features(outcome))
    took = (len(trace.ops), outcome.steps, time.perf_counter() - start)
    return RunResult(run.index, run.seed, run.name, label, key, detail, features, arcs, *took)


def _metering(meter: BranchMeter, trace: Trace) -> Callable[[int], None]:
    """The hook that runs the branch tracer over the ops before the drain only."""
    drain = next((i for i, op in enumerate(trace.ops) if isinstance(op, Idle)), len(trace.ops))

    def until_drain(index: int) -> None:
        if index == 0 and drain > 0:
            meter.start()
        elif index >= drain:
            meter.stop()

    return until_drain


def _label(trace: Trace, run: Run) -> str:
    e, base = trace.engine, sample_swarm(run.seed).label
    if run.trace is None:
        return base
    return f"ps{e.page_size} {e.cache} pool{e.max_total_tokens} mutant of [{base}]"


@dataclass(slots=True, eq=False)
class Entry:
    """A kept run: its trace, how much it added when it ran, how often it was mutated."""

    trace: Trace
    seed: int
    added: int
    picks: int = 0


@dataclass(slots=True)
class Campaign:
    """The schedule of runs (``next_generation``) and the corpus it grows (``take``)."""

    budget: int
    steps: int
    seed_start: int = 0
    fresh: int = 0  # 0: FRESH_SHARE of the budget
    batch: int = GENERATION
    issued: int = 0
    corpus: list[Entry] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)
    runs: dict[int, Run] = field(default_factory=dict)
    generation: int = 0

    def __post_init__(self) -> None:
        self.fresh = self.fresh or max(1, int(self.budget * FRESH_SHARE))

    @property
    def done(self) -> bool:
        return self.issued >= self.budget

    def next_one(self) -> Run:
        """One run, drawn from the corpus as it stands now (the streamed mode: no barrier;
        the campaign then depends on the order results arrived in)."""
        return self._next_run(np.random.default_rng([self.seed_start, self.issued, 1]))

    def next_generation(self) -> list[Run]:
        """The next runs (fresh seeds, then mutants); call after taking every earlier result."""
        count = min(self.batch, self.budget - self.issued)
        rng = np.random.default_rng([self.seed_start, self.generation])
        runs = [self._next_run(rng) for _ in range(count)]
        self.generation += 1
        return runs

    def _next_run(self, rng: np.random.Generator) -> Run:
        index = self.issued
        self.issued += 1
        if index < self.fresh or not self.corpus:
            run = Run(index, self.seed_start + index)
        else:
            parent = self._pick(rng)
            donors = [e.trace for e in self.corpus]
            mutant = mutate(parent.trace, rng, donors, f"m{index}", self.steps)
            run = Run(index, parent.seed, mutant)
        self.runs[index] = run
        return run

    def _pick(self, rng: np.random.Generator) -> Entry:
        """A kept run, the more likely the more it added and the less it was mutated."""
        energy = np.array([(1 + e.added) / (1 + e.picks) for e in self.corpus], dtype=float)
        entry = self.corpus[int(rng.choice(len(self.corpus), p=energy / energy.sum()))]
        entry.picks += 1
        return entry

    def take(self, results: Iterable[RunResult]) -> None:
        """Take results in run order: a run that reached something new joins the corpus."""
        for result in sorted(results, key=lambda r: r.index):
            new_features = result.features - self.seen
            new_arcs = result.arcs - self.seen
            self.seen |= result.features | result.arcs
            added = FEATURE_WEIGHT * len(new_features) + len(new_arcs)
            if added and result.failure is None:
                self.corpus.append(Entry(self.trace_of(result.index), result.seed, added))

    def restore(self, mutants: dict[int, Run], known: Iterable[int]) -> None:
        """The schedule of a streamed campaign read back from its journal: every index up to
        the highest ``known`` issued, as the fresh seed it was unless it was a mutant."""
        self.issued = 1 + max([*known, *mutants], default=-1)
        for index in range(self.issued):
            self.runs[index] = mutants.get(index, Run(index, self.seed_start + index))

    def trace_of(self, index: int) -> Trace:
        run = self.runs[index]
        return run.trace if run.trace is not None else generate_trace(run.seed, self.steps)


__all__ = ["Campaign", "Entry", "Run", "RunResult", "failure_key", "run_one"]
