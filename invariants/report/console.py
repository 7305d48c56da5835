"""What `kvspec report` prints once its cells ran: the summary table (spec × cell), the matrix
cells constraints exclude, each failing cell's first findings with its replay command, then
the sglang side by side and its failures.

Keeps: the printed report hides nothing the files show — every failing cell is listed with
the command that replays it — and reads the same plain data (model.py) and small texts
(text.py) as every other format.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from invariants.report.model import CellResult, ReportHeader, SideBySide
from invariants.report.target_view import print_target_failures, side_by_side_table
from invariants.report.text import goals_text, violation_line
from invariants.scenarios.matrix import Exclusion


def print_report(
    console: Console,
    header: ReportHeader,
    results: list[CellResult],
    pairs: list[SideBySide] | None,
    excluded: list[Exclusion],
    *,
    table: bool = True,
) -> int:
    """Print the report (``table`` False: without the summary table, as on the sglang target
    alone); the number of failing cells and sglang rows."""
    if table:
        console.print(summary_table(header, results))
    if excluded:
        console.print(exclusions_table(excluded))
    failed = print_failures(console, results)
    if pairs is not None:
        console.print(side_by_side_table(pairs))
        failed += print_target_failures(console, pairs)
    return failed


def summary_table(header: ReportHeader, results: list[CellResult]) -> Table:
    """Spec × cell: steps, checks evaluated, violations, the first violation, goals, counters."""
    table = Table(title=f"kvspec report — {header.title}", caption=header.evaluation)
    for column in (
        "spec / cell",
        "steps",
        "finished",
        "cached",
        "evicted",
        "retracts",
        "checks",
        "violations",
        "first violation",
        "goals",
        "time",
    ):
        text = column in ("spec / cell", "first violation")
        table.add_column(
            column, justify="left" if text else "right", no_wrap=not text, overflow="fold"
        )
    kind = None
    for r in results:
        if kind is not None and r.kind != kind:
            table.add_section()
        kind = r.kind
        verdict = f"[red]{r.num_violations}[/red]" if r.num_violations else "[green]0[/green]"
        table.add_row(
            r.name,
            str(r.steps),
            *(str(r.counters.get(c, "")) for c in ("finished", "cached", "evicted", "retracts")),
            str(r.checks),
            verdict,
            r.first_violation,
            _goals(r),
            f"{r.seconds:.2f}s",
        )
    return table


def _goals(r: CellResult) -> str:
    text = goals_text(r.error, r.unmet, "met" if r.kind == "spec" else "")
    colour = "red" if r.error or r.unmet else "green"
    return f"[{colour}]{text}[/{colour}]" if text else ""


def exclusions_table(exclusions: list[Exclusion]) -> Table:
    """Per spec, the matrix cells a declared constraint rules out: how many, which
    constraint, and its reason (ci/matrix.yaml; report.json lists every cell)."""
    total = sum(len(x.cells) for x in exclusions)
    table = Table(title=f"excluded by constraints: {total} product cells (never run, never hidden)")
    for column in ("spec", "cells", "constraint", "reason"):
        table.add_column(
            column,
            justify="right" if column == "cells" else "left",
            overflow="fold",
            no_wrap=column != "reason",
        )
    spec = None
    for x in exclusions:
        table.add_row("" if x.spec == spec else x.spec, str(len(x.cells)), x.constraint, x.reason)
        spec = x.spec
    return table


def print_failures(console: Console, results: list[CellResult]) -> int:
    """The first violations, unmet goals and crash of each failing cell, with its replay."""
    failed = [r for r in results if not r.ok]
    for r in failed:
        console.print(f"[red]{r.name}[/red]: replay with `{r.replay}`", highlight=False)
        for violation in r.violations[:3]:
            console.print(f"  {violation_line(violation)}", markup=False)
        for goal in r.unmet:
            console.print(f"  expected {goal}", markup=False)
        if r.error:
            console.print(f"  engine error: {r.error}", markup=False)
    return len(failed)
