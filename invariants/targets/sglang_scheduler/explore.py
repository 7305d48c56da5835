"""Seed-driven exploration on SGLang's real scheduler (`kvspec explore --target
sglang-scheduler`): each seed draws a configuration the real scheduler runs (page size, chunk
size, pool size, retract interval, overlap, mixed chunk, streaming sessions, EOS) and an op mix
(session turns and closes, aborts in each phase, flushes, clock advances); the loop, the
failure keys and the shrinking are the real-engine explorer's (invariants/explore/real.py).

Keeps: a seed's result depends on the seed, the step budget and the release only; each
worker process keeps one driver (SGLang imported once) and every trace runs in a fresh child
of it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from engine.mem import paging
from invariants.checking.loader import shipped_catalog
from invariants.explore.real import (
    SHRINK_BUDGET,
    ExploreReport,
    RealTarget,
    SeedRun,
    explore_real,
    failure_key,
)
from invariants.explore.real import run_seed as run_real_seed
from invariants.explore.swarm import FEATURES, NEW_MAX, Swarm, sample_prompts, sample_weights
from invariants.scenarios.ops import Trace
from invariants.scenarios.spec import EngineSpec
from invariants.targets.sglang_scheduler.run import SchedulerOutcome, run_trace_on_scheduler
from invariants.targets.sglang_scheduler.target import DEFAULT_VERSION, SchedulerDriver

DEFAULT_SEEDS = 40
DEFAULT_STEPS = 200
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


def scheduler_target(version: str | None = None, python: str | None = None) -> RealTarget:
    """SGLang's real scheduler on one release, as the real-engine explorer drives it."""
    return RealTarget(
        "sglang-scheduler", "SGLang", scheduler_swarm, swarm_label, check_on, version, python
    )


def run_seed(seed: int, steps: int, version: str | None, python: str | None) -> SeedRun:
    """Generate and check the trace of ``seed`` on the release (module-level: workers)."""
    return run_real_seed(seed, steps, scheduler_target(version, python))


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
) -> ExploreReport:
    """Seeds ``seed_start …`` on one release, then each distinct failure key's first seed
    shrunk into ``out_dir`` (at most ``max_shrunk``)."""
    named = version or (DEFAULT_VERSION if python is None else driver_for(version, python).version)
    return explore_real(
        scheduler_target(version, python),
        named,
        seeds,
        steps,
        seed_start=seed_start,
        workers=workers,
        fail_fast=fail_fast,
        out_dir=out_dir,
        max_shrunk=max_shrunk,
        shrink_budget=shrink_budget,
    )


__all__ = ["SeedRun", "explore_scheduler", "failure_key", "run_seed", "scheduler_swarm"]
