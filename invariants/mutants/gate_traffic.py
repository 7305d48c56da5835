"""The default gate's traffic (`kvspec bugs --gate`): the `make report` cells and the runs of
`kvspec explore`'s default campaign, interleaved — what a user's two jobs run side by side —
and what one unit of it finds under a zoo entry.

Keeps: the traffic is the same for every entry up to what the entry changes (the report's
cells breadth first — each spec's next cell in turn, in report order, so a bug only one spec
reaches is not queued behind every other spec's matrix; the campaign's fresh seeds, then the
mutants its coverage under that entry asks for, each generation drawn after the last one's
results are in, as `kvspec explore` does); an engine mutant is patched inside the worker
around one unit, so no run outlives its entry; a finding is what the gate fails on — a
violated invariant (a crash is one: engine.*), a failed response oracle, a drain short of
idle — never an unmet ``expect`` goal, which says nothing about correctness.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass

from invariants.checking.checker import Checker, CheckerHook, Level
from invariants.checking.loader import load_catalog, shipped_catalog
from invariants.explore.campaign import Campaign, Run, RunResult, run_one
from invariants.mutants import FalsePositive, Mutant, entry
from invariants.report.cells import ReportCell, report_cells, run_cell
from invariants.scenarios.scenario import build_trace
from invariants.scenarios.trace_run import run_trace


@dataclass(frozen=True, slots=True)
class GateTask:
    """One unit of the gate's traffic: a report cell, or a run of the explore campaign."""

    index: int
    cell: ReportCell | None = None
    run: Run | None = None

    @property
    def source(self) -> str:
        return self.cell.name if self.cell is not None else f"explore {self.run.name}"  # type: ignore[union-attr]

    @property
    def replay(self) -> str:
        if self.cell is not None:
            return self.cell.replay
        assert self.run is not None
        if self.run.trace is None:
            return f"kvspec explore --seed-start {self.run.seed} --seeds 1"
        return f"kvspec explore (the default campaign's run m{self.run.index})"


@dataclass(frozen=True, slots=True)
class GateHit:
    """What one task found under an entry: the failure key and its first line."""

    index: int
    key: str
    detail: str


TaskResult = tuple[GateHit | None, RunResult | None]  # what it found; the campaign's record


class GateTraffic:
    """The interleaved traffic of one entry: report cells and campaign runs, alternately."""

    def __init__(self, seeds: int, steps: int, cells: list[ReportCell] | None = None) -> None:
        self.cells = deque(breadth_first(report_cells() if cells is None else cells))
        self.campaign = Campaign(seeds, steps)
        self.runs: deque[Run] = deque()
        self.outstanding = 0  # runs of the current generation not yet back
        self.results: list[RunResult] = []
        self.counter = itertools.count()
        self.cell_turn = True

    def next_task(self) -> GateTask | None:
        """The next unit (None: nothing can be issued until outstanding runs come back)."""
        if not self.runs and not self.outstanding and not self.campaign.done:
            self.runs.extend(self.campaign.next_generation())
            self.outstanding = len(self.runs)
        self.cell_turn = not self.cell_turn
        sources = (self.cells, self.runs) if self.cell_turn else (self.runs, self.cells)
        for source in sources:
            if source:
                unit = source.popleft()
                if isinstance(unit, Run):
                    return GateTask(next(self.counter), run=unit)
                return GateTask(next(self.counter), cell=unit)
        return None

    def done(self, result: RunResult | None) -> None:
        """A run came back: once its generation is complete, the campaign takes it."""
        if result is None:
            return
        self.results.append(result)
        self.outstanding -= 1
        if not self.outstanding:
            self.campaign.take(self.results)
            self.results = []

    @property
    def exhausted(self) -> bool:
        return not self.cells and not self.runs and not self.outstanding and self.campaign.done


def breadth_first(cells: list[ReportCell]) -> list[ReportCell]:
    """The cells round-robin by spec (memory cells are one group), each group in order."""
    groups: dict[str, list[ReportCell]] = {}
    for cell in cells:
        groups.setdefault(cell.spec.name if cell.spec is not None else "memory", []).append(cell)
    rounds = itertools.zip_longest(*groups.values())
    return [cell for round_ in rounds for cell in round_ if cell is not None]


def run_gate_task(name: str, task: GateTask, steps: int) -> TaskResult:
    """Run one task under entry ``name`` (module-level: workers call it)."""
    found = entry(name)
    if isinstance(found, FalsePositive):
        return old_rules_hit(found, task, steps)
    assert isinstance(found, Mutant)
    with found.patch():
        return task_hit(task, steps)


def task_hit(task: GateTask, steps: int) -> TaskResult:
    """What the default gate fails on in this task (None: clean), and a run's record."""
    if task.cell is not None:
        return _cell_hit(task), None
    assert task.run is not None
    result = run_one(task.run, steps)
    if result.failure is None or result.failure == "config":
        return None, result
    return GateHit(task.index, result.failure, result.detail), result


def _cell_hit(task: GateTask) -> GateHit | None:
    assert task.cell is not None
    result = run_cell(task.cell, Level.RECORD)
    if result.violations:
        first = result.violations[0]
        return GateHit(task.index, first["invariant"], first["message"])
    if result.error is not None:
        return GateHit(task.index, "error:" + result.error.split(":", 1)[0], result.error)
    oracles = [u for u in result.unmet if u.startswith(("oracle", "op #"))]
    if oracles:
        return GateHit(task.index, oracles[0].split(":", 1)[0], oracles[0])
    return None


def old_rules_hit(fp: FalsePositive, task: GateTask, steps: int) -> TaskResult:
    """The correct engine on the task's trace, the pre-fix rules watching beside the catalog."""
    old = Checker(load_catalog([fp.old_rules_path]), Level.RECORD)
    result = None
    if task.cell is not None:
        if task.cell.spec is None:
            return None, None  # a memory-layer cell has no scheduler for a busy or idle check
        run_trace(build_trace(task.cell.spec), shipped_catalog(), observers=[CheckerHook(old)])
    else:
        assert task.run is not None
        result = run_one(task.run, steps, observers=[CheckerHook(old)])
    if not old.violations:
        return None, result
    first = old.violations[0]
    return GateHit(task.index, first.invariant, first.message), result


__all__ = ["GateHit", "GateTask", "GateTraffic", "TaskResult", "run_gate_task", "task_hit"]
