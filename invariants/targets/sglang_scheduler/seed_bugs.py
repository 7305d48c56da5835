"""`kvspec sglang seed-bugs`: how long exploration takes, on SGLang's real scheduler, to its first
finding of each seed bug a release shipped (results: docs/benchmarks.md, *Real scheduler*).

Keeps: a seed bug is recognised by its signature on the explored seed (the kvspec invariants
its first failing view broke, or SGLang's own checker's words, and the configuration that can
reach it), never by a trigger written for it; seeds run in order, as `kvspec explore` runs them.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from invariants.explore.parallel import map_in_order
from invariants.targets.explore import RealTarget, SeedRun, run_seed
from invariants.targets.registry import TargetOptions
from invariants.targets.sglang_scheduler.adapter import swarm


@dataclass(frozen=True, slots=True)
class SeedBug:
    """A shipped bug as exploration sees it: its signature on a failing seed."""

    name: str
    release: str  # the last release that ships it
    matches: Callable[[SeedRun], bool]


def _retract_leak(run: SeedRun) -> bool:
    engine = swarm(run.seed).engine
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


def first_findings(
    seeds: int = 40, steps: int = 200, workers: int = 2, releases: tuple[str, ...] = ()
) -> list[dict[str, Any]]:
    """Per release (default: each seed bug's own), explore seeds in order until every seed
    bug's signature was seen or the seeds ran out; the time to each first sighting."""
    rows = []
    for release in releases or tuple(dict.fromkeys(bug.release for bug in SEED_BUGS)):
        target = RealTarget("sglang-scheduler", TargetOptions(version=release))
        start, first = time.perf_counter(), {}
        run = functools.partial(run_seed, steps=steps, target=target)
        for result in map_in_order(run, range(seeds), workers):
            for bug in SEED_BUGS:
                if bug.name not in first and bug.matches(result):
                    first[bug.name] = (round(time.perf_counter() - start, 1), result.seed)
            if len(first) == len(SEED_BUGS):
                break
        rows += [_row(release, bug.name, first.get(bug.name)) for bug in SEED_BUGS]
    return rows


def _row(release: str, bug: str, found: tuple[float, int] | None) -> dict[str, Any]:
    replay = None
    if found is not None:
        replay = (
            f"kvspec explore --target sglang-scheduler --target-version {release} "
            f"--seed-start {found[1]} --seeds 1"
        )
    return {
        "release": release,
        "bug": bug,
        "first_s": None if found is None else found[0],
        "seed": None if found is None else found[1],
        "replay": replay,
    }
