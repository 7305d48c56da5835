"""`kvspec bench scheduler`: SGLang's real scheduler on CPU — iterations/s with the driver
only stepping (no view read, no check of SGLang's own) against the same trace checked at
level 2 by the whole catalog, and the time exploration takes to its first finding of each
seed bug a release shipped (results: docs/benchmarks.md, *Real scheduler*).

Keeps: both timings of a spec come from the same driver, the same trace and the same
release, alternated run by run (medians reported); a seed bug is recognised by its signature
on the explored seed (the kvspec invariants its first failing view broke, or SGLang's own
checker's words, and the configuration that can reach it), never by a trigger written for it.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from invariants.bench.machine import machine_info
from invariants.checking.loader import shipped_catalog
from invariants.explore.parallel import map_in_order
from invariants.scenarios.scenario import build_trace
from invariants.scenarios.spec import load_spec
from invariants.targets.sglang_scheduler.explore import SeedRun, run_seed, scheduler_swarm
from invariants.targets.sglang_scheduler.run import run_trace_on_scheduler
from invariants.targets.sglang_scheduler.target import SchedulerDriver

THROUGHPUT_SPECS = ("specs/matrix-base.yaml", "specs/streaming-sessions.yaml")


@dataclass(frozen=True, slots=True)
class SeedBug:
    """A shipped bug as exploration sees it: its signature on a failing seed."""

    name: str
    release: str  # the last release that ships it
    matches: Callable[[SeedRun], bool]


def _retract_leak(run: SeedRun) -> bool:
    engine = scheduler_swarm(run.seed).engine
    return (
        run.key is not None
        and "census.no_orphans" in run.key.split("+")
        and engine.test_retract
        and engine.enable_streaming_session
    )


def _busy_double_count(run: SeedRun) -> bool:
    return (run.key or "").startswith("sglang:Mem Leak Detected!")


SEED_BUGS = (
    SeedBug("#22862 retract tail leak (streaming turn retracted)", "0.5.10.post1", _retract_leak),
    SeedBug("#22213 busy check double-counts a session turn", "0.5.10.post1", _busy_double_count),
)


def bench_throughput(
    specs: tuple[str, ...] = THROUGHPUT_SPECS, version: str | None = None, runs: int = 3
) -> list[dict[str, Any]]:
    """Per spec: iterations, then median seconds (the loop's, not the Scheduler's build) and
    iterations/s unchecked and checked."""
    rows = []
    with SchedulerDriver(version) as driver:
        for path in specs:
            trace = build_trace(load_spec(Path(path)))
            times: dict[bool, list[float]] = {False: [], True: []}
            iterations = 0
            for _ in range(runs):
                for checked in (False, True):
                    outcome = run_trace_on_scheduler(
                        trace, shipped_catalog(), driver=driver, observe=checked
                    )
                    times[checked].append(outcome.seconds - outcome.setup_seconds)
                    iterations = outcome.stats.iterations
            rows.append(_throughput_row(path, iterations, times, driver.version))
    return rows


def _throughput_row(
    path: str, iterations: int, times: dict[bool, list[float]], version: str
) -> dict[str, Any]:
    unchecked, checked = statistics.median(times[False]), statistics.median(times[True])
    return {
        "spec": path,
        "release": version,
        "iterations": iterations,
        "unchecked_s": round(unchecked, 3),
        "checked_s": round(checked, 3),
        "unchecked_it_per_s": round(iterations / unchecked, 1),
        "checked_it_per_s": round(iterations / checked, 1),
        "checked_over_unchecked": round(checked / unchecked, 2),
    }


def bench_first_findings(
    seeds: int = 40, steps: int = 200, workers: int = 2, releases: tuple[str, ...] = ()
) -> list[dict[str, Any]]:
    """Per release (default: each seed bug's own), explore seeds in order until every seed
    bug's signature was seen or the seeds ran out; the time to each first sighting."""
    rows = []
    for release in releases or tuple(dict.fromkeys(bug.release for bug in SEED_BUGS)):
        start, first = time.perf_counter(), {}
        run = functools.partial(run_seed, steps=steps, version=release, python=None)
        for result in map_in_order(run, range(seeds), workers):
            for bug in SEED_BUGS:
                if bug.name not in first and bug.matches(result):
                    first[bug.name] = (round(time.perf_counter() - start, 1), result.seed)
            if len(first) == len(SEED_BUGS):
                break
        for bug in SEED_BUGS:
            found = first.get(bug.name)
            rows.append(
                {
                    "release": release,
                    "bug": bug.name,
                    "first_s": None if found is None else found[0],
                    "seed": None if found is None else found[1],
                    "replay": None
                    if found is None
                    else f"kvspec explore --target sglang-scheduler --sglang-version {release} "
                    f"--seed-start {found[1]} --seeds 1",
                }
            )
    return rows


def bench_scheduler(
    version: str | None = None, runs: int = 3, seeds: int = 40, workers: int = 2,
    releases: tuple[str, ...] = (),
) -> dict[str, Any]:  # fmt: skip
    """The whole benchmark: the machine, the throughput rows, the first-finding rows."""
    return {
        "machine": machine_info(),
        "throughput": bench_throughput(version=version, runs=runs),
        "first_findings": bench_first_findings(seeds, workers=workers, releases=releases),
    }
