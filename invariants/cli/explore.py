"""`kvspec explore …`: seed-driven simulation of the whole engine (`kvspec explore --seeds N
--steps S`), and `kvspec explore memory`, the seeded memory-layer exercise of a report cell.

Exit status of the engine explorer: 0 clean, 1 a failing seed (each distinct failure shrunk
and written as a JSON trace, with the `kvspec replay` command printed), 3 no failure but a
`sometimes` goal was never met (the seeds did not test what they should — a test-design
finding, as in FoundationDB; `--no-coverage` waives it for small runs).
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from invariants.checking.loader import load_catalog
from invariants.cli.app import PLAIN_HELP, CrossCheck, app, use_crosscheck
from invariants.cli.scheduler import PythonOpt, VersionOpt
from invariants.explore import DEFAULT_SEEDS, DEFAULT_STEPS, FAILURE_DIR, explore
from invariants.explore.report import print_report, write_report_json

UNMET_COVERAGE = 3
SCHEDULER_SEEDS, SCHEDULER_STEPS = 40, 200  # invariants/targets/sglang_scheduler/explore.py's defaults


class ExploreTarget(str, Enum):
    kvspec = "kvspec"
    sglang_scheduler = "sglang-scheduler"
    vllm = "vllm"


Seeds = Annotated[
    int | None,
    typer.Option(
        min=1,
        help=f"How many runs (default {DEFAULT_SEEDS}: half fresh seeds, half mutants; "
        f"sglang-scheduler: {SCHEDULER_SEEDS} fresh seeds).",
    ),
]
Steps = Annotated[
    int | None,
    typer.Option(
        min=1,
        help=f"Scheduled iterations of each seed's safety phase (default {DEFAULT_STEPS}; "
        f"sglang-scheduler {SCHEDULER_STEPS}).",
    ),
]
Workers = Annotated[int, typer.Option(min=1, help="Worker processes (results stay in seed order).")]
Out = Annotated[Path, typer.Option(help="Where shrunk failing traces are written.")]
TargetOpt = Annotated[
    ExploreTarget,
    typer.Option(help="kvspec's engine, SGLang's real scheduler, or vLLM v1's (make vllm-env)."),
]
VLLMPythonOpt = Annotated[
    str | None,
    typer.Option(
        "--vllm-python",
        help="Another interpreter with vLLM (another release's venv, your own checkout); "
        "default $KVSPEC_VLLM_PYTHON, else .vllm-venv.",
    ),
]

explore_app = typer.Typer(
    **PLAIN_HELP, help="Seed-driven simulation (engine), or one memory-layer cell (memory)."
)
app.add_typer(explore_app, name="explore")


@explore_app.callback(invoke_without_command=True)
def explore_engine(
    ctx: typer.Context,
    seeds: Seeds = None,
    steps: Steps = None,
    seed_start: Annotated[int, typer.Option(min=0, help="The first seed.")] = 0,
    workers: Workers = 1,
    out: Out = FAILURE_DIR,
    fail_fast: Annotated[bool, typer.Option(help="Stop at the first failing seed.")] = False,
    coverage: Annotated[
        bool, typer.Option(help="Exit 3 if a sometimes goal was never met.")
    ] = True,
    target: TargetOpt = ExploreTarget.kvspec,
    sglang_version: VersionOpt = None,
    sglang_python: PythonOpt = None,
    vllm_python: VLLMPythonOpt = None,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="The campaign's JSON (default: OUT/report.json).")
    ] = None,
    crosscheck: CrossCheck = False,
) -> None:
    """Run a coverage-guided campaign of SEEDS runs (half fresh seeds — each a swarm
    configuration and a generated trace — then mutants of the runs that reached a new
    (event, feature) pair or engine arc), each checked at every event; shrink each distinct
    failure, write it to OUT, print its replay command and what the campaign reached."""
    if ctx.invoked_subcommand is not None:
        return
    use_crosscheck(crosscheck)
    if target is not ExploreTarget.kvspec:
        runs = (seeds or SCHEDULER_SEEDS, steps or SCHEDULER_STEPS, seed_start, workers)
        pythons = (sglang_version, sglang_python, vllm_python)
        raise typer.Exit(_explore_real(target, runs, out, fail_fast, *pythons))
    seeds, steps = seeds or DEFAULT_SEEDS, steps or DEFAULT_STEPS
    report = explore(
        seeds, steps, seed_start=seed_start, workers=workers, fail_fast=fail_fast, out_dir=out
    )
    print_report(report, steps, workers, echo=typer.echo)
    typer.echo(f"wrote {write_report_json(report, steps, json_out or out / 'report.json')}")
    if report.failed:
        raise typer.Exit(1)
    raise typer.Exit(UNMET_COVERAGE if coverage and report.unmet else 0)


def _explore_real(
    target: ExploreTarget,
    runs: tuple[int, int, int, int],
    out: Path,
    fail_fast: bool,
    sglang_version: str | None,
    sglang_python: str | None,
    vllm_python: str | None,
) -> int:
    """A real engine's exploration (``runs``: seeds, steps, first seed, workers)."""
    if target is ExploreTarget.vllm:
        return _explore_on_vllm(*runs, out, fail_fast, vllm_python)
    from invariants.cli.scheduler import explore_on_scheduler

    return explore_on_scheduler(*runs, out, fail_fast, sglang_version, sglang_python)


