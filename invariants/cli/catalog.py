"""`kvspec invariants list|lint`: the catalog; lint prints one `path:line: [id] reason` line
per problem (grep- and editor-friendly)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from invariants.checking.loader import catalog_files, lint, load_catalog
from invariants.cli.app import FormatOption, invariants_app
from invariants.terminal import Col, Format, out_console, print_table

Paths = Annotated[
    list[Path] | None,
    typer.Argument(help="Catalog files or folders (default: the shipped catalog)."),
]


@invariants_app.command("list")
def list_invariants(paths: Paths = None, fmt: FormatOption = Format.table) -> None:
    """Show every invariant: id, events, title, origin (a catalog that does not load: one
    line per problem, exit 2)."""
    catalog = load_catalog(paths)
    cols = (Col("id"), Col("events"), Col("title", "text"), Col("origin", "text"))
    rows = [
        [rule.id, ",".join(sorted(rule.events)), rule.title, ", ".join(rule.origin)]
        for rule in catalog
    ]
    print_table(out_console(), cols, rows, fmt, title=f"{len(catalog)} invariants")


@invariants_app.command("lint")
def lint_command(paths: Paths = None) -> None:
    """Load the catalog, validate every expression and run every fixture; exit 1 on any error."""
    errors = lint(paths)
    for line in errors:
        typer.echo(line)
    if errors:
        raise typer.Exit(1)
    files = catalog_files(paths)
    count = len(load_catalog(files))
    typer.echo(f"ok: {count} invariants in {len(files)} file(s), {2 * count} fixtures behave")
