"""`kvspec report` (the main job) and `kvspec run SPEC`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from invariants.cli.app import app
from invariants.loader import load_catalog


@app.command()
def report() -> None:
    """Run the default cells under the checker and print the invariant report."""
    from invariants.report import run_report

    raise typer.Exit(run_report())


@app.command("run")
def run_command(
    spec: Annotated[Path, typer.Argument(help="A scenario spec (specs/*.yaml).")],
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="Override an engine field: KEY=VALUE.")] = None,  # noqa: UP007
    strict: Annotated[bool, typer.Option(help="Stop at the first violation (level 2).")] = False,
) -> None:
    """Run one scenario spec with the checker after every event; exit 1 on a violation."""
    from invariants.runner import run_spec
    from invariants.spec import SpecError, load_spec, parse_overrides

    try:
        loaded = load_spec(spec, parse_overrides(set_ or []))
    except SpecError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    outcome = run_spec(loaded, load_catalog(), level=2 if strict else 1)
    typer.echo(f"{loaded.name}: {outcome.stats}")
    for violation in outcome.violations[:5]:
        typer.echo(str(violation))
    for goal in outcome.unmet:
        typer.echo(f"expected {goal}")
    raise typer.Exit(0 if outcome.ok else 1)
