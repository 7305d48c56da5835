"""`kvspec bugs`: the bug zoo — every historical SGLang bug as a mutant, run on its trigger, or
(``--gate``) against the default gate with no trigger at all."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from invariants.cli.app import FormatOption, app, emit_json
from invariants.terminal import Format

Only = Annotated[list[str] | None, typer.Option("--only", help="Run only this entry (repeatable).")]
NoShrink = Annotated[bool, typer.Option("--no-shrink", help="Skip shrinking the reproducers.")]
JsonOut = Annotated[
    Path | None, typer.Option("--json", help="Also write the findings as JSON here.")
]
Gate = Annotated[
    bool,
    typer.Option(
        "--gate",
        help="Run each entry against the default gate (the make-report cells, then explore's "
        "default seeds) instead of its trigger.",
    ),
]
Workers = Annotated[int, typer.Option(min=1, help="--gate: worker processes.")]


@app.command("bugs")
def bugs_command(
    only: Only = None,
    no_shrink: NoShrink = False,
    json_out: JsonOut = None,
    gate: Gate = False,
    workers: Workers = 2,
    fmt: FormatOption = Format.table,
) -> None:
    """Run every zoo entry (docs/sglang.md §5): the trigger clean, then under its mutant
    (a planted entry: the fixed state, then the bug's); exit 1 if any entry is not caught —
    a mutant or planted state missed or caught only by an unexpected invariant, a trigger or
    fixed state not clean, or the catalog firing where a pre-fix checker formula gave a false
    positive. ``--gate``: exit 1 if the default gate misses an entry a trace can reach."""
    if gate:
        _gate(only, json_out, workers)
    from invariants.mutants.zoo import print_findings, run_zoo, zoo_json

    try:
        findings = run_zoo(only or None, shrink=not no_shrink)
    except KeyError as exc:
        typer.echo(str(exc.args[0]), err=True)
        raise typer.Exit(2) from None
    print_findings(findings, fmt=fmt)
    if json_out is not None:
        emit_json(zoo_json(findings), json_out)
    raise typer.Exit(0 if all(f.ok for f in findings) else 1)


def _gate(only: list[str] | None, json_out: Path | None, workers: int) -> None:
    from invariants.mutants import entry
    from invariants.mutants.gate import gate_json, print_gate, run_gate, summary_line

    try:
        for name in only or ():
            entry(name)
    except KeyError as exc:
        typer.echo(str(exc.args[0]), err=True)
        raise typer.Exit(2) from None
    results = run_gate(only or None, workers=workers, progress=print_gate)
    typer.echo(summary_line(results))
    if json_out is not None:
        emit_json(gate_json(results), json_out)
    raise typer.Exit(0 if all(r.ok for r in results) else 1)
