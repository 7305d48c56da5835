"""`kvspec report`: the main job (`make report`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from invariants.cli.app import (
    CrossCheck,
    FormatOption,
    TargetPython,
    TargetVersion,
    app,
    target_options,
    use_crosscheck,
)
from invariants.targets.registry import NAMES
from invariants.terminal import Format

OutDir = Annotated[
    Path, typer.Option(help="Folder for report.json, junit.xml, report.md, report.html.")
]
Full = Annotated[
    bool, typer.Option(help="Every combination of the matrix axes, not just every pair.")
]
Workers = Annotated[
    int | None, typer.Option(min=1, help="Local worker processes (default: one per CPU).")
]
RayAddress = Annotated[
    str | None,
    typer.Option(
        help="Run the cells on Ray instead: a cluster address, or 'local' "
        "(needs the kvspec\\[ray] extra)."
    ),
]
Targets = Annotated[
    str,
    typer.Option(
        "--target",
        help="kvspec's engine (default), or real engines, comma-separated: each default spec "
        f"as written on kvspec and on it, side by side ({', '.join(NAMES)}; all: every one; "
        "kvspec among them: the whole kvspec report too; both = kvspec,sglang).",
    ),
]


@app.command()
def report(
    out: OutDir = Path("report"),
    full: Full = False,
    workers: Workers = None,
    ray_address: RayAddress = None,
    target: Targets = "kvspec",
    target_python: TargetPython = None,
    target_version: TargetVersion = None,
    crosscheck: CrossCheck = False,
    fmt: FormatOption = Format.table,
) -> None:
    """Run every spec, matrix cell and memory-layer cell under the checker (level 1); print
    the verdict, the failures and the summary, write the report files; exit 1 on any failure
    (a real target: a violation, its own checker firing, or a crash), 2 when a backend or a
    real target's venv is missing."""
    from invariants.report.backends import BackendError
    from invariants.report.run import default_workers, run_report
    from invariants.report.targets import chosen_targets

    use_crosscheck(crosscheck)
    try:
        chosen_targets(target)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    try:
        code = run_report(
            out=out,
            full=full,
            workers=workers or default_workers(),
            ray_address=ray_address,
            target=target,
            options=target_options(target_python, target_version),
            fmt=fmt,
        )
    except BackendError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    raise typer.Exit(code)