def _explore_on_vllm(
    seeds: int,
    steps: int,
    seed_start: int,
    workers: int,
    out: Path,
    fail_fast: bool,
    python: str | None,
) -> int:
    """`kvspec explore --target vllm`: 0 clean, 1 a failing seed, 2 no vllm env."""
    from invariants.cli.scheduler import print_explore_report
    from invariants.explore.real import explore_real
    from invariants.targets.vllm.explore import driver_for, vllm_target
    from invariants.targets.vllm.target import VLLMUnavailable

    try:
        version = driver_for(python).version
        target = vllm_target(python)
        report = explore_real(
            target, version, seeds, steps, seed_start=seed_start, workers=workers,
            fail_fast=fail_fast, out_dir=out,
        )  # fmt: skip
    except VLLMUnavailable as exc:
        typer.echo(f"vllm target: {exc}", err=True)
        return 2
    flags = "--target vllm" + (f" --vllm-python {python}" if python else "")
    return print_explore_report(report, steps, workers, "vLLM", flags)


@explore_app.command("memory")
def explore_memory(
    page_size: Annotated[int, typer.Option(help="Tokens per KV page.")] = 1,
    cache: Annotated[str, typer.Option(help="Prefix cache: radix or chunk.")] = "radix",
    swa: Annotated[bool, typer.Option(help="Hybrid sliding-window pools.")] = False,
    seed: Annotated[int, typer.Option(help="The one seed of the run.")] = 0,
    batch: Annotated[int, typer.Option(help="Running requests at most.")] = 8,
    requests: Annotated[int, typer.Option(help="Requests in the trace.")] = 160,
    strict: Annotated[bool, typer.Option(help="Stop at the first violation (level 2).")] = False,
) -> None:
    """Run one memory-layer cell checked after every step; exit 1 on a violation."""
    from invariants.report.memory_cells import MemoryCell, memory_table, run_memory_cell

    catalog = load_catalog()
    result = run_memory_cell(
        MemoryCell(page_size, cache, swa, seed, batch, requests), catalog, level=2 if strict else 1
    )
    Console().print(memory_table(catalog, [result]))
    for violation in result.violations[:5]:
        typer.echo(str(violation))
    raise typer.Exit(1 if result.violations else 0)


@app.command("replay")
def replay_command(
    trace: Annotated[Path, typer.Argument(help="A JSON op trace (explore-failures/seed-N.json).")],
    target: TargetOpt = ExploreTarget.kvspec,
    sglang_version: VersionOpt = None,
    sglang_python: PythonOpt = None,
    vllm_python: VLLMPythonOpt = None,
) -> None:
    """Replay TRACE to its first violation: the violation, its witnesses, and the state-view
    diff from the last step before it; exit 1 when a failure reproduces, 0 otherwise."""
    from invariants.explore import replay
    from invariants.scenarios.ops import Trace, TraceError

    try:
        loaded = Trace.load(trace)
    except TraceError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    if target is ExploreTarget.sglang_scheduler:
        from invariants.cli.scheduler import guarded
        from invariants.targets.sglang_scheduler.replay import replay_on_scheduler

        result = guarded(lambda: replay_on_scheduler(loaded, sglang_version, sglang_python))
    elif target is ExploreTarget.vllm:
        from invariants.targets.vllm.replay import replay_on_vllm

        result = replay_on_vllm(loaded, vllm_python)  # type: ignore[assignment]
    else:
        result = replay(loaded)
    for line in result.describe():
        typer.echo(line)
    raise typer.Exit(1 if result.failure is not None else 0)
