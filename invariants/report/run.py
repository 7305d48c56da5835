"""`kvspec report`: lint the catalog, run every report cell (scenario specs, the configuration
matrix, the memory-layer exercise) checked at level 1 with a progress bar, print the summary
table (console.py), and write report.json, junit.xml, report.md and report.html (files.py).

Keeps: the report never hides a failure — every violation, unmet `expect` goal and crash is
counted in its row, the first few are printed with the command that replays the row, and the
exit code is 1 if any row has one (docs/design.md decision 3). Every invariant of the catalog is
evaluated at every event it subscribes to (census and KV integrity included); level 1 records
each violation and runs on, so a cell reports all of them, not just the first.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from invariants.checking.checker import Level
from invariants.checking.loader import lint, shipped_catalog
from invariants.fleet import import_ray
from invariants.report.backends import run_cells
from invariants.report.cells import ReportCell, default_specs, memory_report_cells, spec_cells
from invariants.report.console import print_report, report_verdict
from invariants.report.files import write_report
from invariants.report.memory_cells import MemoryCell
from invariants.report.model import CellResult, ReportHeader, SideBySide, TargetRow
from invariants.report.targets import as_written_cells, chosen_targets, side_by_side, target_rows
from invariants.scenarios.matrix import Exclusion, report_exclusions
from invariants.targets.driver import LineDriver
from invariants.targets.registry import TargetOptions, target
from invariants.terminal import Format, out_console

__all__ = ["default_specs", "default_workers", "run_report"]


def default_workers() -> int:
    """One worker per CPU this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def run_report(
    level: int = Level.RECORD,
    console: Console | None = None,
    with_matrix: bool = True,
    memory_cells: list[MemoryCell] | None = None,
    *,
    out: Path | None = None,
    full: bool = False,
    workers: int = 1,
    ray_address: str | None = None,
    cells: list[ReportCell] | None = None,
    target: str = "kvspec",
    options: TargetOptions | None = None,
    specs: list[tuple[str, Path]] | None = None,
    driver: LineDriver | None = None,
    fmt: Format = Format.table,
) -> int:
    """Run the report; write its files into ``out`` (none when None); return the exit code
    (1 on any lint error, violation, unmet goal or crash). ``cells`` replaces the default set.
    ``target``: the targets (targets.chosen_targets) — a real engine's rows are every spec of
    ``specs`` (default: all) as written on kvspec and on it, side by side (no driver:
    ``TargetUnavailable`` up front); ``kvspec`` among them: the whole kvspec report too;
    ``driver``: a running one for its own target (tests); ``fmt`` plain or json: one row per
    cell, nothing else."""
    began, console = time.perf_counter(), console or out_console()
    errors = _lint(console, ray_address)
    names = chosen_targets(target)
    real, alone = [n for n in names if n != "kvspec"], "kvspec" not in names
    spec_list = (default_specs() if specs is None else specs) if real else []
    excluded = report_exclusions() if cells is None and with_matrix and not alone else []
    cells = _target_cells(cells, alone, spec_list, full, with_matrix, memory_cells)
    rows = _all_rows(console, real, spec_list, level, options or TargetOptions(), driver)
    results = _run_with_progress(console, cells, level, workers, ray_address)
    pairs = side_by_side(results, rows) if real else None
    header = ReportHeader.for_run(len(shipped_catalog()), level, full, workers, ray_address)
    failed = print_report(console, header, results, pairs, excluded, table=not alone, fmt=fmt)
    _finish(console, header, results, pairs, excluded, out, fmt, time.perf_counter() - began)
    return 1 if errors or failed else 0


def _finish(
    console: Console,
    header: ReportHeader,
    results: list[CellResult],
    pairs: list[SideBySide] | None,
    excluded: list[Exclusion],
    out: Path | None,
    fmt: Format,
    wall: float,
) -> None:
    """The files, then (as a table) the verdict line again, with where they are."""
    if out is not None:
        write_report(out, header, results, pairs, excluded)
    if fmt is Format.table:
        console.print(report_verdict(header, results, pairs, wall, out), soft_wrap=True)


def _all_rows(
    console: Console,
    names: list[str],
    specs: list[tuple[str, Path]],
    level: int,
    options: TargetOptions,
    driver: LineDriver | None,
) -> list[TargetRow]:
    """Every real target's rows, one target after another."""
    return [row for name in names for row in _rows(console, name, specs, level, options, driver)]


def _rows(
    console: Console,
    name: str,
    specs: list[tuple[str, Path]],
    level: int,
    options: TargetOptions,
    driver: LineDriver | None,
) -> list[TargetRow]:
    """Every spec on target ``name``, one driver (``driver`` when it is that target's), with
    a progress bar."""
    given = driver if driver is not None and driver.target == name else None
    with _row_progress(console, name, len(specs)) as advance:
        return target_rows(target(name), specs, level, options, advance, driver=given)


def _lint(console: Console, ray_address: str | None) -> list[str]:
    """The catalog's lint errors, printed (first: Ray, when asked for, must import)."""
    if ray_address:
        import_ray()  # fail before any work when the extra is missing
    errors = lint()
    for error in errors:
        console.print(f"lint: {error}", markup=False)
    return errors


def _target_cells(
    cells: list[ReportCell] | None,
    alone: bool,
    specs: list[tuple[str, Path]],
    full: bool,
    with_matrix: bool,
    memory_cells: list[MemoryCell] | None,
) -> list[ReportCell]:
    """The kvspec cells a report runs: each spec as written (real targets ``alone``), or the
    report's own plus any spec as written that is not among them."""
    if alone:
        return as_written_cells(specs)
    own = (
        cells
        if cells is not None
        else spec_cells(full, with_matrix) + memory_report_cells(memory_cells)
    )
    return own + as_written_cells(specs, {c.name for c in own})


@contextlib.contextmanager
def _row_progress(
    console: Console, label: str, total: int
) -> Iterator[Callable[[TargetRow], None]]:
    """A progress bar over a target's rows; yields the per-row callback."""
    columns = (
        TextColumn(f"[bold]{label}[/bold]"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
    )
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("starting the driver", total=total)

        def advance(row: TargetRow) -> None:
            mark = (
                "[red]FAIL[/red]"
                if not row.ok
                else "[yellow]unsupported[/yellow]"
                if row.unsupported
                else "[green]ok[/green]"
            )
            progress.update(task, advance=1, description=f"{mark} {row.name}")

        yield advance


def _run_with_progress(
    console: Console, cells: list[ReportCell], level: int, workers: int, ray_address: str | None
) -> list[CellResult]:
    where = f"ray {ray_address}" if ray_address else f"{workers} worker{'s' if workers > 1 else ''}"
    columns = (
        TextColumn("[bold]cells[/bold]"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
    )
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task(where, total=len(cells))

        def advance(result: CellResult) -> None:
            mark = "[green]ok[/green]" if result.ok else "[red]FAIL[/red]"
            progress.update(task, advance=1, description=f"{where} · {mark} {result.name}")

        return run_cells(cells, level, workers, ray_address, advance)
