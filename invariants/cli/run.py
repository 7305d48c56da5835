"""`kvspec run SPEC`: one scenario spec (optionally one matrix cell of it), checked."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from invariants.cli.app import app
from invariants.loader import load_catalog

if TYPE_CHECKING:
    from invariants.spec import Spec


class Target(str, Enum):
    """What a spec runs on."""

    kvspec = "kvspec"
    sglang = "sglang"


@app.command("run")
def run_command(
    spec: Annotated[Path, typer.Argument(help="A scenario spec (specs/*.yaml).")],
    set_: Annotated[Optional[list[str]], typer.Option(  # noqa: UP045
        "--set", help="Override an engine field or a matrix axis: KEY=VALUE (attention=mla).")] = None,
    strict: Annotated[bool, typer.Option(help="Stop at the first violation (level 2).")] = False,
    save_trace: Annotated[Optional[Path], typer.Option(  # noqa: UP045
        help="Write the op trace the spec ran as JSON (replayable, shrinkable).")] = None,
    target: Annotated[Target, typer.Option(help="kvspec's engine, or real SGLang's memory classes.")] = Target.kvspec,
    sglang_python: Annotated[Optional[Path], typer.Option(  # noqa: UP045
        help="The sglang venv's python (default: $KVSPEC_SGLANG_PYTHON, .sglang-venv).")] = None,
) -> None:
    """Run one scenario spec with the checker after every event; exit 1 on a violation,
    an unmet goal, a failed response oracle or an engine error (2: the spec is invalid)."""
    from invariants.runner import run_spec
    from invariants.spec import SpecError, load_spec, parse_overrides

    try:
        loaded = load_spec(spec, parse_overrides(set_ or []))
    except SpecError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    level = 2 if strict else 1
    if target is Target.sglang:
        raise typer.Exit(_run_on_sglang(loaded, level, sglang_python))
    outcome = run_spec(loaded, load_catalog(), level=level)
    if save_trace is not None:
        outcome.trace.save(save_trace)
    typer.echo(f"{loaded.name}: {outcome.stats}")
    typer.echo(f"{len(outcome.trace.ops)} ops, {outcome.checks} checks, {outcome.seconds:.2f}s")
    details = outcome.trace_outcome.describe()
    if details:
        typer.echo(details)
    for goal in outcome.unmet:
        typer.echo(f"expected {goal}")
    raise typer.Exit(0 if outcome.ok else 1)


def _run_on_sglang(spec: Spec, level: int, python: Path | None) -> int:
    """The spec on real SGLang (invariants/sglang/): 0 clean, 1 a finding, 2 no sglang env or
    a spec the adapter does not model (said, never passed silently)."""
    from invariants.cli.sglang import print_outcome
    from invariants.sglang.run import run_spec_on_sglang
    from invariants.sglang.target import SGLangUnavailable

    try:
        outcome = run_spec_on_sglang(spec, load_catalog(), level, None if python is None else str(python))
    except SGLangUnavailable as exc:
        typer.echo(f"sglang target: {exc}", err=True)
        return 2
    return print_outcome(spec.name, outcome)
