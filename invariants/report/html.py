"""report.html: one self-contained page — the verdict and what was checked, a filter box
(words of the cell name: spec, axis values; status), the summary table (failing cells first,
each row linking to its cell), then per cell its replay command, its first violations and a
stacked plot of each pool's ownership buckets over the steps.

Keeps: nothing from elsewhere (no script, stylesheet or font: the page opens on a machine
without a network); the one inline script only filters (``#q=words&status=failed`` in the
address does the same on load); a cell's plots are laid out only when its section is open
(failing cells open, passing ones folded) and in view (``content-visibility``); every text
from a run is HTML-escaped.
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
.pass { color: #207a3c; } .fail { color: #c0262d; }
table { border-collapse: collapse; font-size: 13px; }
th, td { padding: 3px 8px; border-bottom: 1px solid #e3e6ea; text-align: right; }
th { background: #f3f5f7; position: sticky; top: 0; }
td.name, th.name, td.first { text-align: left; } td.name a { color: inherit; }
tr.failed td, td.failed { background: #fdecec; } td.unsupported, td.missing { color: #8a6d00; }
code { background: #f3f5f7; padding: 1px 4px; border-radius: 3px; font-size: 12px; }
details.cell { border-top: 1px solid #e3e6ea; padding: 10px 0; }
.plots { display: flex; flex-wrap: wrap; gap: 12px; }
svg.plot text { font: 11px system-ui, sans-serif; fill: #4a5565; }
svg.plot .caption { font-weight: 600; fill: #1d2430; }
svg.plot .axis { stroke: #8a94a3; } svg.plot .capacity { stroke: #1d2430; stroke-dasharray: 3 3; }
.legend { margin: 8px 0; } .key { margin-right: 14px; white-space: nowrap; }
.key i { display: inline-block; width: 12px; height: 12px; margin-right: 5px;
        vertical-align: -1px; }
ul.violations { margin: 4px 0; padding-left: 18px; font-size: 12px; }
details.cell { content-visibility: auto; contain-intrinsic-size: auto 40px; }
details.cell > summary { cursor: pointer; font-weight: 600; }
.filter { margin: 10px 0; display: flex; gap: 8px; flex-wrap: wrap; }
.filter input { flex: 1 1 280px; padding: 4px 6px; font: inherit; }
.scroll { overflow-x: auto; max-width: 100%; }
"""

FILTER_SCRIPT = """
const q = document.getElementById("q"), st = document.getElementById("status");
function apply() {
  const words = q.value.toLowerCase().split(/\\s+/).filter(Boolean), want = st.value;
  let shown = 0;
  for (const el of document.querySelectorAll("[data-name]")) {
    const hit = words.every(w => el.dataset.name.includes(w))
      && (!want || el.dataset.status === want);
    el.hidden = !hit;
    if (hit && el.tagName === "TR") shown++;
  }
  document.getElementById("shown").textContent = shown + " cells shown";
}
const params = new URLSearchParams(location.hash.slice(1));
q.value = params.get("q") || ""; st.value = params.get("status") || "";
q.addEventListener("input", apply); st.addEventListener("change", apply); apply();
document.addEventListener("click", e => {  // a row's link opens the folded cell it names
  const a = e.target.closest('a[href^="#cell-"]');
  if (a) document.getElementById(a.getAttribute("href").slice(1)).open = true;
});
"""

FILTER_BOX = (
    '<div class="filter"><input id="q" type="search" placeholder="filter: spec and axis values '
    '(session-radix ps4 eagle_v2 …)" aria-label="filter cells"><select id="status" '
    'aria-label="status"><option value="">all</option><option value="failed">failed</option>'
    '<option value="passed">passed</option></select><span id="shown"></span></div>'
)


def render_html(
    header: ReportHeader,
    results: list[CellResult],
    totals: dict[str, Any],
    pairs: list[SideBySide] | None = None,
) -> str:
    """The whole page (``pairs``: with the real engines' side-by-side section after the
    summary)."""
    ordered = failing_first(results)
    anchors = {id(r): f"cell-{i}" for i, r in enumerate(results)}
    text = verdict(totals, pairs)
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
        FILTER_BOX,
        f'<div class="scroll">{_table(ordered, anchors)}</div>',
        *([target_html(pairs)] if pairs is not None else []),
        "<h2>Pools over steps</h2>",
        legend(),
    ]
    body += [_cell_section(r, anchors[id(r)]) for r in ordered]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>kvspec report</title><style>{STYLE}</style></head><body>\n"
        + "\n".join(body)
        + f"\n<script>{FILTER_SCRIPT}</script>\n</body></html>\n"
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
            f'<tr class="{"ok" if r.ok else "failed"}" {_data(r)}><td>{mark}</td>'
            f'<td class="name"><a href="#{anchors[id(r)]}">{escape(r.name)}</a></td>'
            f"<td>{r.steps}</td><td>{r.checks}</td><td>{r.num_violations}</td>"
            f'<td class="first">{escape(r.first_violation)}</td>'
            f"<td>{escape(goals_text(r.error, r.unmet, 'met' if r.kind == 'spec' else '—'))}</td>"
            f"<td>{r.seconds:.2f}s</td></tr>"
        )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _data(r: CellResult) -> str:
    """What the filter reads: the cell name (lower case) and its status."""
    return f'data-name="{escape(r.name.lower())}" data-status="{"passed" if r.ok else "failed"}"'


def _cell_section(r: CellResult, anchor: str) -> str:
    """A folded section (open when the cell failed): summary line, replay, findings, plots."""
    status = '<span class="pass">passed</span>' if r.ok else '<span class="fail">failed</span>'
    parts = [
        f'<details class="cell" id="{anchor}" {_data(r)}{"" if r.ok else " open"}>'
        f"<summary>{escape(r.name)} — {status}</summary>",
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
    parts.append(f'<div class="plots">{"".join(plots)}</div></details>')
    return "".join(parts)
