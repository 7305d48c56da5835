"""The report's small texts, written once for every format (the printed table, report.md,
report.html, junit.xml, the real engines side by side): a violation line, the goals cell and a
Markdown table cell.

Keeps: a cell or row reads the same in every format (tests pin these strings).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def violation_line(v: Mapping[str, Any], *, event: bool = True) -> str:
    """``[invariant] step N (event): message`` of a violation as plain data (``event``
    False: without the event)."""
    where = f"step {v['step']} ({v['event']})" if event else f"step {v['step']}"
    return f"[{v['invariant']}] {where}: {v['message']}"


def first_violation(violations: tuple[Mapping[str, Any], ...]) -> str:
    """``invariant @ step N`` of the first violation; empty when there is none."""
    if not violations:
        return ""
    first = violations[0]
    return f"{first['invariant']} @ step {first['step']}"


def goals_text(error: str | None, unmet: tuple[str, ...], met: str = "met") -> str:
    """The goals cell: crashed, ``N unmet`` or ``met`` (a memory cell, which has no goals,
    passes its own ``met``: empty or a dash)."""
    if error:
        return "crashed"
    return f"{len(unmet)} unmet" if unmet else met


def md_cell(text: object) -> str:
    """Text that stays inside one Markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ")
