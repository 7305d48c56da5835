"""`kvspec explore …`: seed-driven simulation of the whole engine (`kvspec explore --seeds N
--steps S`), and `kvspec explore memory`, the seeded memory-layer exercise of a report cell.

Exit status of the engine explorer: 0 clean, 1 a failing seed (each distinct failure shrunk
and written as a JSON trace, with the `kvspec replay` command printed), 3 no failure but a
`sometimes` goal was never met (the seeds did not test what they should — a test-design
finding, as in FoundationDB; `--no-coverage` waives it for small runs).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from invariants.checking.loader import load_catalog
from invariants.cli.app import (
    PLAIN_HELP,
    CrossCheck,
    TargetOption,
    TargetPython,
    TargetVersion,
    app,
    chosen_target,
    target_options,
    use_crosscheck,
)
from invariants.explore import DEFAULT_SEEDS, DEFAULT_STEPS, FAILURE_DIR, ExploreReport, explore
from invariants.explore.report import print_report, write_report_json
from invariants.targets.explore import DEFAULT_SEEDS as REAL_SEEDS
from invariants.targets.explore import DEFAULT_STEPS as REAL_STEPS
from invariants.targets.registry import TARGETS

if TYPE_CHECKING:
    from invariants.targets.registry import TargetOptions

UNMET_COVERAGE = 3
EXPLORED = tuple(t.name for t in TARGETS if t.explores)  # the real targets explore runs on

Seeds = Annotated[
    int | None,
    typer.Option(
        min=1,
        help=f"How many runs (default {DEFAULT_SEEDS}: half fresh seeds, half mutants; "
        f"a real target: {REAL_SEEDS} fresh seeds).",
    ),
]
Steps = Annotated[
    int | None,
    typer.Option(
        min=1,
        help=f"Scheduled iterations of each seed's safety phase (default {DEFAULT_STEPS}; "
        f"a real target: {REAL_STEPS}).",
    ),
]
Workers = Annotated[
    int,
    typer.Option(min=1, help="Worker processes, or Ray actors (default on Ray: one per CPU)."),
]
Out = Annotated[
    Path, typer.Option(help="Where the journal, the report and the failing traces are written.")
]
RayAddress = Annotated[
    str | None,
    typer.Option(
        help="Run on Ray actors: a cluster's address, auto, or local (a fresh local instance; "
        "needs the kvspec[ray] extra)."
    ),
]
Deterministic = Annotated[
    bool | None,
    typer.Option(
        "--deterministic/--streamed",
        help="Generations behind a barrier, the same report for any workers (default), or "
        "runs issued as others finish from the corpus as it stands (default on Ray).",
    ),
]
Resume = Annotated[
    Path | None,
    typer.Option(
        help="Continue the campaign journaled in this folder where it stopped (its seeds, "
        "steps and target come from its journal; finished runs are not run again)."
    ),
]

SeedStart = Annotated[int, typer.Option(min=0, help="The first seed.")]
FailFast = Annotated[bool, typer.Option(help="Stop at the first failing seed.")]
Coverage = Annotated[bool, typer.Option(help="Exit 3 if a sometimes goal was never met.")]
JsonOut = Annotated[
    Path | None, typer.Option("--json", help="The campaign's JSON (default: OUT/report.json).")
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
    seed_start: SeedStart = 0,
    workers: Workers = 1,
    out: Out = FAILURE_DIR,
    fail_fast: FailFast = False,
    coverage: Coverage = True,
    target: TargetOption = "kvspec",
    target_version: TargetVersion = None,
    target_python: TargetPython = None,
    json_out: JsonOut = None,
    crosscheck: CrossCheck = False,
    ray_address: RayAddress = None,
    deterministic: Deterministic = None,
    resume: Resume = None,
) -> None:
    """Run a coverage-guided campaign of SEEDS runs (half fresh seeds — each a swarm
    configuration and a generated trace — then mutants of the runs that reached a new
    (event, feature) pair or engine arc), each checked at every event; shrink each distinct
    failure, write it to OUT, print its replay command and what the campaign reached. Every
    result is journaled in OUT as it arrives: a killed campaign continues with --resume OUT."""
    if ctx.invoked_subcommand is not None:
        return
    use_crosscheck(crosscheck)
    fleet = (workers, ray_address)
    if resume is not None:
        raise typer.Exit(_resume(resume, fleet, coverage))
    target = chosen_target(target, ("kvspec", *EXPLORED))
    if target != "kvspec":
        runs = (seeds or REAL_SEEDS, steps or REAL_STEPS, seed_start, fail_fast)
        options = target_options(target_python, target_version)
        raise typer.Exit(_explore_real(target, runs, out, fleet, options))
    seeds, steps = seeds or DEFAULT_SEEDS, steps or DEFAULT_STEPS
    report = explore(
        seeds, steps, seed_start=seed_start, workers=workers, fail_fast=fail_fast, out_dir=out,
        ray_address=ray_address, deterministic=deterministic,
    )  # fmt: skip
    raise typer.Exit(_engine_verdict(report, steps, json_out or out / "report.json", coverage))


def _engine_verdict(report: ExploreReport, steps: int, json_out: Path, coverage: bool) -> int:
    """The engine explorer's report printed and written: 1 failing, 3 a goal unmet, else 0."""
    print_report(report, steps, echo=typer.echo)
    typer.echo(f"wrote {write_report_json(report, steps, json_out)}")
    if report.failed:
        return 1
    return UNMET_COVERAGE if coverage and report.unmet else 0


def _resume(out: Path, fleet: tuple[int, str | None], coverage: bool) -> int:
    """Continue the campaign (the engine's or a real target's) journaled in ``out``."""
    from invariants.explore import resume
    from invariants.fleet import Journal
    from invariants.targets.streamed import resume_real
    from invariants.targets.text import explore_lines, target_flags

    header = Journal.read(out).header
    if header["kind"] == "explore":
        report = resume(out, *fleet)
        return _engine_verdict(report, header["steps"], out / "report.json", coverage)
    real = resume_real(out, *fleet)
    flags = target_flags(real.target, target_options(header["python"], header["version"]))
    for line in explore_lines(real, header["steps"], flags):
        typer.echo(line)
    return 1 if real.failed else 0


def _explore_real(
    name: str,
    runs: tuple[int, int, int, bool],
    out: Path,
    fleet: tuple[int, str | None],
    options: TargetOptions,
) -> int:
    """A real engine's exploration (``runs``: seeds, steps, first seed, fail fast): 0 clean,
    1 a failing seed (no venv: kvspec's main says so, exit 2)."""
    from invariants.targets.explore import RealTarget
    from invariants.targets.streamed import explore_real
    from invariants.targets.text import explore_lines, target_flags

    seeds, steps, seed_start, fail_fast = runs
    workers, ray_address = fleet
    report = explore_real(
        RealTarget(name, options), seeds, steps, seed_start=seed_start, workers=workers,
        fail_fast=fail_fast, out_dir=out, ray_address=ray_address,
    )  # fmt: skip
    for line in explore_lines(report, steps, target_flags(name, options)):
        typer.echo(line)
    return 1 if report.failed else 0


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
    target: TargetOption = "kvspec",
    target_version: TargetVersion = None,
    target_python: TargetPython = None,
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
    if chosen_target(target) == "kvspec":
        result = replay(loaded)
        lines, failure = result.describe(), result.failure
    else:
        from invariants.targets.replay import replay_on

        real = replay_on(target, loaded, target_options(target_python, target_version))
        lines, failure = real.describe(), real.failure
    for line in lines:
        typer.echo(line)
    raise typer.Exit(1 if failure is not None else 0)
