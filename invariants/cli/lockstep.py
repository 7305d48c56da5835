"""`kvspec sglang lockstep SPEC`: kvspec's scheduler beside SGLang's real one on the spec's
trace, iteration by iteration, up to the first divergence no declared gap explains.

Exit codes: 0 the two agree up to declared gaps, 1 a divergence (or either side raised),
2 no such release venv, a release whose internals moved, an invalid spec, or a trace the
real scheduler cannot express.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from invariants.cli.scheduler import PythonOpt, VersionOpt, guarded
from invariants.cli.sglang import sglang_app

if TYPE_CHECKING:
    from invariants.targets.sglang_scheduler.lockstep import LockstepResult

Sets = Annotated[
    list[str] | None,
    typer.Option("--set", help="Override an engine field: KEY=VALUE (enable_overlap=false)."),
]
Reasons = Annotated[bool, typer.Option(help="Print each declared gap's reason.")]


@sglang_app.command("lockstep")
def lockstep_command(
    spec: Annotated[Path, typer.Argument(help="A scenario spec (specs/*.yaml).")],
    sglang_version: VersionOpt = None,
    sglang_python: PythonOpt = None,
    set_: Sets = None,
    reasons: Reasons = False,
) -> None:
    """The spec's trace on kvspec's engine and on SGLang's real scheduler in lockstep: each
    iteration's batch (forward mode, requests, new tokens each, retractions) and pool
    buckets compared; the first difference no declared gap explains is printed with both
    sides' batch and buckets."""
    from invariants.scenarios.spec import SpecError, load_spec, parse_overrides
    from invariants.targets.sglang_scheduler.lockstep import lockstep_spec

    try:
        loaded = load_spec(spec, parse_overrides(set_ or []))
    except SpecError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    result = guarded(lambda: lockstep_spec(loaded, version=sglang_version, python=sglang_python))
    raise typer.Exit(print_lockstep(result, reasons))


def print_lockstep(result: LockstepResult, reasons: bool = False) -> int:
    """One lockstep run; its exit code (see the module docstring)."""
    if result.unsupported:
        why = "; ".join(result.unsupported)
        typer.echo(f"{result.name}: the real scheduler cannot run it: {why}", err=True)
        return 2
    typer.echo(
        f"{result.name}: kvspec vs SGLang {result.version} (real scheduler) in lockstep: "
        f"{result.iterations} iterations compared, {result.seconds:.1f}s"
    )
    for note in result.notes:
        typer.echo(f"note: {note}")
    for hit in result.gaps:
        typer.echo(f"declared gap {hit.gap}: {hit.count} iterations, first in {hit.first_op}")
        if reasons:
            typer.echo(textwrap.indent(textwrap.fill(hit.reason, 96), "    "))
    if result.error:
        typer.echo(f"error: {result.error}")
    if result.divergence is not None:
        for line in result.divergence.lines():
            typer.echo(line)
    elif result.error is None:
        typer.echo(f"agree up to {len(result.gaps)} declared gaps")
    return 0 if result.ok else 1
