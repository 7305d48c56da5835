"""Seed-driven exploration on SGLang's real scheduler (`kvspec explore --target
sglang-scheduler`): each seed draws a configuration the real scheduler runs (page size, chunk
size, pool size, retract interval, overlap, mixed chunk, streaming sessions, EOS) and an op mix
(session turns and closes, aborts in each phase, flushes, clock advances); the trace is the
engine explorer's own generator's (invariants/explore/generate.py), so any failing seed
shrinks with the same delta debugging and replays with `kvspec replay`.

Keeps: a seed's result depends on the seed, the step budget and the release only; each
worker process keeps one driver (SGLang imported once) and every trace runs in a fresh child
of it. A failure's key is the kvspec invariants the first failing view broke (joined by
``+``), else SGLang's own checker (``sglang:`` and the message's first words), else a crash
(``error:``) or a drain that did not reach idle (``liveness``); shrinking keeps the key.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from engine.errors import ConfigError
from engine.mem import paging
from invariants.checking.loader import shipped_catalog
from invariants.explore.ddmin import shrink_counted
from invariants.explore.generate import generate_trace
from invariants.explore.parallel import map_in_order
from invariants.explore.swarm import FEATURES, NEW_MAX, Swarm, sample_prompts, sample_weights
from invariants.scenarios.ops import Trace
from invariants.scenarios.spec import EngineSpec
from invariants.sglang.scheduler.run import SchedulerOutcome, run_trace_on_scheduler
from invariants.sglang.scheduler.target import DEFAULT_VERSION, SchedulerDriver

DEFAULT_SEEDS = 40
DEFAULT_STEPS = 200
SHRINK_BUDGET = 120  # real-scheduler runs per shrink (each ~1.5 s: a Scheduler is built)
FAILURE_DIR = Path("explore-failures")
_DRIVERS: dict[tuple[str | None, str | None], SchedulerDriver] = {}  # per worker process


def scheduler_engine(rng: np.random.Generator) -> EngineSpec:
    """A configuration the real-scheduler target runs: small pools under pressure, any page
    size and chunk the server accepts, SGLang's test retract at an interval, or not."""
    ps = int(rng.choice([1, 1, 4, 4, 16]))
    tokens = max(paging.ceil_align(int(rng.integers(256, 1024)), ps), 16 * ps)
    chunk = None if rng.random() < 0.15 else int(rng.choice([16, 32, 64, 128]))
    streaming = bool(rng.random() < 0.6)
    return EngineSpec(
        page_size=ps,
        max_total_tokens=tokens,
        max_num_reqs=int(rng.integers(3, 12)),
        context_len=min(tokens - NEW_MAX - 2 * ps - 16, 512),
        cache="radix" if streaming or rng.random() < 0.9 else "chunk",
        chunked_prefill_size=None if chunk is None else max(chunk, ps),
        enable_overlap=bool(rng.random() < 0.5),
        enable_mixed_chunk=chunk is not None and bool(rng.random() < 0.25),
        enable_streaming_session=streaming,
        test_retract=bool(rng.random() < 0.5),
        test_retract_interval=int(rng.integers(1, 7)),
        eos_prob=float(rng.choice([0.0, 0.0, 0.02, 0.05])),
    )


def scheduler_swarm(seed: int) -> Swarm:
    """The configuration and op mix of ``seed`` on the real scheduler (retracts come from
    the test hook, so the on-demand ``force_retract`` op is never drawn)."""
    engine = scheduler_engine(np.random.default_rng([seed, 10]))
    weights = {**sample_weights(np.random.default_rng([seed, 11])), "force_retract": 0.0}
    if not engine.enable_streaming_session and np.random.default_rng([seed, 12]).random() < 0.5:
        weights = {k: (0.0 if k in FEATURES["sessions"] else w) for k, w in weights.items()}
    prompts = sample_prompts(np.random.default_rng([seed, 13]), engine)
    return Swarm(engine, weights, prompts, 0.8 if engine.enable_streaming_session else 0.0)


def swarm_label(swarm: Swarm) -> str:
    """A seed's configuration on one line."""
    e = swarm.engine

    def sign(on: object) -> str:
        return "+" if on else "-"

    ops = [k for k, w in swarm.weights.items() if w > 0 and k not in ("submit", "step")]
    return (
        f"ps{e.page_size} {e.cache} pool{e.max_total_tokens} chunk{e.chunked_prefill_size or '-'} "
        f"overlap{sign(e.enable_overlap)} mixed{sign(e.enable_mixed_chunk)} "
        f"retract{e.test_retract_interval if e.test_retract else '-'} "
        f"streaming{sign(e.enable_streaming_session)} ops[{','.join(ops)}]"
    )


def scheduler_trace(seed: int, steps: int) -> Trace:
    swarm = scheduler_swarm(seed)
    trace = generate_trace(seed, steps, swarm)
    return trace.model_copy(update={"name": f"sglang-scheduler-seed-{seed}"})


