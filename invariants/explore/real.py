"""Seed-driven exploration of a real engine (`kvspec explore --target sglang-scheduler | vllm`):
each seed draws a configuration the engine runs and an op mix, the trace is the engine
explorer's own generator's (generate.py), and each distinct failure's first seed is shrunk with
the same delta debugging, written where `kvspec replay --target …` replays it.

Keeps: a seed's result depends on the seed, the step budget, the target and its release only
(``RealTarget`` is plain data and module-level functions, so worker processes rebuild it). A
failure's key is the kvspec invariants the first failing view broke (joined by ``+``), else
the engine's own checker (``sglang:`` and its message's first words), else a crash
(``error:``) or a drain that did not reach idle (``liveness``); shrinking keeps the key.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from engine.errors import ConfigError
from invariants.checking.checker import Violation
from invariants.explore.ddmin import shrink_counted
from invariants.explore.explorer import Finding  # the engine explorer's: a shrunk failure
from invariants.explore.generate import generate_trace
from invariants.explore.parallel import map_in_order
from invariants.explore.swarm import Swarm
from invariants.scenarios.ops import Trace

SHRINK_BUDGET = 120  # real-engine runs per shrink (each ~0.3–1.5 s: a scheduler is built)


class RealOutcome(Protocol):
    """What the explorer reads of one checked trace on a real engine."""

    violations: tuple[Violation, ...]
    error: str | None
    stopped_at: int | None

    @property
    def iterations(self) -> int: ...

    @property
    def engine_findings(self) -> Sequence[Any]: ...  # the engine's own checker (iteration, message)


@dataclass(frozen=True, slots=True)
class RealTarget:
    """A real engine to explore: its name (the ``--target`` value), what its own checker is
    called, how a seed draws its configuration and labels it, how a trace is checked on one
    release (level 2: the first failing view, every invariant of it evaluated)."""

    name: str
    engine: str
    swarm: Callable[[int], Swarm]
    label: Callable[[Swarm], str]
    check: Callable[[Trace, str | None, str | None], RealOutcome]
    version: str | None = None
    python: str | None = None

    def trace(self, seed: int, steps: int) -> Trace:
        trace = generate_trace(seed, steps, self.swarm(seed))
        return trace.model_copy(update={"name": f"{self.name}-seed-{seed}"})

    def run(self, trace: Trace) -> RealOutcome:
        return self.check(trace, self.version, self.python)


def failure_key(outcome: RealOutcome) -> str | None:
    """What failed first (see the module docstring); None: nothing."""
    if outcome.violations:  # every invariant the first failing view broke, in catalog order
        first = outcome.violations[0]
        same = [
            v.invariant
            for v in outcome.violations
            if (v.step, v.event) == (first.step, first.event)
        ]
        return "+".join(dict.fromkeys(same))
    if outcome.engine_findings:
        message = outcome.engine_findings[0].message
        words = [w for w in message.split() if not any(map(str.isdigit, w))]
        return "sglang:" + " ".join(words[:4])  # no counts: a shrunk trace leaks less
    if outcome.error is not None:
        if "not idle after" in outcome.error or "still running after" in outcome.error:
            return "liveness"
        return "error:" + outcome.error.split(":", 2)[-1].strip()[:60]
    return None


@dataclass(frozen=True, slots=True)
class SeedRun:
    """One seed on the real engine: its configuration, what failed (None: nothing)."""

    seed: int
    label: str
    key: str | None
    detail: str
    iterations: int
    seconds: float


def run_seed(seed: int, steps: int, target: RealTarget) -> SeedRun:
    """Generate and check the trace of ``seed`` (module-level: worker processes call it)."""
    start = time.perf_counter()
    label = target.label(target.swarm(seed))
    try:
        outcome = target.run(target.trace(seed, steps))
    except ConfigError as exc:
        return SeedRun(seed, label, "config", str(exc), 0, 0.0)
    key = failure_key(outcome)
    seconds = time.perf_counter() - start
    return SeedRun(seed, label, key, detail(outcome, target), outcome.iterations, seconds)


def detail(outcome: RealOutcome, target: RealTarget) -> str:
    """The first failure in words."""
    if outcome.violations:
        return str(outcome.violations[0])
    if outcome.engine_findings:
        first = outcome.engine_findings[0]
        return f"iteration {first.iteration}: {target.engine}'s checker: {first.message[:300]}"
    return outcome.error or ""


@dataclass(slots=True)
class ExploreReport:
    version: str
    results: list[SeedRun] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    seconds: float = 0.0
    first_failure_s: float | None = None  # from the start to the first failing seed's result

    @property
    def failed(self) -> list[SeedRun]:
        return [r for r in self.results if r.key is not None and r.key != "config"]


def explore_real(
    target: RealTarget,
    version: str,
    seeds: int,
    steps: int,
    *,
    seed_start: int = 0,
    workers: int = 1,
    fail_fast: bool = False,
    out_dir: Path = Path("explore-failures"),
    max_shrunk: int = 3,
    shrink_budget: int = SHRINK_BUDGET,
) -> ExploreReport:
    """Seeds ``seed_start …`` on ``target`` (release ``version``, for the report), then each
    distinct failure key's first seed shrunk into ``out_dir`` (at most ``max_shrunk``)."""
    start = time.perf_counter()
    report = ExploreReport(version)
    run = functools.partial(run_seed, steps=steps, target=target)
    for result in map_in_order(run, range(seed_start, seed_start + seeds), workers):
        report.results.append(result)
        if result in report.failed and report.first_failure_s is None:
            report.first_failure_s = time.perf_counter() - start
            if fail_fast:
                break
    keys: set[str] = set()
    for result in report.failed:
        if result.key not in keys and len(keys) < max_shrunk:
            keys.add(str(result.key))
            report.findings.append(shrink_seed(target, result, steps, out_dir, shrink_budget))
    report.seconds = time.perf_counter() - start
    return report


def shrink_seed(
    target: RealTarget, result: SeedRun, steps: int, out_dir: Path, budget: int = SHRINK_BUDGET
) -> Finding:
    """The failing trace of ``result``'s seed, shrunk (same key), as ``<target>-seed-<n>.json``."""
    trace = target.trace(result.seed, steps)
    outcome = target.run(trace)
    if outcome.stopped_at is not None and outcome.stopped_at < len(trace.ops):
        trace = trace.with_ops(trace.ops[: outcome.stopped_at + 1])  # later ops never ran

    def fails(candidate: Trace) -> bool:
        return failure_key(target.run(candidate)) == result.key

    small, runs = shrink_counted(trace, fails, budget=budget)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{target.name}-seed-{result.seed}.json"
    small.model_copy(update={"name": f"{target.name}-seed-{result.seed}-shrunk"}).save(path)
    return Finding(
        result.seed, str(result.key), result.detail, path, len(trace.ops), len(small.ops), runs
    )
