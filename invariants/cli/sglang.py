"""`kvspec sglang run|diff|check`: the sglang target (real SGLang 0.5.23 in its own venv)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from invariants.cli.app import PLAIN_HELP, app

sglang_app = typer.Typer(
    **PLAIN_HELP,
    help="Real SGLang's memory classes on CPU, under the same invariants.",
    no_args_is_help=True,
)
app.add_typer(sglang_app, name="sglang")

PythonOpt = Annotated[
    str | None,
    typer.Option(
        "--sglang-python",
        help="The sglang venv's python (default $KVSPEC_SGLANG_PYTHON, then .sglang-venv).",
    ),
]


def print_outcome(name: str, outcome, target: str = "sglang") -> int:
    """Print an sglang (or vllm) run; its exit code: 2 a spec the adapter does not model (said,
    never passed silently), 1 a finding (violation, unmet goal, crash), 0 clean. `kvspec sglang
    run` and `kvspec run --target sglang|vllm` answer through this."""
    if outcome.unsupported:
        typer.echo(
            f"{name}: not supported by the {target} target: {'; '.join(outcome.unsupported)}",
            err=True,
        )
        return 2
    typer.echo(f"{name} on {target} {outcome.sglang_version}: {outcome.stats}")
    typer.echo(
        f"{outcome.checks} checks, {len(outcome.violations)} violations, {outcome.seconds:.1f}s"
    )
    for violation in outcome.violations[:5]:
        typer.echo(str(violation))
    for goal in outcome.unmet:
        typer.echo(f"expected {goal}")
    for note in outcome.notes:
        typer.echo(f"note: {note}")
    if outcome.error:
        typer.echo(f"error: {outcome.error}")
    return 0 if outcome.ok else 1


@sglang_app.command("run")
def run_command(
    spec: Annotated[Optional[Path], typer.Argument(help="A scenario spec (specs/*.yaml).")] = None,  # noqa: UP045
    scenario: Annotated[
        str | None, typer.Option(help="A built-in op scenario: sessions | prefix.")
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of a built-in scenario.")] = 0,
    sglang_python: PythonOpt = None,
) -> None:
    """Run a spec (or a built-in scenario) on real SGLang with the checker; exit 1 on a finding,
    2 when there is no sglang interpreter or the spec is one the adapter does not model."""
    from invariants.checking.loader import load_catalog
    from invariants.scenarios.spec import SpecError, load_spec
    from invariants.targets.sglang.run import run_spec_on_sglang, run_trace_on_sglang
    from invariants.targets.sglang.scenarios import SCENARIOS
    from invariants.targets.sglang.target import SGLangUnavailable

    try:
        if scenario is not None:
            if scenario not in SCENARIOS:
                raise typer.BadParameter(f"{scenario!r}: choose one of {', '.join(SCENARIOS)}")
            name, outcome = (
                scenario,
                run_trace_on_sglang(
                    SCENARIOS[scenario](seed), load_catalog(), python=sglang_python
                ),
            )
        elif spec is not None:
            loaded = load_spec(spec)
            name, outcome = (
                loaded.name,
                run_spec_on_sglang(loaded, load_catalog(), python=sglang_python),
            )
        else:
            raise typer.BadParameter("give a SPEC or --scenario")
    except (SpecError, SGLangUnavailable) as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    raise typer.Exit(print_outcome(name, outcome))


@sglang_app.command("diff")
def diff_command(
    spec: Annotated[
        Path, typer.Argument(help="A scenario spec (plain traffic, sessions, aborts).")
    ],
    show: Annotated[int, typer.Option(help="Differences to print.")] = 10,
    sglang_python: PythonOpt = None,
) -> None:
    """The spec's trace on kvspec and on real SGLang in lockstep (kvspec's batches, overlap,
    mixed chunk and chunked prefill off), buckets compared per step; exit 1 on an undeclared
    difference (declared ones: invariants/targets/sglang/gaps.py)."""
    from invariants.scenarios.spec import SpecError, load_spec
    from invariants.targets.sglang.differential import differential
    from invariants.targets.sglang.gaps import GAPS
    from invariants.targets.sglang.target import SGLangUnavailable

    try:
        result = differential(load_spec(spec), python=sglang_python)
    except (SpecError, SGLangUnavailable, ValueError) as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    typer.echo(
        f"{result.name}: {result.steps} steps, {len(result.differences)} bucket differences, "
        f"{len(result.unexpected)} undeclared"
    )
    for difference in (result.unexpected or result.differences)[:show]:
        typer.echo(f"  {difference}")
    for gap in GAPS:
        typer.echo(f"declared gap {gap.id}: {gap.reason}")
    raise typer.Exit(0 if result.ok else 1)


@sglang_app.command("check")
def check_command(sglang_python: PythonOpt = None) -> None:
    """Fault injection on the real allocator (a skipped free, a double free): the census must
    name the slot ids; exit 1 if either fault goes unnoticed."""
    from invariants.checking.loader import load_catalog
    from invariants.targets.sglang.run import run_trace_on_sglang
    from invariants.targets.sglang.scenarios import sessions_scenario

    caught = 0
    for kind in ("skip_free", "double_free"):
        outcome = run_trace_on_sglang(
            sessions_scenario(),
            load_catalog(),
            python=sglang_python,
            fault={"kind": kind, "step": 1},
        )
        census = [v for v in outcome.violations if v.invariant.startswith("census.")]
        typer.echo(f"{kind}: injected {outcome.faults[:1]}")
        typer.echo(f"  first census finding: {census[0] if census else 'NONE'}")
        caught += bool(census)
    raise typer.Exit(0 if caught == 2 else 1)