def failure_key(outcome: SchedulerOutcome) -> str | None:
    """What failed first (see the module docstring); None: nothing."""
    if outcome.violations:  # every invariant the first failing view broke, in catalog order
        first = outcome.violations[0]
        same = [
            v.invariant
            for v in outcome.violations
            if (v.step, v.event) == (first.step, first.event)
        ]
        return "+".join(dict.fromkeys(same))
    if outcome.sglang:
        words = [w for w in outcome.sglang[0].message.split() if not any(map(str.isdigit, w))]
        return "sglang:" + " ".join(words[:4])  # no counts: a shrunk trace leaks less
    if outcome.error is not None:
        if "not idle after" in outcome.error or "still running after" in outcome.error:
            return "liveness"
        return "error:" + outcome.error.split(":", 2)[-1].strip()[:60]
    return None


def driver_for(version: str | None, python: str | None) -> SchedulerDriver:
    """This process's driver for a release (started once, reused by every trace)."""
    key = (version, python)
    if key not in _DRIVERS or _DRIVERS[key].proc.poll() is not None:
        _DRIVERS[key] = SchedulerDriver(version, python)
    return _DRIVERS[key]


def check_on(trace: Trace, version: str | None, python: str | None) -> SchedulerOutcome:
    """``trace`` at level 2 on the release's driver."""
    driver = driver_for(version, python)
    return run_trace_on_scheduler(trace, shipped_catalog(), driver=driver)


@dataclass(frozen=True, slots=True)
class SeedRun:
    """One seed on the real scheduler: its configuration, what failed (None: nothing)."""

    seed: int
    label: str
    key: str | None
    detail: str
    iterations: int
    seconds: float


def run_seed(seed: int, steps: int, version: str | None, python: str | None) -> SeedRun:
    """Generate and check the trace of ``seed`` (module-level: worker processes call it)."""
    start = time.perf_counter()
    label = swarm_label(scheduler_swarm(seed))
    try:
        outcome = check_on(scheduler_trace(seed, steps), version, python)
    except ConfigError as exc:
        return SeedRun(seed, label, "config", str(exc), 0, 0.0)
    key = failure_key(outcome)
    return SeedRun(
        seed, label, key, _detail(outcome), outcome.stats.iterations, time.perf_counter() - start
    )


def _detail(outcome: SchedulerOutcome) -> str:
    if outcome.violations:
        return str(outcome.violations[0])
    if outcome.sglang:
        first = outcome.sglang[0]
        return f"iteration {first.iteration}: SGLang's checker: {first.message[:300]}"
    return outcome.error or ""


@dataclass(frozen=True, slots=True)
class SchedulerFinding:
    """A failing seed, shrunk: ``path`` replays it on the release."""

    seed: int
    key: str
    detail: str
    path: Path
    original_ops: int
    shrunk_ops: int
    shrink_runs: int


@dataclass(slots=True)
class SchedulerExploreReport:
    version: str
    results: list[SeedRun] = field(default_factory=list)
    findings: list[SchedulerFinding] = field(default_factory=list)
    seconds: float = 0.0
    first_failure_s: float | None = None  # from the start to the first failing seed's result

    @property
    def failed(self) -> list[SeedRun]:
        return [r for r in self.results if r.key is not None and r.key != "config"]


def explore_scheduler(
    version: str | None = None,
    seeds: int = DEFAULT_SEEDS,
    steps: int = DEFAULT_STEPS,
    *,
    seed_start: int = 0,
    workers: int = 1,
    fail_fast: bool = False,
    out_dir: Path = FAILURE_DIR,
    max_shrunk: int = 3,
    shrink_budget: int = SHRINK_BUDGET,
    python: str | None = None,
) -> SchedulerExploreReport:
    """Seeds ``seed_start …`` on one release, then each distinct failure key's first seed
    shrunk into ``out_dir`` (at most ``max_shrunk``)."""
    start = time.perf_counter()
    named = version or (DEFAULT_VERSION if python is None else driver_for(version, python).version)
    report = SchedulerExploreReport(named)
    run = functools.partial(run_seed, steps=steps, version=version, python=python)
    for result in map_in_order(run, range(seed_start, seed_start + seeds), workers):
        report.results.append(result)
        if result in report.failed and report.first_failure_s is None:
            report.first_failure_s = time.perf_counter() - start
            if fail_fast:
                break
    keys: set[str] = set()
    for result in report.failed:
        if result.key not in keys and len(keys) < max_shrunk:
            keys.add(result.key)
            finding = shrink_seed(result, steps, version, python, out_dir, shrink_budget)
            report.findings.append(finding)
    report.seconds = time.perf_counter() - start
    return report


def shrink_seed(
    result: SeedRun,
    steps: int,
    version: str | None,
    python: str | None,
    out_dir: Path,
    budget: int = SHRINK_BUDGET,
) -> SchedulerFinding:
    """The failing trace of ``result``'s seed, shrunk (same key), as ``seed-<n>.json``."""
    trace = scheduler_trace(result.seed, steps)
    outcome = check_on(trace, version, python)
    if outcome.stopped_at is not None and outcome.stopped_at < len(trace.ops):
        trace = trace.with_ops(trace.ops[: outcome.stopped_at + 1])  # later ops never ran

    def fails(candidate: Trace) -> bool:
        return failure_key(check_on(candidate, version, python)) == result.key

    small, runs = shrink_counted(trace, fails, budget=budget)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"sglang-scheduler-seed-{result.seed}.json"
    small.model_copy(update={"name": f"sglang-scheduler-seed-{result.seed}-shrunk"}).save(path)
    return SchedulerFinding(
        result.seed, str(result.key), result.detail, path, len(trace.ops), len(small.ops), runs
    )
