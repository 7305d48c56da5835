"""The zoo run behind `kvspec bugs`: every entry hunted, a rich table, the JSON record.

Keeps: the table shows, per entry, its kind (mutant, probe, planted, false_positive), the
invariant that caught it, the event and step, the seconds of the mutant run and the shrunk
reproducer's length; false-positive rows show the old formula that fired and that the
catalog did not; a planted row has no trace (its reason is printed under the table). Every
row is caught or failing: nothing passes as a known gap.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from invariants.checking.loader import load_catalog
from invariants.explore.ddmin import shrink as shrink_trace
from invariants.mutants import ZOO, Planted, entry
from invariants.mutants.hunt import Finding, Shrinker, hunt

STYLE = {"caught": "green"}


def run_zoo(names: Sequence[str] | None = None, *, shrink: bool = True) -> list[Finding]:
    """Hunt ``names`` (every entry when None), in registry order."""
    chosen = [entry(n) for n in names] if names else list(ZOO)
    catalog = load_catalog()
    shrinker: Shrinker | None = shrink_trace if shrink else None  # the explorer's delta debugging
    return [hunt(e, catalog, shrinker) for e in chosen]


def _caught_cell(f: Finding) -> str:
    if f.entry.kind == "false_positive" and f.ok:
        return f"old formula: {', '.join(f.caught_by)}; catalog: did not fire"
    if f.status == "unexpected":
        return f"unexpected only: {', '.join(f.caught_by)}"
    return ", ".join(f.caught_by) or "-"


def print_findings(findings: Sequence[Finding], console: Console | None = None) -> None:
    """One row per entry, then the totals (median shrunk length over the shrunk ones)."""
    table = Table(title="kvspec bug zoo (research/sglang.md §5)")
    for column in (
        "entry",
        "issue",
        "kind",
        "status",
        "caught by",
        "event",
        "step",
        "seconds",
        "ops",
        "shrunk",
    ):
        table.add_column(column, overflow="fold")
    for f in findings:
        shrunk = "-" if f.shrunk_ops is None else str(f.shrunk_ops)
        status = f"[{STYLE.get(f.status, 'red')}]{f.status}[/]"
        ops = "-" if isinstance(f.entry, Planted) else str(f.trace_ops)
        table.add_row(
            f.entry.name,
            f.entry.issue,
            f.entry.kind,
            status,
            _caught_cell(f),
            f.event or "-",
            "-" if f.step < 0 else str(f.step),
            f"{f.seconds:.2f}",
            ops,
            shrunk,
        )
    console = console or Console()
    console.print(table)
    for f in findings:
        if isinstance(f.entry, Planted) and f.ok:
            console.print(f"[cyan]{f.entry.name}[/] planted: {escape(f.entry.why)}")
        elif not f.ok:
            console.print(f"[{STYLE.get(f.status, 'red')}]{f.entry.name}[/]: {escape(f.detail)}")
    console.print(summary_line(findings))


def summary_line(findings: Sequence[Finding]) -> str:
    caught = sum(f.ok for f in findings)
    planted = sum(isinstance(f.entry, Planted) for f in findings)
    shrunk = [f.shrunk_ops for f in findings if f.shrunk_ops is not None]
    median = f"{statistics.median(shrunk):g} ops" if shrunk else "-"
    slowest = max((f.seconds for f in findings), default=0.0)
    return (
        f"{caught}/{len(findings)} caught ({planted} planted), {len(findings) - caught} failing; "
        f"slowest mutant run {slowest:.2f} s; median shrunk trace {median}"
    )


def zoo_json(findings: Sequence[Finding]) -> list[dict[str, Any]]:
    return [
        {
            "name": f.entry.name,
            "issue": f.entry.issue,
            "kind": f.entry.kind,
            "status": f.status,
            "caught_by": list(f.caught_by),
            "expect": sorted(f.entry.expect),
            "event": f.event,
            "step": f.step,
            "seconds": round(f.seconds, 4),
            "trace_ops": None if isinstance(f.entry, Planted) else f.trace_ops,
            "shrunk_ops": f.shrunk_ops,
            "trigger": f"specs/bugs/{f.entry.trigger}" if f.entry.trigger else None,
            "why_planted": getattr(f.entry, "why", None),
            "detail": f.detail,
        }
        for f in findings
    ]


__all__ = ["print_findings", "run_zoo", "summary_line", "zoo_json"]
