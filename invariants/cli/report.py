"""`kvspec report`: the main job (`make report`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from invariants.cli.app import app


@app.command()
def report(
    out: Annotated[Path, typer.Option(help="Folder for report.json, junit.xml, report.md, report.html.")]
    = Path("report"),
    full: Annotated[bool, typer.Option(help="Every combination of the matrix axes, not just every pair.")]
    = False,
    workers: Annotated[int | None, typer.Option(
        min=1, help="Local worker processes (default: one per CPU).")] = None,
    ray_address: Annotated[str | None, typer.Option(
        help="Run the cells on Ray instead: a cluster address, or 'local' "
             "(needs the kvspec\\[ray] extra).")] = None,
) -> None:
    """Run every spec, matrix cell and memory-layer cell under the checker (level 1: every
    violation recorded); print the summary table, write the report files; exit 1 on any failure."""
    from invariants.report import default_workers, run_report
    from invariants.report_backends import BackendError

    try:
        code = run_report(out=out, full=full, workers=workers or default_workers(), ray_address=ray_address)
    except BackendError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    raise typer.Exit(code)
