"""The side-by-side view of `kvspec report --target NAME[,NAME…]`: the printed table and its
failures, the report.md section and the report.html section. With several targets (``all``)
an overview comes first — one row per spec, one column per target — then each target's own
section.

Keeps: every format shows the same pairs in the same order (kvspec steps / violations /
goals beside the real engine's, or the reason a spec is unsupported there) under the same
note on goals; a failing row carries its first violations and its replay command.
"""

from __future__ import annotations

from html import escape

from rich.console import Console
from rich.text import Text

from invariants.report.model import LISTED_IN_TEXT, SideBySide, TargetRow
from invariants.report.targets import (
    GOALS_NOTE,
    by_target,
    engine_of,
    failing_rows,
    kvspec_text,
    row_detail,
    row_text,
    rows_summary,
    version_of,
)
from invariants.report.text import md_cell, violation_line
from invariants.targets.registry import TARGETS
from invariants.terminal import Cell, Col, print_table

COLUMNS = (
    "spec",
    "kvspec: steps / violations / goals",
    "{target}: steps / violations / goals",
    "{target}: first finding",
    "{target} time",
)


def columns(pairs: list[SideBySide]) -> tuple[str, ...]:
    """The headers, naming the target the rows ran on."""
    target = pairs[0].row.target if pairs else "target"
    return tuple(c.format(target=target) for c in COLUMNS)


def _title(pairs: list[SideBySide]) -> str:
    rows = [p.row for p in pairs]
    version = version_of(rows) or "(not run)"
    entry = next((t for t in TARGETS if rows and t.name == rows[0].target), None)
    runs = f" ({entry.runs})" if entry is not None else ""
    engine = engine_of(rows[0]) if rows else "a real engine"
    return f"kvspec and {engine} {version}{runs} side by side — each spec as written"


def overview(pairs: list[SideBySide]) -> tuple[list[str], list[list[tuple[str, str]]]]:
    """The several-target overview: headers, then per spec (in first-seen order) its kvspec
    text and each target's ``(text, status)`` — status ok | failed | unsupported | missing."""
    groups = by_target(pairs)
    names = list(dict.fromkeys(p.name for p in pairs))
    kvspec = {p.name: kvspec_text(p.kvspec) for p in pairs}
    found = {(p.row.target, p.name): p.row for p in pairs}
    table = []
    for name in names:
        cells = [(kvspec[name], "ok")]
        for target in groups:
            row = found.get((target, name))
            cells.append(("not run", "missing") if row is None else (row_text(row), _status(row)))
        table.append([(name, "ok"), *cells])
    return ["spec", "kvspec", *groups], table


def _status(row: TargetRow) -> str:
    return "failed" if not row.ok else "unsupported" if row.unsupported else "ok"


STYLES = {"ok": "green", "failed": "red", "unsupported": "yellow", "missing": "yellow"}


def print_side_by_side(console: Console, pairs: list[SideBySide]) -> None:
    """The printed side-by-side table (spec names whole; the findings wrap), then the note;
    with several targets the overview first, then each target's table."""
    groups = by_target(pairs)
    if len(groups) > 1:
        _print_overview(console, pairs)
        for group in groups.values():
            print_side_by_side(console, group)
        return
    spec, kvspec, target, finding, seconds_head = columns(pairs)
    cols = [Col(spec), Col(kvspec), Col(target), Col(finding, "text"), Col(seconds_head, "num")]
    rows: list[list[Cell]] = []
    for p in pairs:
        row = p.row
        colour = "red" if not row.ok else "yellow" if row.unsupported or row.unmet else "green"
        seconds = "" if row.unsupported else f"{row.seconds:.2f}s"
        verdict = Text(row_text(row), style=colour)
        rows.append([p.name, kvspec_text(p.kvspec), verdict, row_detail(row), seconds])
    print_table(console, cols, rows, title=_title(pairs))
    console.print(GOALS_NOTE, markup=False)


def _print_overview(console: Console, pairs: list[SideBySide]) -> None:
    """One row per spec, one column per target, each cell coloured by its status."""
    heads, table = overview(pairs)
    cols = [Col(heads[0]), *(Col(h, "text") for h in heads[1:])]
    rows: list[list[Cell]] = [
        [cells[0][0], *(Text(t, style=STYLES[s]) for t, s in cells[1:])] for cells in table
    ]
    print_table(console, cols, rows, title="kvspec and every real-engine target")


