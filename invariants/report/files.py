"""The report's files: report.json (everything, timelines included), junit.xml (one testcase
per cell, for CI test views), report.md (the table and the failures) and report.html.

Keeps: every file names the same cells in the same order with the same verdicts; a failing
cell carries its violations and the command that replays it in every format.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from invariants.report.html import render_html
from invariants.report.model import (
    LISTED_IN_TEXT,
    CellResult,
    ReportHeader,
    SideBySide,
    failing_first,
    summary,
)
from invariants.report.target_view import target_markdown
from invariants.report.targets import legacy_sglang_document, targets_document, verdict
from invariants.report.text import goals_text, md_cell, violation_line
from invariants.scenarios.matrix import Exclusion


def write_report(
    out: Path,
    header: ReportHeader,
    results: list[CellResult],
    pairs: list[SideBySide] | None = None,
    excluded: Sequence[Exclusion] = (),
) -> list[Path]:
    """Write the four files into ``out`` (created); return their paths. ``pairs``: the
    real-engine rows of `--target NAME` beside kvspec's cells (report.json, report.md,
    report.html); ``excluded``: the matrix cells constraints rule out (report.json,
    report.md)."""
    out.mkdir(parents=True, exist_ok=True)
    files = {
        "report.json": json.dumps(report_document(header, results, pairs, excluded), indent=1)
        + "\n",
        "junit.xml": junit_xml(header, results),
        "report.md": report_markdown(header, results, pairs, excluded),
        "report.html": render_html(header, results, summary(results), pairs),
    }
    for name, text in files.items():
        (out / name).write_text(text, encoding="utf-8")
    return [out / name for name in files]


def report_document(
    header: ReportHeader,
    results: list[CellResult],
    pairs: list[SideBySide] | None = None,
    excluded: Sequence[Exclusion] = (),
) -> dict[str, Any]:
    """Everything: header, summary, every cell, the excluded matrix cells, and the real
    engines' rows by target (``targets``; ``sglang``: 0.x's key for them, one release more)."""
    document = {
        "header": asdict(header),
        "summary": summary(results),
        "cells": [r.to_dict() for r in results],
        "excluded": [x.to_dict() for x in excluded],
    }
    if pairs is None:
        return document
    return {**document, "targets": targets_document(pairs), "sglang": legacy_sglang_document(pairs)}


def failure_text(r: CellResult) -> str:
    """The violations, unmet goals and crash of a cell, then its replay command."""
    lines = [violation_line(v) for v in r.violations[:LISTED_IN_TEXT]]
    if r.num_violations > LISTED_IN_TEXT:
        lines.append(
            f"... {r.num_violations - LISTED_IN_TEXT} more violations (report.json lists "
            f"{len(r.violations)})"
        )
    lines += [f"expected {goal}" for goal in r.unmet]
    if r.error:
        lines.append(f"engine error: {r.error}")
    return "\n".join([*lines, f"replay: {r.replay}"])


def junit_xml(header: ReportHeader, results: list[CellResult]) -> str:
    """JUnit XML as pytest writes it: testsuites > testsuite > testcase (+ failure | error)."""
    root = ET.Element("testsuites", name="kvspec report")
    errors = [_is_error(r) for r in results]
    suite = ET.SubElement(
        root,
        "testsuite",
        name="kvspec",
        tests=str(len(results)),
        failures=str(sum(not r.ok and not e for r, e in zip(results, errors))),
        errors=str(sum(errors)),
        skipped="0",
        time=f"{sum(r.seconds for r in results):.3f}",
    )
    properties = ET.SubElement(suite, "properties")
    for name in ("evaluation", "level", "matrix", "backend", "version"):
        ET.SubElement(properties, "property", name=name, value=str(getattr(header, name)))
    for r in results:
        case = ET.SubElement(
            suite, "testcase", classname=f"kvspec.{r.kind}", name=r.name, time=f"{r.seconds:.3f}"
        )
        if _is_error(r):
            ET.SubElement(
                case, "error", message=str(r.error), type="EngineError"
            ).text = failure_text(r)
        elif not r.ok:
            message = r.first_violation or (r.unmet[0] if r.unmet else "failed")
            kind = "InvariantViolation" if r.num_violations else "UnmetGoal"
            ET.SubElement(case, "failure", message=message, type=kind).text = failure_text(r)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def _is_error(r: CellResult) -> bool:
    """A crash with no violation before it is an error (as an exception in a test is); a
    crash after violations is reported as their failure (its text names the crash)."""
    return r.error is not None and not r.num_violations


def report_markdown(
    header: ReportHeader,
    results: list[CellResult],
    pairs: list[SideBySide] | None = None,
    excluded: Sequence[Exclusion] = (),
) -> str:
    """The summary table (failing cells first), each failure with its replay command, the
    matrix cells constraints exclude, and the side-by-side section when real engines ran."""
    totals = summary(results)
    lines = [
        f"# kvspec report: {verdict(totals, pairs)}",
        "",
        f"{header.title}; {header.evaluation}.",
        "",
        (
            f"Matrix {header.matrix}; ran on {header.backend}; kvspec {header.version}, "
            f"Python {header.python}. {totals['checks']} checks evaluated, {totals['violations']} "
            f"violations, {totals['unmet_goals']} unmet goals, {totals['crashed']} crashes."
        ),
        "",
        "| | cell | steps | checks | violations | first violation | goals | time |",
        "|---|---|--:|--:|--:|---|---|--:|",
    ]
    for r in failing_first(results):
        goals = goals_text(r.error, r.unmet, "met" if r.kind == "spec" else "—")
        lines.append(
            f"| {'✅' if r.ok else '❌'} | {md_cell(r.name)} | {r.steps} | {r.checks} | "
            f"{r.num_violations} | {md_cell(r.first_violation)} | {goals} | {r.seconds:.2f}s |"
        )
    failed = [r for r in results if not r.ok]
    if failed:
        lines += ["", "## Failures"]
    for r in failed:
        lines += ["", f"### {r.name}", "", "```", failure_text(r), "```"]
    lines += exclusions_markdown(excluded)
    if pairs is not None:
        lines += target_markdown(pairs)
    return "\n".join(lines) + "\n"


def exclusions_markdown(excluded: Sequence[Exclusion]) -> list[str]:
    """report.md's section on the matrix cells constraints rule out (none: no section)."""
    if not excluded:
        return []
    lines = [
        "",
        "## Excluded by constraints",
        "",
        f"{sum(len(x.cells) for x in excluded)} product cells are never run; "
        "report.json lists each.",
        "",
        "| spec | cells | constraint | reason |",
        "|---|--:|---|---|",
    ]
    return lines + [
        f"| {md_cell(x.spec)} | {len(x.cells)} | {md_cell(x.constraint)} | {md_cell(x.reason)} |"
        for x in excluded
    ]
