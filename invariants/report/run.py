"""`kvspec report`: lint the catalog, run every report cell (scenario specs, the configuration
matrix, the memory-layer exercise) checked at level 1 with a progress bar, print the summary
table (console.py), and write report.json, junit.xml, report.md and report.html (files.py).

Keeps: the report never hides a failure — every violation, unmet `expect` goal and crash is
counted in its row, the first few are printed with the command that replays the row, and the
exit code is 1 if any row has one (DESIGN.md decision 3). Every invariant of the catalog is
evaluated at every event it subscribes to (census and KV integrity included); level 1 records
each violation and runs on, so a cell reports all of them, not just the first.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from invariants.checking.checker import Level
from invariants.checking.loader import lint, shipped_catalog
from invariants.report.backends import import_ray, run_cells
from invariants.report.cells import ReportCell, default_specs, memory_report_cells, spec_cells
from invariants.report.console import print_report, report_verdict
from invariants.report.files import write_report
from invariants.report.memory_cells import MemoryCell
from invariants.report.model import CellResult, ReportHeader, SideBySide, TargetRow
from invariants.report.targets import (
    REAL_TARGETS,
    TARGETS,
    as_written_cells,
    run_sglang_rows,
    side_by_side,
)
from invariants.report.terminal import Format, out_console
from invariants.scenarios.matrix import Exclusion, report_exclusions

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
    sglang_python: str | None = None,
    specs: list[tuple[str, Path]] | None = None,
    sglang_driver: Any = None,
    sglang_version: str | None = None,
    fmt: Format = Format.table,
) -> int:
    """Run the report; write its files into ``out`` (none when None); return the exit code
    (1 on any lint error, violation, unmet goal or crash). ``cells`` replaces the default set.
    ``target`` sglang / sglang-scheduler: every spec of ``specs`` (default: all) as written on
    kvspec and on SGLang's memory classes / real scheduler (``sglang_version``), side by side;
    both: the kvspec report plus the sglang one (no sglang: ``SGLangUnavailable`` up front);
    ``fmt`` plain or json: one row per cell, nothing else."""
    if ray_address:
        import_ray()  # fail before any work when the extra is missing
    began, console = time.perf_counter(), console or out_console()
    errors = _lint(console)
    sglang_specs = (default_specs() if specs is None else specs) if target != "kvspec" else []
    args = (sglang_specs, level, sglang_python, sglang_driver, sglang_version)
    alone = target in REAL_TARGETS + ("all",)  # the specs as written, no table
    excluded = report_exclusions() if cells is None and with_matrix and not alone else []
    cells = _target_cells(cells, target, sglang_specs, full, with_matrix, memory_cells)
    rows = _target_rows(console, target, *args)
    results = _run_with_progress(console, cells, level, workers, ray_address)
    pairs = None if rows is None else side_by_side(results, rows)
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


def _target_rows(
    console: Console,
    target: str,
    specs: list[tuple[str, Path]],
    level: int,
    python: str | None,
    driver: Any,
    version: str | None,
) -> list[TargetRow] | None:
    """The sglang, sglang-scheduler or vllm rows, or all three's one after another (None:
    no such target in this report)."""
    if target == "all":
        return [
            row
            for real in REAL_TARGETS
            for row in _target_rows(console, real, specs, level, python, driver, version) or ()
        ]
    if target == "sglang-scheduler":
        return _scheduler_rows(console, specs, version, python)
    if target == "vllm":
        from invariants.report.targets import run_vllm_rows

        with _row_progress(console, "vllm", len(specs)) as advance:
            return run_vllm_rows(specs, level, advance)
    return _sglang_rows(console, specs, level, python, driver)


def _lint(console: Console) -> list[str]:
    """The catalog's lint errors, printed."""
    errors = lint()
    for error in errors:
        console.print(f"lint: {error}", markup=False)
    return errors


def _target_cells(
    cells: list[ReportCell] | None,
    target: str,
    specs: list[tuple[str, Path]],
    full: bool,
    with_matrix: bool,
    memory_cells: list[MemoryCell] | None,
) -> list[ReportCell]:
    """The kvspec cells a target runs: the report's own (kvspec), each spec as written
    (sglang), or both — the report's own plus any spec as written that is not among them."""
    if target not in TARGETS:
        raise ValueError(f"target {target!r}: choose one of {', '.join(TARGETS)}")
    if target in REAL_TARGETS + ("all",):
        return as_written_cells(specs)
    own = (
        cells
        if cells is not None
        else spec_cells(full, with_matrix) + memory_report_cells(memory_cells)
    )
    return own + as_written_cells(specs, {c.name for c in own})


def _sglang_rows(
    console: Console, specs: list[tuple[str, Path]], level: int, python: str | None, driver: Any
) -> list[TargetRow] | None:
    """Every spec on the sglang target, one driver, with a progress bar (no specs: None, the
    sglang target does not run)."""
    if not specs:
        return None
    with _row_progress(console, "sglang", len(specs)) as advance:
        return run_sglang_rows(specs, level, python, advance, driver=driver)


def _scheduler_rows(
    console: Console, specs: list[tuple[str, Path]], version: str | None, python: str | None
) -> list[TargetRow]:
    """Every spec on SGLang's real scheduler, one driver, with a progress bar."""
    from invariants.report.scheduler_rows import run_scheduler_rows

    with _row_progress(console, "sglang-scheduler", len(specs)) as advance:
        return run_scheduler_rows(specs, version, python, advance)


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
