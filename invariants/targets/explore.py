"""Seed-driven exploration of a real engine (`kvspec explore --target NAME`): each seed draws a
configuration the engine runs and an op mix (the target adapter's ``swarm``), the trace is the
engine explorer's own generator's (explore/generate.py), every step is checked at level 2, and
each distinct failure's first seed is shrunk with the same delta debugging, written where
`kvspec replay --target NAME` replays it.

Keeps: a seed's result depends on the seed, the step budget, the target and its release only
(``RealTarget`` is plain data, so worker processes rebuild it; each keeps one driver per
target and options, the engine imported once). A failure's key is whole, never cut: the kvspec
invariants the first failing view broke (joined by ``+``; a crash's ``engine.*`` rule with the
engine's raising site, ``@path:function``, so two crashes stay two findings), else the
engine's own checker (``<engine>:`` and its message's first words, no counts: a shrunk trace
leaks less), else a drain that did not reach idle (``liveness``) or a refused op (``error:``
and the exception's class); shrinking keeps the key.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

from engine.errors import ConfigError
from invariants.checking.loader import shipped_catalog
from invariants.explore.ddmin import shrink_counted
from invariants.explore.explorer import Finding  # the engine explorer's: a shrunk failure
from invariants.explore.generate import generate_trace
from invariants.scenarios.ops import Trace
from invariants.targets.driver import LineDriver
from invariants.targets.outcome import TargetOutcome
from invariants.targets.registry import TargetOptions
from invariants.targets.registry import target as registered
from invariants.targets.run import run_trace

DEFAULT_SEEDS, DEFAULT_STEPS = 40, 200
SHRINK_BUDGET = 120  # real-engine runs per shrink (each ~0.3–1.5 s: an engine is built)
ERROR_CLASS = re.compile(r"\b[A-Z]\w*(?:Error|Exception)\b")
_DRIVERS: dict[tuple[str, TargetOptions], LineDriver] = {}  # per worker process, oldest first
KEPT_DRIVERS = 2  # a target and the twin it shrinks on; a campaign's next release closes one


def driver_for(name: str, options: TargetOptions) -> LineDriver:
    """This process's driver for a target and its options (started once, reused by every
    trace: each trace's config op builds a fresh engine). A worker of a campaign over many
    releases keeps the last ``KEPT_DRIVERS`` it used, never one engine per release."""
    key = (name, options)
    driver = _DRIVERS.pop(key, None)
    if driver is None or driver.proc.poll() is not None:
        while len(_DRIVERS) >= KEPT_DRIVERS:
            _DRIVERS.pop(next(iter(_DRIVERS))).close()
        driver = registered(name).adapter().open_driver(options)
    _DRIVERS[key] = driver  # the most recently used last
    return driver


@dataclass(frozen=True, slots=True)
class RealTarget:
    """A real engine to explore: its registry name and the release or interpreter to run."""

    name: str
    options: TargetOptions = field(default_factory=TargetOptions)

    def trace(self, seed: int, steps: int) -> Trace:
        swarm = registered(self.name).adapter().swarm(seed)
        trace = generate_trace(seed, steps, swarm)
        return trace.model_copy(update={"name": f"{self.name}-seed-{seed}"})

    def label(self, seed: int) -> str:
        adapter = registered(self.name).adapter()
        return adapter.label(adapter.swarm(seed))

    def run(self, trace: Trace, keep_views: bool = False) -> TargetOutcome:
        """``trace`` at level 2 (the first failing view, every invariant of it evaluated)."""
        driver = driver_for(self.name, self.options)
        entry = registered(self.name)
        return run_trace(entry, trace, shipped_catalog(), 2, driver=driver, keep_views=keep_views)


def failure_key(outcome: TargetOutcome) -> str | None:
    """What failed first (see the module docstring); None: nothing."""
    if outcome.violations:  # every invariant the first failing view broke, in catalog order
        first = outcome.violations[0]
        same = [v for v in outcome.violations if (v.step, v.event) == (first.step, first.event)]
        key = "+".join(dict.fromkeys(v.invariant for v in same))
        site = outcome.crash.site if outcome.crash is not None else ""
        return f"{key}@{site}" if first.event == "crash" and site else key
    if outcome.findings:
        words = [w for w in outcome.findings[0].message.split() if not any(map(str.isdigit, w))]
        return f"{outcome.engine.lower()}:" + " ".join(words[:4])
    if outcome.error is not None:
        if "not idle after" in outcome.error:
            return "liveness"
        return "error:" + _error_class(outcome.error)
    return None


def _error_class(error: str) -> str:
    """The exception class a driver's error names (``op #3 (submit r1): KeyError: …``)."""
    found = ERROR_CLASS.search(error)
    return found.group(0) if found else "driver"


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
    label = target.label(seed)
    try:
        outcome = target.run(target.trace(seed, steps))
    except ConfigError as exc:
        return SeedRun(seed, label, "config", str(exc), 0, 0.0)
    seconds = time.perf_counter() - start
    return SeedRun(seed, label, failure_key(outcome), detail(outcome), outcome.iterations, seconds)


def detail(outcome: TargetOutcome) -> str:
    """The first failure in words."""
    if outcome.violations:
        return str(outcome.violations[0])
    if outcome.findings:
        first = outcome.findings[0]
        return f"iteration {first.iteration}: {outcome.engine}'s checker: {first.message[:300]}"
    return outcome.error or ""


@dataclass(slots=True)
class ExploreReport:
    target: str
    version: str
    results: list[SeedRun] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    seconds: float = 0.0
    first_failure_s: float | None = None  # from the start to the first failing seed's result
    infra: list[str] = field(default_factory=list)  # seeds no worker could finish, and why
    where: str = "this process"

    @property
    def failed(self) -> list[SeedRun]:
        return [r for r in self.results if r.key is not None and r.key != "config"]


def seed_task(arg: tuple[int, int, RealTarget]) -> SeedRun:
    """A fleet task: ``run_seed`` of (seed, steps, target)."""
    return run_seed(*arg)


def shrink_task(arg: tuple[RealTarget, int, str, int, int]) -> tuple[Trace, int, int]:
    """A fleet task: the failing trace of a seed (target, seed, key, steps, budget), cut after
    its first failure and shrunk keeping its key → (small trace, runs, ops before)."""
    target, seed, key, steps, budget = arg
    trace = target.trace(seed, steps)
    outcome = target.run(trace)
    if outcome.stopped_at is not None and outcome.stopped_at < len(trace.ops):
        trace = trace.with_ops(trace.ops[: outcome.stopped_at + 1])  # later ops never ran
    small, runs = _shrunk(target, trace, key, budget)
    return small, runs, len(trace.ops)


def _shrunk(target: RealTarget, trace: Trace, key: str, budget: int) -> tuple[Trace, int]:
    """``trace`` shrunk keeping ``key``, and the runs it took (see ``shrink_seed``)."""
    entry = registered(target.name)
    twin = RealTarget(entry.shrinks_on, target.options) if entry.shrinks_on else None
    if twin is not None and failure_key(twin.run(trace)) == key:
        small, runs = shrink_counted(
            trace, lambda t: failure_key(twin.run(t)) == key, budget=budget
        )
        if failure_key(target.run(small)) == key:
            return small, runs + 2
    own = min(budget, entry.shrink_runs)
    return shrink_counted(trace, lambda t: failure_key(target.run(t)) == key, budget=own)
