"""report.html: one self-contained page — the verdict and what was checked, the summary table
(failing cells first, each row linking to its cell), then per cell its replay command, its
first violations and a stacked plot of each pool's ownership buckets over the steps.

Keeps: no script, no stylesheet or font from elsewhere (the page must open on a machine
without a network); every text from a run is HTML-escaped.
"""

from __future__ import annotations

from html import escape
from typing import Any

from invariants.report.model import (
    LISTED_IN_TEXT,
    CellResult,
    ReportHeader,
    SideBySide,
    failing_first,
)
from invariants.report.svg import legend, pool_plot
from invariants.report.target_view import target_html
from invariants.report.targets import verdict
from invariants.report.text import goals_text, violation_line

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px; color: #1d2430; background: #fff; }
h1 { margin: 0 0 4px; font-size: 22px; } h2 { font-size: 17px; margin: 22px 0 8px; }
h3 { font-size: 15px; margin: 0 0 4px; }
.pass { color: #207a3c; } .fail { color: #c0262d; }
table { border-collapse: collapse; font-size: 13px; }
th, td { padding: 3px 8px; border-bottom: 1px solid #e3e6ea; text-align: right; }
th { background: #f3f5f7; position: sticky; top: 0; }
td.name, th.name, td.first { text-align: left; } td.name a { color: inherit; }
tr.failed td { background: #fdecec; }
code { background: #f3f5f7; padding: 1px 4px; border-radius: 3px; font-size: 12px; }
section.cell { border-top: 1px solid #e3e6ea; padding: 12px 0; }
.plots { display: flex; flex-wrap: wrap; gap: 12px; }
svg.plot text { font: 11px system-ui, sans-serif; fill: #4a5565; }
svg.plot .caption { font-weight: 600; fill: #1d2430; }
svg.plot .axis { stroke: #8a94a3; } svg.plot .capacity { stroke: #1d2430; stroke-dasharray: 3 3; }
.legend { margin: 8px 0; } .key { margin-right: 14px; white-space: nowrap; }
.key i { display: inline-block; width: 12px; height: 12px; margin-right: 5px;
        vertical-align: -1px; }
ul.violations { margin: 4px 0; padding-left: 18px; font-size: 12px; }
"""


def render_html(
    header: ReportHeader,
    results: list[CellResult],
    totals: dict[str, Any],
    sglang: list[SideBySide] | None = None,
) -> str:
    """The whole page (``sglang``: with the side-by-side section after the summary)."""
    ordered = failing_first(results)
    anchors = {id(r): f"cell-{i}" for i, r in enumerate(results)}
    text = verdict(totals, sglang)
    mark = f'<span class="{"pass" if text == "PASS" else "fail"}">{escape(text)}</span>'
    body = [
        f"<h1>kvspec report: {mark}</h1>",
        (
            f"<p>{escape(header.title)}; {escape(header.evaluation)}.<br>"
            f"Matrix {escape(header.matrix)}; ran on {escape(header.backend)}; kvspec "
            f"{escape(header.version)}, Python {escape(header.python)}. {totals['checks']} checks "
            f"evaluated, {totals['violations']} violations, {totals['unmet_goals']} unmet goals, "
            f"{totals['crashed']} crashes.</p>"
        ),
        "<h2>Summary</h2>",
        _table(ordered, anchors),
        *([target_html(sglang)] if sglang is not None else []),
        "<h2>Pools over steps</h2>",
        legend(),
    ]
    body += [_cell_section(r, anchors[id(r)]) for r in ordered]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>kvspec report</title><style>{STYLE}</style></head><body>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )


def _table(results: list[CellResult], anchors: dict[int, str]) -> str:
    head = "".join(
        f'<th class="{"name" if h in ("cell", "first violation") else ""}">{h}</th>'
        for h in ("", "cell", "steps", "checks", "violations", "first violation", "goals", "time")
    )
    rows = []
    for r in results:
        mark = '<span class="pass">✔</span>' if r.ok else '<span class="fail">✘</span>'
        rows.append(
            f'<tr class="{"ok" if r.ok else "failed"}"><td>{mark}</td>'
            f'<td class="name"><a href="#{anchors[id(r)]}">{escape(r.name)}</a></td>'
            f"<td>{r.steps}</td><td>{r.checks}</td><td>{r.num_violations}</td>"
            f'<td class="first">{escape(r.first_violation)}</td>'
            f"<td>{escape(goals_text(r.error, r.unmet, 'met' if r.kind == 'spec' else '—'))}</td>"
            f"<td>{r.seconds:.2f}s</td></tr>"
        )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _cell_section(r: CellResult, anchor: str) -> str:
    status = '<span class="pass">passed</span>' if r.ok else '<span class="fail">failed</span>'
    parts = [
        f'<section class="cell" id="{anchor}"><h3>{escape(r.name)} — {status}</h3>',
        (
            f"<p>{r.steps} steps, {r.checks} checks, {r.num_violations} violations · replay: "
            f"<code>{escape(r.replay)}</code></p>"
        ),
    ]
    problems = [f"<li>{escape(violation_line(v))}</li>" for v in r.violations[:LISTED_IN_TEXT]]
    problems += [f"<li>expected {escape(goal)}</li>" for goal in r.unmet]
    if r.error:
        problems.append(f"<li>engine error: {escape(r.error)}</li>")
    if problems:
        parts.append(f'<ul class="violations">{"".join(problems)}</ul>')
    plots = [
        pool_plot(series, r.timeline.marks, f"{name} pool (tokens)")
        for name, series in r.timeline.pools.items()
    ]
    parts.append(f'<div class="plots">{"".join(plots)}</div></section>')
    return "".join(parts)
