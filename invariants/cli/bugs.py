"""`kvspec bugs`: the bug zoo — every historical SGLang bug as a mutant, run on its trigger."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from invariants.cli.app import app, emit_json


@app.command("bugs")
def bugs_command(
    only: Annotated[
        list[str] | None, typer.Option("--only", help="Run only this entry (repeatable).")
    ] = None,
    no_shrink: Annotated[
        bool, typer.Option("--no-shrink", help="Skip shrinking the reproducers.")
    ] = False,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Also write the findings as JSON here.")
    ] = None,
) -> None:
    """Run every zoo entry (research/sglang.md §5): the trigger clean, then under its mutant
    (a planted entry: the fixed state, then the bug's); exit 1 if any entry is not caught —
    a mutant or planted state missed or caught only by an unexpected invariant, a trigger or
    fixed state not clean, or the catalog firing where a pre-fix checker formula gave a false
    positive."""
    from invariants.mutants.zoo import print_findings, run_zoo, zoo_json

    try:
        findings = run_zoo(only or None, shrink=not no_shrink)
    except KeyError as exc:
        typer.echo(str(exc.args[0]), err=True)
        raise typer.Exit(2) from None
    print_findings(findings)
    if json_out is not None:
        emit_json(zoo_json(findings), json_out)
    raise typer.Exit(0 if all(f.ok for f in findings) else 1)
