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
from rich.text import Text

from invariants.checking.loader import load_catalog
from invariants.explore.ddmin import shrink as shrink_trace
from invariants.mutants import ZOO, Planted, entry
from invariants.mutants.hunt import Finding, Shrinker, hunt
from invariants.terminal import Col, Format, out_console, print_table, verdict_line

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


COLS = (
    Col("entry"),
    Col("issue", "text"),
    Col("kind"),
    Col("status"),
    Col("caught by"),
    Col("event"),
    Col("step", "num"),
    Col("seconds", "num"),
    Col("ops", "num"),
    Col("shrunk", "num"),
)


def print_findings(
    findings: Sequence[Finding], console: Console | None = None, fmt: Format = Format.table
) -> None:
    """One row per entry (ids whole, the issue wraps), then the notes and the totals (median
    shrunk length over the shrunk ones)."""
    console = console or out_console()
    rows = [
        [
            f.entry.name,
            f.entry.issue,
            f.entry.kind,
            Text(f.status, style=STYLE.get(f.status, "red")),
            _caught_cell(f),
            f.event or "-",
            "-" if f.step < 0 else f.step,
            round(f.seconds, 2),
            "-" if isinstance(f.entry, Planted) else f.trace_ops,
            "-" if f.shrunk_ops is None else f.shrunk_ops,
        ]
        for f in findings
    ]
    print_table(console, COLS, rows, fmt, title="kvspec bug zoo (docs/sglang.md §5)")
    if fmt is Format.json:
        return
    for f in findings:
        if isinstance(f.entry, Planted) and f.ok:
            console.print(f"[cyan]{f.entry.name}[/] planted: {escape(f.entry.why)}")
        elif not f.ok:
            console.print(f"[{STYLE.get(f.status, 'red')}]{f.entry.name}[/]: {escape(f.detail)}")
    console.print(verdict_line(all(f.ok for f in findings), [summary_line(findings)]))


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
