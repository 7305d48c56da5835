"""`kvspec sglang run|diff|check`: the sglang target's own commands (real SGLang 0.5.23's memory
classes in their own venv): a spec or a built-in scenario on it, kvspec beside it in lockstep,
and fault injection into its real allocator.

Exit codes: 0 clean, 1 a finding (or an undeclared difference, or a fault gone unnoticed),
2 no sglang interpreter, or a spec the adapter does not model (said, never passed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

PythonOpt = Annotated[
    str | None,
    typer.Option(
        "--target-python",
        "--sglang-python",
        help="The sglang venv's python (default $KVSPEC_SGLANG_PYTHON, then .sglang-venv).",
    ),
]


def register(group: typer.Typer) -> None:
    """Attach the commands to the `kvspec sglang` group."""
    group.command("run")(run_command)
    group.command("diff")(diff_command)
    group.command("check")(check_command)


def run_command(
    spec: Annotated[Optional[Path], typer.Argument(help="A scenario spec (specs/*.yaml).")] = None,  # noqa: UP045
    scenario: Annotated[
        str | None, typer.Option(help="A built-in op scenario: sessions | prefix.")
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of a built-in scenario.")] = 0,
    target_python: PythonOpt = None,
) -> None:
    """Run a spec (or a built-in scenario) on real SGLang with the checker; exit 1 on a finding,
    2 when there is no sglang interpreter or the spec is one the adapter does not model."""
    from invariants.checking.loader import load_catalog
    from invariants.scenarios.spec import load_spec
    from invariants.targets.registry import TargetOptions, target
    from invariants.targets.run import run_spec, run_trace
    from invariants.targets.sglang.scenarios import SCENARIOS
    from invariants.targets.text import outcome_lines, unsupported_line

    options, entry = TargetOptions(python=target_python), target("sglang")
    if scenario is not None:
        if scenario not in SCENARIOS:
            raise typer.BadParameter(f"{scenario!r}: choose one of {', '.join(SCENARIOS)}")
        name, replay = scenario, f"kvspec sglang run --scenario {scenario} --seed {seed}"
        outcome = run_trace(entry, SCENARIOS[scenario](seed), load_catalog(), options=options)
    elif spec is not None:
        loaded = load_spec(spec)
        name, replay = loaded.name, f"kvspec sglang run {spec}"
        outcome = run_spec(entry, loaded, load_catalog(), options=options)
    else:
        raise typer.BadParameter("give a SPEC or --scenario")
    if outcome.unsupported:
        typer.echo(unsupported_line(name, outcome), err=True)
        raise typer.Exit(2)
    for line in outcome_lines(name, outcome, replay):
        typer.echo(line)
    raise typer.Exit(0 if outcome.ok else 1)


def diff_command(
    spec: Annotated[
        Path, typer.Argument(help="A scenario spec (plain traffic, sessions, aborts).")
    ],
    show: Annotated[int, typer.Option(help="Differences to print.")] = 10,
    target_python: PythonOpt = None,
) -> None:
    """The spec's trace on kvspec and on real SGLang in lockstep (kvspec's batches, overlap,
    mixed chunk and chunked prefill off), buckets compared per step; exit 1 on an undeclared
    difference (declared ones: invariants/targets/sglang/gaps.py)."""
    from invariants.scenarios.spec import load_spec
    from invariants.targets.sglang.differential import differential
    from invariants.targets.sglang.gaps import GAPS

    loaded = load_spec(spec)  # a SpecError: one line, exit 2 (kvspec's main)
    try:
        result = differential(loaded, python=target_python)
    except ValueError as exc:  # a spec the lockstep cannot follow
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


def check_command(target_python: PythonOpt = None) -> None:
    """Fault injection on the real allocator (a skipped free, a double free): the census must
    name the slot ids; exit 1 if either fault goes unnoticed."""
    from invariants.checking.loader import load_catalog
    from invariants.targets.registry import TargetOptions, target
    from invariants.targets.run import run_trace
    from invariants.targets.sglang.scenarios import sessions_scenario

    caught, options = 0, TargetOptions(python=target_python)
    for kind in ("skip_free", "double_free"):
        fault = {"kind": kind, "step": 1}
        outcome = run_trace(
            target("sglang"), sessions_scenario(), load_catalog(), options=options, fault=fault
        )
        census = [v for v in outcome.violations if v.invariant.startswith("census.")]
        typer.echo(f"{kind}: injected {outcome.faults[:1]}")
        typer.echo(f"  first census finding: {census[0] if census else 'NONE'}")
        caught += bool(census)
    raise typer.Exit(0 if caught == 2 else 1)
