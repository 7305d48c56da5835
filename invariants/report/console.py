"""What `kvspec report` prints once its cells ran, in this order: the verdict line, each
failing cell's first findings with its replay command, the summary (one row per spec, its
cells folded in), the matrix cells constraints exclude (one line per constraint), the real
engines side by side and their failures, and the verdict line again with where the files are.

Keeps: the printed report hides nothing the files show — every failing cell is listed with
the command that replays it — and reads the same plain data (model.py) and small texts
(text.py) as every other format; ids and numbers are never cut (invariants/terminal.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.text import Text

from invariants.report.model import CellResult, ReportHeader, SideBySide
from invariants.report.target_view import print_side_by_side, print_target_failures
from invariants.report.targets import rows_word
from invariants.report.text import goals_text, violation_line
from invariants.scenarios.matrix import Exclusion
from invariants.terminal import Col, Format, print_table, seconds, verdict_line


def print_report(
    console: Console,
    header: ReportHeader,
    results: list[CellResult],
    pairs: list[SideBySide] | None,
    excluded: list[Exclusion],
    *,
    table: bool = True,
    fmt: Format = Format.table,
) -> int:
    """Print the report (``table`` False: without the summary, as on real targets alone;
    ``fmt`` plain or json: every cell as one row, nothing else); the number of failing cells
    and real-engine rows."""
    failed = sum(not r.ok for r in results)
    if fmt is not Format.table:
        print_table(console, CELL_COLS, [cell_row(r) for r in results], fmt)
        return failed
    console.print(report_verdict(header, results, pairs), soft_wrap=True)
    print_failures(console, results)
    if table:
        print_table(console, SPEC_COLS, spec_rows(results), title=f"kvspec report — {header.title}")
    for line in exclusion_lines(excluded):
        console.print(line, markup=False)  # a description: wraps at words
    if pairs is not None:
        print_side_by_side(console, pairs)
        failed += print_target_failures(console, pairs)
    return failed


def report_verdict(
    header: ReportHeader,
    results: Sequence[CellResult],
    pairs: Sequence[SideBySide] | None,
    wall: float | None = None,
    out: Path | None = None,
) -> Text:
    """PASS/FAIL · cells passed · checks · violations · time · where the files are."""
    rows_failed = sum(not p.row.ok for p in pairs or ())
    cells_failed = sum(not r.ok for r in results)
    violations = sum(r.num_violations for r in results)
    facts = [
        f"{len(results) - cells_failed}/{len(results)} cells passed",
        f"{sum(r.checks for r in results):,} checks",
        f"{violations} violation{'s' * (violations != 1)}",
    ]
    facts += [f"{rows_failed} {rows_word(pairs or ())} rows failed"] if rows_failed else []
    facts += [seconds(wall)] if wall is not None else []
    facts += [f"files in {out}/"] if out else []
    return verdict_line(not cells_failed and not rows_failed, facts)


CELL_COLS = (
    Col("cell"),
    Col("steps", "num"),
    Col("finished", "num"),
    Col("cached", "num"),
    Col("evicted", "num"),
    Col("retracts", "num"),
    Col("checks", "num"),
    Col("violations", "num"),
    Col("first violation"),
    Col("goals"),
    Col("seconds", "num"),
)
SPEC_COLS = (
    Col("spec"),
    Col("cells", "num"),
    Col("passed", "num"),
    Col("steps", "num"),
    Col("checks", "num"),
    Col("violations", "num"),
    Col("first violation"),
    Col("time", "num"),
)


def cell_row(r: CellResult) -> list[str | int | float]:
    """One cell as plain values (``--format plain|json``)."""
    counters = [r.counters.get(c, "") for c in ("finished", "cached", "evicted", "retracts")]
    goals = goals_text(r.error, r.unmet, "met" if r.kind == "spec" else "")
    return [r.name, r.steps, *counters, r.checks, r.num_violations, r.first_violation, goals,
            round(r.seconds, 3)]  # fmt: skip


def spec_rows(results: Sequence[CellResult]) -> list[list[str | int | Text]]:
    """One row per spec (its matrix cells and as-written run folded in; the memory-layer
    cells as one row), in report order."""
    groups: dict[str, list[CellResult]] = {}
    for r in results:
        groups.setdefault(r.name.split(" ")[0] if r.kind == "spec" else "memory", []).append(r)
    rows: list[list[str | int | Text]] = []
    for name, cells in groups.items():
        bad = [c for c in cells if not c.ok]
        violations = sum(c.num_violations for c in cells)
        first = next((c for c in cells if c.num_violations), None)
        rows.append([
            Text(name, style="red" if bad else "green"),
            len(cells),
            Text(str(len(cells) - len(bad)), style="red" if bad else "green"),
            sum(c.steps for c in cells),
            sum(c.checks for c in cells),
            Text(str(violations), style="red" if violations else "green"),
            f"{first.first_violation} ({first.name})" if first else "",
            seconds(sum(c.seconds for c in cells)),
        ])  # fmt: skip
    return rows


def exclusion_lines(exclusions: list[Exclusion]) -> list[str]:
    """One line per constraint: how many product cells it rules out, in how many specs, and
    why (ci/matrix.yaml; report.json and report.md list every cell)."""
    by_constraint: dict[str, list[Exclusion]] = {}
    for x in exclusions:
        by_constraint.setdefault(x.constraint, []).append(x)
    return [
        f"excluded: {sum(len(x.cells) for x in xs)} cells in {len(xs)} specs by "
        f"`{constraint}` — {xs[0].reason}"
        for constraint, xs in by_constraint.items()
    ]


def print_failures(console: Console, results: list[CellResult]) -> int:
    """The first violations, unmet goals and crash of each failing cell, with its replay."""
    failed = [r for r in results if not r.ok]
    for r in failed:
        console.print(Text.assemble(("FAIL ", "bold red"), r.name), soft_wrap=True)
        console.print(f"  replay: {r.replay}", markup=False, soft_wrap=True)
        for violation in r.violations[:3]:
            console.print(f"  {violation_line(violation)}", markup=False, soft_wrap=True)
        for goal in r.unmet:
            console.print(f"  expected {goal}", markup=False, soft_wrap=True)
        if r.error:
            console.print(f"  engine error: {r.error}", markup=False, soft_wrap=True)
    return len(failed)
