"""The zoo against the default gate (`kvspec bugs --gate`): every entry run through exactly
what a user runs — the `make report` cells, then `kvspec explore` at its default budget — with
no trigger written for it, and the first finding said with its source and the time it took.

Keeps: the gate's traffic is the same for every entry (the report's cells in report order,
then explore's seeds in seed order); an engine mutant is patched inside each worker, around
one cell or seed, so no run outlives its entry; a finding is what the default gate fails on —
a violated invariant, a failed response oracle, a crash (``error:``), a drain that never
reached idle (``liveness``) — never an unmet ``expect`` goal, which says nothing about
correctness. A false-positive entry runs the correct engine with its pre-fix rules beside
the catalog and counts when they fire; a planted entry no trace reaches is reported as such,
never as caught.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import asdict, dataclass

from invariants.checking.checker import Checker, CheckerHook, Level
from invariants.checking.loader import load_catalog, shipped_catalog
from invariants.explore.explorer import DEFAULT_SEEDS, DEFAULT_STEPS, run_seed
from invariants.explore.generate import generate_trace
from invariants.explore.parallel import spawn_pool
from invariants.mutants import ZOO, FalsePositive, Mutant, Planted, entry
from invariants.report.cells import ReportCell, report_cells, run_cell
from invariants.scenarios.scenario import build_trace
from invariants.scenarios.trace_run import run_trace

GATE_LIMIT_S = 60.0  # the issue's goal per entry; a reported figure, never a pass/fail test


@dataclass(frozen=True, slots=True)
class GateTask:
    """One unit of the gate's traffic: a report cell, or an explore seed."""

    index: int
    cell: ReportCell | None = None
    seed: int = -1

    @property
    def source(self) -> str:
        return self.cell.name if self.cell is not None else f"explore seed {self.seed}"

    @property
    def replay(self) -> str:
        return (
            self.cell.replay
            if self.cell is not None
            else f"kvspec explore --seed-start {self.seed} --seeds 1"
        )


@dataclass(frozen=True, slots=True)
class GateHit:
    """What one task found under an entry: the failure key and its first line."""

    index: int
    key: str
    detail: str


@dataclass(frozen=True, slots=True)
class GateResult:
    """One entry against the gate: caught (with the first hit), missed, or not applicable."""

    name: str
    issue: str
    kind: str
    status: str  # caught | missed | planted
    key: str = ""
    source: str = ""
    replay: str = ""
    detail: str = ""
    seconds: float = 0.0
    tasks_run: int = 0

    @property
    def ok(self) -> bool:
        return self.status != "missed"


def gate_tasks(seeds: int = DEFAULT_SEEDS) -> list[GateTask]:
    """The report's cells in report order, then explore's seeds 0 … ``seeds - 1``."""
    cells = report_cells()
    tasks = [GateTask(i, cell=c) for i, c in enumerate(cells)]
    return tasks + [GateTask(len(cells) + s, seed=s) for s in range(seeds)]


def run_gate_task(name: str, task: GateTask, steps: int = DEFAULT_STEPS) -> GateHit | None:
    """Run one task under entry ``name`` (module-level: workers call it)."""
    found = entry(name)
    if isinstance(found, FalsePositive):
        return _old_rules_hit(found, task, steps)
    assert isinstance(found, Mutant)
    with found.patch():
        return task_hit(task, steps)


def task_hit(task: GateTask, steps: int) -> GateHit | None:
    """What the default gate fails on in this task (None: clean)."""
    if task.cell is not None:
        result = run_cell(task.cell, Level.RECORD)
        if result.violations:
            first = result.violations[0]
            return GateHit(task.index, first["invariant"], first["message"])
        oracles = [u for u in result.unmet if u.startswith(("oracle", "op #"))]
        if result.error is not None:
            return GateHit(task.index, "error:" + result.error.split(":", 1)[0], result.error)
        if oracles:
            return GateHit(task.index, oracles[0].split(":", 1)[0], oracles[0])
        return None
    seed = run_seed(task.seed, steps)
    if seed.failure is None or seed.failure == "config":
        return None
    return GateHit(task.index, seed.failure, seed.detail)


