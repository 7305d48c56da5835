"""Where the report's cells run: in this process, on local worker processes (``--workers N``),
or on Ray actors (``--ray-address``, the optional ``kvspec[ray]`` extra) — the explorers'
fleets (invariants/fleet/), one cell a task.

Keeps: results come back in cell order whatever the backend and however the cells finish,
so every output of the report is deterministic; the progress callback fires once per cell.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from invariants.fleet import FleetError, InProcess, Task, open_fleet
from invariants.report.cells import ReportCell, run_cell
from invariants.report.model import CellResult

Progress = Callable[[CellResult], None]  # called as each cell finishes


BackendError = FleetError  # a backend cannot run (Ray not installed, cluster unreachable)


def run_cells(
    cells: Sequence[ReportCell],
    level: int,
    workers: int = 1,
    ray_address: str | None = None,
    progress: Progress = lambda result: None,
) -> list[CellResult]:
    """Every cell's result, in the order of ``cells``: in this process unless asked (what
    tests use: monkeypatched mutants stay visible), else on the fleet asked for."""
    local = not ray_address and (workers <= 1 or len(cells) <= 1)
    fleet = InProcess() if local else open_fleet(min(workers, len(cells)), ray_address)
    with fleet:
        for i, cell in enumerate(cells):
            fleet.submit(Task(("cell", i), cell_task, (cell, level)))
        results: list[CellResult | None] = [None] * len(cells)
        while fleet.in_flight:
            done = fleet.next_done()
            if done.infra is not None:
                raise FleetError(f"cell {cells[done.task.key[1]].name}: {done.infra}")
            results[done.task.key[1]] = done.result
            progress(done.result)
    return [r for r in results if r is not None]


def cell_task(arg: tuple[ReportCell, int]) -> CellResult:
    """A fleet task: ``run_cell`` of (cell, level)."""
    return run_cell(*arg)
