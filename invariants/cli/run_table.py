"""What `kvspec run` prints, one cell or a matrix alike: the verdict table (steps, finished,
checks, violations, first violation, goals, time), then each failing cell's replay command
and first findings, then one verdict line.

Keeps: a failing cell is never shown without the command that replays it; the findings are
the trace run's own lines (each violation with the op it followed).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.console import Console
from rich.text import Text

from invariants.report.text import goals_text
from invariants.scenarios.runner import SpecOutcome
from invariants.terminal import Col, Format, print_table, seconds, verdict_line

COLS = (
    Col("cell"),
    Col("steps", "num"),
    Col("finished", "num"),
    Col("checks", "num"),
    Col("violations", "num"),
    Col("first violation"),
    Col("goals"),
    Col("time", "num"),
)


@dataclass(frozen=True, slots=True)
class RunResult:
    """One cell run: its name, the command that replays it, what it did."""

    name: str
    replay: str
    outcome: SpecOutcome


def _row(r: RunResult) -> list[str | int | Text]:
    out = r.outcome
    first = out.violations[0] if out.violations else None
    count = len(out.violations)
    return [
        Text(r.name, style="green" if out.ok else "red"),
        out.stats.iterations,
        out.stats.finished_reqs,
        out.checks,
        Text(str(count), style="red" if count else "green"),
        f"{first.invariant} @ step {first.step}" if first else "",
        goals_text(out.error, out.unmet),
        seconds(out.seconds),
    ]


def print_runs(console: Console, results: Sequence[RunResult], fmt: Format) -> int:
    """The table, the failures, the verdict line; returns the exit code (1: a cell failed)."""
    print_table(console, COLS, [_row(r) for r in results], fmt)
    failed = [r for r in results if not r.outcome.ok]
    if fmt is Format.json:
        return 1 if failed else 0
    for r in failed:
        console.print(Text.assemble(("FAIL ", "bold red"), r.name), soft_wrap=True)
        console.print(f"  replay: {r.replay}", markup=False, soft_wrap=True)
        details = r.outcome.trace_outcome.describe(limit=3)
        for line in [*details.splitlines(), *(f"expected {g}" for g in r.outcome.unmet)]:
            console.print(f"  {line}", markup=False, soft_wrap=True)
    violations = sum(len(r.outcome.violations) for r in results)
    facts = [
        f"{len(results) - len(failed)}/{len(results)} cells passed",
        f"{sum(r.outcome.checks for r in results)} checks",
        f"{violations} violation{'s' * (violations != 1)}",
        seconds(sum(r.outcome.seconds for r in results)),
    ]
    console.print(verdict_line(not failed, facts), soft_wrap=True)
    return 1 if failed else 0
