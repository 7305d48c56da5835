"""Where the report's cells run: in this process, on a pool of local worker processes
(``--workers N``), or on a Ray cluster (``--ray-address``, the optional ``kvspec[ray]`` extra).

Keeps: results come back in cell order whatever the backend and however the cells finish,
so every output of the report is deterministic; the progress callback fires once per cell.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed

from invariants.fleet import FleetError, import_ray
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
    """Every cell's result, in the order of ``cells``."""
    if ray_address:
        return run_on_ray(cells, level, ray_address, progress)
    if workers > 1 and len(cells) > 1:
        return run_on_processes(cells, level, workers, progress)
    results = []
    for cell in cells:  # in-process: what tests use (monkeypatched mutants stay visible)
        results.append(run_cell(cell, level))
        progress(results[-1])
    return results


def run_on_processes(
    cells: Sequence[ReportCell], level: int, workers: int, progress: Progress
) -> list[CellResult]:
    """A spawn-context process pool (safe with threads and torch in the parent)."""
    results: list[CellResult | None] = [None] * len(cells)
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(workers, len(cells)), mp_context=context) as pool:
        futures = {pool.submit(run_cell, cell, level): i for i, cell in enumerate(cells)}
        for future in as_completed(futures):
            results[futures[future]] = future.result()
            progress(future.result())
    return [r for r in results if r is not None]


def run_on_ray(
    cells: Sequence[ReportCell], level: int, address: str, progress: Progress
) -> list[CellResult]:
    """One Ray task per cell. ``address``: a cluster (``ray://host:10001``, ``auto``) or
    ``local`` for a fresh local instance; every node needs kvspec installed."""
    ray = import_ray()
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(address=address, log_to_driver=False)  # "local": a fresh instance
    try:
        remote = ray.remote(run_cell)
        refs = [remote.remote(cell, level) for cell in cells]
        index = {ref: i for i, ref in enumerate(refs)}
        results: list[CellResult | None] = [None] * len(cells)
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            results[index[done[0]]] = ray.get(done[0])
            progress(results[index[done[0]]])  # type: ignore[arg-type]
        return [r for r in results if r is not None]
    finally:
        if started_here:
            ray.shutdown()
