"""`kvspec bench target --target NAME`: a real engine's iterations/s on specs' traces, unchecked
(the driver only steps: no view read, no check of the engine's own) against checked (a state
view per step, the whole catalog on it at the target's level), and the ratio — what checking
costs on that engine (results: docs/benchmarks.md).

Keeps: both timings of a spec come from the same driver, the same trace and the same release,
alternated run by run, medians reported; a run's time is its loop's, not the engine's build
(the config op: ``setup_seconds``). ``replay`` (the vllm driver) adds what viewing costs the
driver's process alone: the ops of one checked run, replayed inside the driver with views off
and on in turn, in CPU seconds — the pipe, kvspec's side and a busy machine's other tenants
left out, so a change to the driver's view shows where wall time moves by thirty per cent.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from invariants.checking.loader import shipped_catalog
from invariants.machine import machine_info
from invariants.scenarios.ops import Trace
from invariants.scenarios.scenario import build_trace
from invariants.scenarios.spec import load_spec
from invariants.targets.driver import DriverError, LineDriver
from invariants.targets.registry import Target, TargetOptions
from invariants.targets.registry import target as registered
from invariants.targets.run import run_trace

DEFAULT_SPECS = ("specs/radix-eviction.yaml", "specs/matrix-base.yaml")


def bench_target(
    name: str,
    specs: tuple[str, ...] = DEFAULT_SPECS,
    runs: int = 3,
    options: TargetOptions | None = None,
    replay: bool = False,
) -> dict[str, Any]:
    """Per spec: iterations, median seconds and iterations/s unchecked and checked, and the
    ratio (``replay``: the driver's own CPU time too); ``ValueError`` for a spec the target
    cannot run, or a replay its driver cannot do."""
    entry = registered(name)
    rows = []
    with entry.adapter().open_driver(options or TargetOptions()) as driver:
        for path in specs:
            trace = build_trace(load_spec(Path(path)))
            missing = "; ".join(entry.adapter().unsupported(trace, driver.version))
            if missing:
                raise ValueError(f"{path}: not supported by the {name} target: {missing}")
            times: dict[bool, list[float]] = {False: [], True: []}
            for _ in range(runs):
                for checked in (False, True):
                    outcome = run_trace(
                        entry, trace, shipped_catalog(), driver=driver, observe=checked
                    )
                    if outcome.error is not None:
                        raise RuntimeError(f"{name} bench, {path}: {outcome.error}")
                    times[checked].append(outcome.seconds - outcome.setup_seconds)
            rows.append(_row(path, outcome.iterations, times, driver.version))
            if replay:
                rows[-1]["replay"] = _replayed(entry, trace, driver, runs)
    return {"machine": machine_info(), "target": name, "runs": runs, "rows": rows}


def _replayed(entry: Target, trace: Trace, driver: LineDriver, runs: int) -> dict[str, Any]:
    """One checked run with its ops kept, replayed ``runs`` times inside the driver; the
    replay must end as the run did (its last answer's result: the run's stats)."""
    driver.posted = []
    try:
        run_trace(entry, trace, shipped_catalog(), driver=driver, observe=True)
    finally:
        ops, driver.posted = driver.posted, None
    ran = driver.result
    try:
        spent = driver.ask({"op": "replay", "ops": ops, "runs": runs})["result"]
    except DriverError as exc:
        raise ValueError(f"the {driver.target} driver cannot replay ({exc})") from None
    if spent["last"] != ran:
        raise RuntimeError(f"the replay ended {spent['last']}, the run {ran}")
    unviewed, viewed = spent["unviewed_s"], spent["viewed_s"]
    return {
        "unviewed_cpu_s": round(statistics.median(unviewed), 4),
        "viewed_cpu_s": round(statistics.median(viewed), 4),
        "cpu_ratio": round(statistics.median(v / u for u, v in zip(unviewed, viewed)), 2),
    }


def over_bound(result: dict[str, Any], bound: float) -> list[str]:
    """The guard (``--check``): each spec whose checked ÷ unchecked ratio, paired within the
    rounds of this run, exceeds ``bound``."""
    return [
        f"{row['spec']}: checked ÷ unchecked = {row['paired_ratio']:.2f} > {bound}"
        for row in result["rows"]
        if row["paired_ratio"] > bound
    ]


def _row(
    path: str, iterations: int, times: dict[bool, list[float]], version: str
) -> dict[str, Any]:
    unchecked, checked = statistics.median(times[False]), statistics.median(times[True])
    paired = statistics.median(c / u for u, c in zip(times[False], times[True]))
    return {
        "spec": path,
        "release": version,
        "iterations": iterations,
        "unchecked_s": round(unchecked, 3),
        "checked_s": round(checked, 3),
        "unchecked_it_per_s": round(iterations / unchecked, 1),
        "checked_it_per_s": round(iterations / checked, 1),
        "checked_over_unchecked": round(checked / unchecked, 2),
        "paired_ratio": round(paired, 2),  # the median of each round's ratio (the guard's)
    }
