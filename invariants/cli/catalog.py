"""`kvspec invariants list|lint`: the catalog; lint prints one `path:line: [id] reason` line
per problem (grep- and editor-friendly)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from invariants.checking.loader import CatalogError, catalog_files, lint, load_catalog
from invariants.cli.app import invariants_app

Paths = Annotated[
    list[Path] | None,
    typer.Argument(help="Catalog files or folders (default: the shipped catalog)."),
]


@invariants_app.command("list")
def list_invariants(paths: Paths = None) -> None:
    """Show every invariant: id, events, title, origin."""
    try:
        catalog = load_catalog(paths)
    except CatalogError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(1) from None
    table = Table("id", "events", "title", "origin", title=f"{len(catalog)} invariants")
    for rule in catalog:
        events = ", ".join(sorted(rule.events))
        table.add_row(rule.id, events, rule.title, ", ".join(rule.origin))
    Console().print(table)


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
