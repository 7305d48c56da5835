"""How kvspec prints results: tables that fit the terminal and stay whole in a pipe, in three
formats (``--format table|plain|json``), and the verdict line a checking command ends with.

Keeps: an id, a flag, a command or a number (a column of kind "id" or "num") is never cut or
wrapped; only "text" columns wrap, at words. A table too wide for the terminal prints as one
record per block instead. In a pipe without $COLUMNS nothing wraps: each row is one whole
line. ``plain`` is tab-separated with a header line; ``json`` a list of objects (numbers stay
numbers). A cell may be rich ``Text`` (a coloured verdict): its plain string is the value.
"""

from __future__ import annotations

import json
import os
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from rich.console import Console
from rich.table import Table
from rich.text import Text

Cell = str | int | float | Text | None
TEXT_MIN = 20  # a wrapping column narrower than this reads one word per line
UNBOUNDED = 10_000  # a pipe's width: rows stay whole


class Format(StrEnum):
    table = "table"
    plain = "plain"
    json = "json"


@dataclass(frozen=True, slots=True)
class Col:
    """A column: ``id`` and ``num`` values are never cut or wrapped, ``text`` wraps at words."""

    name: str
    kind: Literal["id", "num", "text"] = "id"


def out_console(stderr: bool = False) -> Console:
    """The terminal as it is ($COLUMNS when set); in a pipe, unbounded (rows stay whole)."""
    console = Console(stderr=stderr, highlight=False)
    if console.is_terminal or "COLUMNS" in os.environ:
        return console
    return Console(stderr=stderr, highlight=False, width=UNBOUNDED)


def plain(value: Cell) -> str:
    if value is None:
        return ""
    return value.plain if isinstance(value, Text) else str(value)


def print_table(
    console: Console,
    cols: Sequence[Col],
    rows: Sequence[Sequence[Cell]],
    fmt: Format = Format.table,
    title: str | None = None,
) -> None:
    """The rows in ``fmt``; a table that cannot fit the console becomes records."""
    if fmt is Format.json:
        console.print_json(json.dumps([_record(cols, row) for row in rows]))
    elif fmt is Format.plain:
        lines = ["\t".join(c.name for c in cols)]
        lines += ["\t".join(_one_line(plain(v)) for v in row) for row in rows]
        console.file.write("\n".join(lines) + "\n")  # as is: rich would expand the tabs
    elif _needed_width(cols, rows) <= console.width:
        console.print(_rich_table(cols, rows, title))
    else:
        print_records(console, cols, rows, title)


def print_records(
    console: Console, cols: Sequence[Col], rows: Sequence[Sequence[Cell]], title: str | None
) -> None:
    """One block per row: its first cell, then ``name: value`` lines (text wrapped, ids whole)."""
    if title:
        console.print(title, markup=False)
    width = max(console.width, TEXT_MIN * 2)
    for row in rows:
        console.print(_styled(row[0]), soft_wrap=True)
        for col, value in zip(cols[1:], row[1:]):
            if plain(value) == "":
                continue
            head = f"  {col.name}: "
            if col.kind == "text":
                pad = " " * len(head)
                body = textwrap.fill(
                    plain(value),
                    width,
                    initial_indent=head,
                    subsequent_indent=pad,
                    break_long_words=False,
                )
                console.print(body, markup=False, soft_wrap=True)
            else:
                console.print(Text(head) + _styled(value), soft_wrap=True)
        console.print()


def verdict_line(ok: bool, facts: Sequence[str]) -> Text:
    """``PASS · facts…`` (green) or ``FAIL · facts…`` (red): a command's last line."""
    word = Text("PASS", style="bold green") if ok else Text("FAIL", style="bold red")
    return Text.assemble(word, *(f" · {fact}" for fact in facts))


def seconds(value: float) -> str:
    """A duration a person reads: 0.42 s, 57 s, 4 min 48 s."""
    if value < 10:
        return f"{value:.2f} s"
    if value < 60:
        return f"{value:.0f} s"
    return f"{int(value // 60)} min {int(value % 60):02d} s"


def _record(cols: Sequence[Col], row: Sequence[Cell]) -> dict[str, object]:
    return {c.name: (plain(v) if isinstance(v, Text) else v) for c, v in zip(cols, row)}


def _one_line(text: str) -> str:
    return " ".join(text.split("\t")).replace("\n", " ")


def _styled(value: Cell) -> Text:
    return value if isinstance(value, Text) else Text(plain(value))


def _widest(col: Col, rows: Sequence[Sequence[Cell]], index: int) -> int:
    return max([len(col.name), *(len(plain(row[index])) for row in rows)])


def _needed_width(cols: Sequence[Col], rows: Sequence[Sequence[Cell]]) -> int:
    """Columns at their widest (text at least ``TEXT_MIN``), plus rich's borders and padding."""
    widths = [
        min(_widest(c, rows, i), TEXT_MIN) if c.kind == "text" else _widest(c, rows, i)
        for i, c in enumerate(cols)
    ]
    return sum(widths) + 3 * len(cols) + 1


def _rich_table(cols: Sequence[Col], rows: Sequence[Sequence[Cell]], title: str | None) -> Table:
    table = Table(title=title)
    for i, col in enumerate(cols):
        whole = col.kind != "text"
        table.add_column(
            col.name,
            justify="right" if col.kind == "num" else "left",
            no_wrap=whole,
            min_width=_widest(col, rows, i) if whole else min(_widest(col, rows, i), TEXT_MIN),
            overflow="fold",
        )
    for row in rows:
        table.add_row(*(_styled(v) for v in row))
    return table