def _old_rules_hit(fp: FalsePositive, task: GateTask, steps: int) -> GateHit | None:
    """The correct engine on the task's trace, the pre-fix rules watching beside the catalog."""
    if task.cell is not None and task.cell.spec is None:
        return None  # a memory-layer cell has no scheduler for a busy or idle check
    trace = (
        build_trace(task.cell.spec) if task.cell is not None else generate_trace(task.seed, steps)
    )
    old = Checker(load_catalog([fp.old_rules_path]), Level.RECORD)
    run_trace(trace, shipped_catalog(), observers=[CheckerHook(old)])
    if not old.violations:
        return None
    first = old.violations[0]
    return GateHit(task.index, first.invariant, first.message)


def gate_entry(
    name: str, tasks: Sequence[GateTask], pool: ProcessPoolExecutor, window: int, steps: int
) -> GateResult:
    """Feed ``tasks`` in order, ``window`` in flight, until one finds something; the hit
    reported is the earliest task among those done when the first came back."""
    found = entry(name)
    if isinstance(found, Planted):
        return GateResult(name, found.issue, found.kind, "planted", detail=found.why)
    start, hits, done = time.perf_counter(), [], 0
    for batch in _completed(name, tasks, pool, window, steps):
        done += len(batch)
        hits += [h for h in batch if h is not None]
        if hits:
            break
    seconds = time.perf_counter() - start
    if not hits:
        return GateResult(name, found.issue, found.kind, "missed", seconds=seconds, tasks_run=done)
    hit = min(hits, key=lambda h: h.index)
    task = tasks[[t.index for t in tasks].index(hit.index)]
    return GateResult(
        name, found.issue, found.kind, "caught", hit.key, task.source, task.replay,
        hit.detail, seconds, done,
    )  # fmt: skip


def _completed(
    name: str, tasks: Sequence[GateTask], pool: ProcessPoolExecutor, window: int, steps: int
) -> Iterator[list[GateHit | None]]:
    """Each round of finished tasks' results; stopping early cancels what is queued."""
    queue, running = list(reversed(tasks)), set[Future]()
    try:
        while queue or running:
            while queue and len(running) < window:
                running.add(pool.submit(run_gate_task, name, queue.pop(), steps))
            finished, running = wait(running, return_when=FIRST_COMPLETED)
            yield [f.result() for f in finished]
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
    tasks, results = gate_tasks(seeds), []
    with spawn_pool(workers) as pool:
        for name in chosen:
            results.append(gate_entry(name, tasks, pool, 2 * workers, steps))
            progress(results[-1])
    return results


def gate_line(result: GateResult) -> str:
    """One entry as one line: status, name, what caught it, when, where, the replay."""
    if result.status == "planted":
        return f"planted  {result.name}: no trace reaches it ({result.detail})"
    if result.status == "missed":
        return (
            f"MISSED   {result.name}: nothing fired in {result.tasks_run} cells and seeds "
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
    reachable = [r for r in results if r.status != "planted"]
    caught = [r for r in reachable if r.status == "caught"]
    slowest = max((r.seconds for r in caught), default=0.0)
    verdict = "PASS" if len(caught) == len(reachable) else "FAIL"
    return (
        f"{verdict}: the default gate caught {len(caught)}/{len(reachable)} reachable entries "
        f"({len(results) - len(reachable)} planted, not reachable by traffic); "
        f"slowest catch {slowest:.1f} s"
    )


def gate_json(results: Sequence[GateResult]) -> list[dict]:
    return [asdict(r) for r in results]


__all__ = [
    "GATE_LIMIT_S",
    "GateResult",
    "GateTask",
    "gate_json",
    "gate_line",
    "gate_tasks",
    "print_gate",
    "run_gate",
    "run_gate_task",
    "summary_line",
    "task_hit",
]