def failure_lines(row: TargetRow) -> list[str]:
    """A failing row's first violations, crash, the engine's own checker's messages and the
    disagreements, then its replay command."""
    lines = [violation_line(v) for v in row.violations[:LISTED_IN_TEXT]]
    if row.num_violations > LISTED_IN_TEXT:
        lines.append(f"... {row.num_violations - LISTED_IN_TEXT} more violations")
    if row.error:
        lines.append(f"{row.target} error: {row.error}")
    lines += [f"{engine_of(row)}'s own checker, {message}" for message in row.checker]
    lines += [note for note in row.notes if note.startswith("disagreement")]
    return [*lines, f"replay: {row.replay}"]


def print_target_failures(console: Console, pairs: list[SideBySide]) -> int:
    """Each failing real-engine row with its findings; the number of them."""
    failed = list(failing_rows(pairs))
    for row in failed:
        console.print(f"[red]{row.name} on {row.target}[/red]:", highlight=False)
        for line in failure_lines(row):
            console.print(f"  {line}", markup=False)
    return len(failed)


def target_markdown(pairs: list[SideBySide]) -> list[str]:
    """report.md's side-by-side section (lines); several targets: the overview, then each."""
    groups = by_target(pairs)
    if len(groups) > 1:
        heads, table = overview(pairs)
        marks = {"ok": "", "failed": "❌ ", "unsupported": "➖ ", "missing": "➖ "}
        lines = ["", "## kvspec and every real-engine target", ""]
        lines += ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
        lines += [
            "| " + " | ".join(f"{marks[s]}{md_cell(t)}" for t, s in table_row) + " |"
            for table_row in table
        ]
        return lines + [line for group in groups.values() for line in target_markdown(group)]
    totals = rows_summary([p.row for p in pairs])
    counts = (
        f"{totals['ran']} of {totals['rows']} specs ran, {totals['violations']} violations, "
        f"{totals['unmet_goals']} unmet goals, {totals['crashed']} crashes"
    )
    lines = [
        "",
        f"## {_title(pairs)}",
        "",
        f"{GOALS_NOTE.capitalize()}. {counts}.",
        "",
        "| | " + " | ".join(columns(pairs)) + " |",
        "|---|---|---|---|---|--:|",
    ]
    for p in pairs:
        row = p.row
        mark = "❌" if not row.ok else "➖" if row.unsupported else "✅"
        lines.append(
            f"| {mark} | {md_cell(p.name)} | {md_cell(kvspec_text(p.kvspec))} | "
            f"{md_cell(row_text(row))} | {md_cell(row_detail(row))} | "
            f"{'' if row.unsupported else f'{row.seconds:.2f}s'} |"
        )
    for row in failing_rows(pairs):
        lines += ["", f"### {row.name} on {row.target}", "", "```", *failure_lines(row), "```"]
    return lines


def overview_html(pairs: list[SideBySide]) -> str:
    """The several-target overview as an HTML section."""
    heads, table = overview(pairs)
    head = "".join(f'<th class="name">{escape(h)}</th>' for h in heads)
    body = "".join(
        "<tr>" + "".join(f'<td class="first {s}">{escape(t)}</td>' for t, s in r) + "</tr>"
        for r in table
    )
    return (
        "<h2>kvspec and every real-engine target</h2>"
        f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
    )


def target_html(pairs: list[SideBySide]) -> str:
    """report.html's side-by-side section; several targets: the overview, then each."""
    groups = by_target(pairs)
    if len(groups) > 1:
        return overview_html(pairs) + "".join(target_html(g) for g in groups.values())
    head = "".join(f'<th class="name">{escape(c)}</th>' for c in ("", *columns(pairs)))
    body = []
    for p in pairs:
        row = p.row
        mark = (
            '<span class="fail">✘</span>'
            if not row.ok
            else "–"
            if row.unsupported
            else '<span class="pass">✔</span>'
        )
        findings = (
            "".join(f"<li>{escape(line)}</li>" for line in failure_lines(row)) if not row.ok else ""
        )
        detail = f'<ul class="violations">{findings}</ul>' if findings else escape(row_detail(row))
        body.append(
            f'<tr class="{"ok" if row.ok else "failed"}"><td>{mark}</td>'
            f'<td class="name">{escape(p.name)}</td>'
            f'<td class="first">{escape(kvspec_text(p.kvspec))}</td>'
            f'<td class="first">{escape(row_text(row))}</td><td class="first">{detail}</td>'
            f"<td>{'' if row.unsupported else f'{row.seconds:.2f}s'}</td></tr>"
        )
    return (
        f"<h2>{escape(_title(pairs))}</h2><p>{escape(GOALS_NOTE.capitalize())}.</p>"
        f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
    )
