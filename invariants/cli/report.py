"""`kvspec report`: the main job (`make report`)."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from invariants.cli.app import app


class ReportTarget(str, Enum):
    kvspec = "kvspec"
    sglang = "sglang"
    both = "both"


@app.command()
def report(
    out: Annotated[
        Path, typer.Option(help="Folder for report.json, junit.xml, report.md, report.html.")
    ] = Path("report"),
    full: Annotated[
        bool, typer.Option(help="Every combination of the matrix axes, not just every pair.")
    ] = False,
    workers: Annotated[
        int | None, typer.Option(min=1, help="Local worker processes (default: one per CPU).")
    ] = None,
    ray_address: Annotated[
        str | None,
        typer.Option(
            help="Run the cells on Ray instead: a cluster address, or 'local' "
            "(needs the kvspec\\[ray] extra)."
        ),
    ] = None,
    target: Annotated[
        ReportTarget,
        typer.Option(
            help="kvspec's engine; sglang: every spec as written on kvspec and on real SGLang, "
            "side by side; both: the kvspec report plus that."
        ),
    ] = ReportTarget.kvspec,
    sglang_python: Annotated[
        str | None,
        typer.Option(
            help="The sglang venv's python (default: $KVSPEC_SGLANG_PYTHON, .sglang-venv)."
        ),
    ] = None,
) -> None:
    """Run every spec, matrix cell and memory-layer cell under the checker (level 1: every
    violation recorded); print the summary table, write the report files; exit 1 on any failure
    (on the sglang target: a violation or crash), 2 when a backend or the sglang target is
    missing."""
    from invariants.report.backends import BackendError
    from invariants.report.run import default_workers, run_report
    from invariants.sglang.target import SGLangUnavailable

    try:
        code = run_report(
            out=out,
            full=full,
            workers=workers or default_workers(),
            ray_address=ray_address,
            target=target.value,
            sglang_python=sglang_python,
        )
    except (BackendError, SGLangUnavailable) as exc:
        typer.echo(
            f"sglang target: {exc}" if isinstance(exc, SGLangUnavailable) else str(exc), err=True
        )
        raise typer.Exit(2) from None
    raise typer.Exit(code)
