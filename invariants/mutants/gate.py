"""The zoo against the default gate (`kvspec bugs --gate`): every entry run through exactly
what a user runs — the `make report` cells and `kvspec explore`'s default campaign, side by
side on the workers (gate_traffic.py) — with no trigger written for it, and the first finding
said with its source and the time it took.

Keeps: a false-positive entry runs the correct engine with its pre-fix rules beside the
catalog and counts when they fire; a planted entry no trace reaches is reported as such,
never as caught; the time is wall time from the entry's first unit to its first finding.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import asdict, dataclass

from invariants.explore.explorer import DEFAULT_SEEDS, DEFAULT_STEPS
from invariants.explore.parallel import spawn_pool
from invariants.mutants import ZOO, Planted, entry
from invariants.mutants.gate_traffic import GateHit, GateTask, GateTraffic, run_gate_task

GATE_LIMIT_S = 60.0  # the issue's goal per entry; a reported figure, never a pass/fail test
NO_STATE_EFFECT = "no state effect a shipped invariant can see; only its probe rule does"


@dataclass(frozen=True, slots=True)
class GateResult:
    """One entry against the gate: caught (with the first hit), missed, or not applicable."""

    name: str
    issue: str
    kind: str
    status: str  # caught | missed | planted | unseen (a probe entry: no state effect)
    key: str = ""
    source: str = ""
    replay: str = ""
    detail: str = ""
    seconds: float = 0.0
    tasks_run: int = 0

    @property
    def ok(self) -> bool:
        return self.status != "missed"


def gate_entry(
    name: str, traffic: GateTraffic, pool: ProcessPoolExecutor, window: int, steps: int
) -> GateResult:
    """Feed ``traffic``, ``window`` units in flight, until one finds something."""
    found = entry(name)
    if isinstance(found, Planted):
        return GateResult(name, found.issue, found.kind, "planted", detail=found.why)
    start, done, issued = time.perf_counter(), 0, dict[int, GateTask]()
    hit = None
    for hit in _completed(name, traffic, pool, window, steps, issued):
        done += 1
        if hit is not None:
            break
    seconds = time.perf_counter() - start
    if hit is None:  # a probe entry has no state effect a shipped rule could see: unseen
        status, why = ("unseen", NO_STATE_EFFECT) if found.kind == "probe" else ("missed", "")
        return GateResult(name, found.issue, found.kind, status, "", "", "", why, seconds, done)
    task = issued[hit.index]
    return GateResult(
        name,
        found.issue,
        found.kind,
        "caught",
        hit.key,
        task.source,
        task.replay,
        hit.detail,
        seconds,
        done,
    )


def _completed(
    name: str,
    traffic: GateTraffic,
    pool: ProcessPoolExecutor,
    window: int,
    steps: int,
    issued: dict[int, GateTask],
) -> Iterator[GateHit | None]:
    """What each finished unit found; stopping early cancels what is queued."""
    running: dict[Future, GateTask] = {}
    try:
        while not traffic.exhausted or running:
            while len(running) < window and (task := traffic.next_task()) is not None:
                issued[task.index] = task
                running[pool.submit(run_gate_task, name, task, steps)] = task
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                running.pop(future)
                hit, result = future.result()
                traffic.done(result)
                yield hit
    finally:
        for future in running:
            future.cancel()
        wait(running)


def run_gate(
    names: Sequence[str] | None = None,
    *,
    seeds: int = DEFAULT_SEEDS,
    steps: int = DEFAULT_STEPS,
    workers: int = 2,
    progress: Callable[[GateResult], None] = lambda result: None,
) -> list[GateResult]:
    """Every entry asked for (default: the whole zoo) against the gate, on one worker pool;
    ``progress`` hears each entry's result as it is known."""
    chosen = list(names) if names else [e.name for e in ZOO]
    results = []
    with spawn_pool(workers) as pool:
        for name in chosen:
            traffic = GateTraffic(seeds, steps)
            results.append(gate_entry(name, traffic, pool, 2 * workers, steps))
            progress(results[-1])
    return results


def gate_line(result: GateResult) -> str:
    """One entry as one line: status, name, what caught it, when, where, the replay."""
    if result.status == "planted":
        return f"planted  {result.name}: no trace reaches it ({result.detail})"
    if result.status == "unseen":
        return f"unseen   {result.name}: {result.detail} ({result.tasks_run} cells and runs)"
    if result.status == "missed":
        return (
            f"MISSED   {result.name}: nothing fired in {result.tasks_run} cells and runs "
            f"({result.seconds:.1f} s)"
        )
    slow = "" if result.seconds <= GATE_LIMIT_S else f" (over {GATE_LIMIT_S:.0f} s)"
    return (
        f"caught   {result.name}: {result.key} after {result.seconds:.1f} s{slow}, "
        f"{result.source}; replay: {result.replay}"
    )


def print_gate(result: GateResult) -> None:
    print(gate_line(result), flush=True)


def summary_line(results: Sequence[GateResult]) -> str:
    """The verdict: caught of those a trace can reach, the slowest catch."""
    reachable = [r for r in results if r.status not in ("planted", "unseen")]
    caught = [r for r in reachable if r.status == "caught"]
    slowest = max((r.seconds for r in caught), default=0.0)
    verdict = "PASS" if len(caught) == len(reachable) else "FAIL"
    planted = sum(r.status == "planted" for r in results)
    unseen = len(results) - len(reachable) - planted
    return (
        f"{verdict}: the default gate caught {len(caught)}/{len(reachable)} entries with a state "
        f"effect ({planted} planted, not reachable by traffic; {unseen} without a state "
        f"effect); slowest catch {slowest:.1f} s"
    )


def gate_json(results: Sequence[GateResult]) -> list[dict]:
    return [asdict(r) for r in results]


__all__ = [
    "GATE_LIMIT_S",
    "GateResult",
    "gate_entry",
    "gate_json",
    "gate_line",
    "print_gate",
    "run_gate",
    "summary_line",
]
