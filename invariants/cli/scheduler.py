"""The sglang-scheduler target on the command line: printing a run on SGLang's real scheduler
(`kvspec run|replay --target sglang-scheduler`), `kvspec sglang history` (releases side by
side) and `kvspec sglang lockstep` (kvspec's scheduler beside the real one).

Exit codes: 0 clean, 1 a finding (a kvspec violation, SGLang's own checker firing, a crash in
SGLang's code), 2 no such release venv, a release whose internals moved (one line naming the
attribute and the shim module), or a trace the real scheduler cannot express.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from invariants.cli.sglang import sglang_app
from invariants.report.terminal import Col, out_console, print_table

if TYPE_CHECKING:
    from invariants.explore.real import ExploreReport
    from invariants.scenarios.spec import Spec
    from invariants.targets.sglang_scheduler.run import SchedulerOutcome

VersionOpt = Annotated[
    str | None,
    typer.Option(
        "--sglang-version",
        help="The SGLang release to check (its venv: make sglang-env SGLANG_VERSION=V; "
        "default 0.5.23).",
    ),
]
PythonOpt = Annotated[
    str | None,
    typer.Option("--sglang-python", help="Another interpreter with SGLang (your own checkout)."),
]


def replay_flags(version: str | None) -> str:
    """The target flags of a replay command."""
    return "--target sglang-scheduler" + (f" --sglang-version {version}" if version else "")


def print_scheduler_outcome(name: str, outcome: SchedulerOutcome, replay: str) -> int:
    """One run on the real scheduler; its exit code (see the module docstring)."""
    if outcome.unsupported:
        typer.echo(
            f"{name}: the real scheduler cannot run it: {'; '.join(outcome.unsupported)}", err=True
        )
        return 2
    s = outcome.stats
    typer.echo(
        f"{name} on SGLang {outcome.version} (real scheduler): {s.iterations} iterations, "
        f"{s.finished}/{s.submitted} finished, {s.aborted} aborted, {s.retracted} retracted, "
        f"{s.cached_tokens} cached tokens"
    )
    typer.echo(
        f"{outcome.checks} checks, {len(outcome.violations)} violations, "
        f"{len(outcome.sglang)} SGLang checker messages, {outcome.seconds:.1f}s"
    )
    for violation in outcome.violations[:5]:
        typer.echo(str(violation))
    for disagreement in outcome.disagreements[:5]:
        typer.echo(f"disagreement: {disagreement}")
    if outcome.error:
        typer.echo(f"error: {outcome.error}")
    for goal in outcome.unmet:
        typer.echo(f"note: expected {goal} (goals were tuned on kvspec's schedule)")
    for waived in outcome.waived:
        typer.echo(f"note: not checked on this release: {waived}")
    if not outcome.ok:
        where = f" (stopped in {outcome.replay_op})" if outcome.replay_op else ""
        typer.echo(f"replay: {replay}{where}")
    return 0 if outcome.ok else 1


def run_on_scheduler(
    spec: Spec, replay: str, level: int, version: str | None, python: str | None
) -> int:
    """`kvspec run SPEC --target sglang-scheduler`."""
    from invariants.checking.loader import load_catalog
    from invariants.targets.sglang_scheduler.run import run_spec_on_scheduler

    outcome = guarded(
        lambda: run_spec_on_scheduler(spec, load_catalog(), level, version=version, python=python)
    )
    return print_scheduler_outcome(spec.name, outcome, replay)


def guarded(run):
    """``run()``, with a missing venv or a moved release as one line and exit 2."""
    from invariants.targets.sglang_scheduler.target import ShimDrift
    from invariants.targets.sglang.target import SGLangUnavailable

    try:
        return run()
    except ShimDrift as exc:
        typer.echo(f"shim drift: {exc}", err=True)
    except SGLangUnavailable as exc:
        typer.echo(f"sglang-scheduler target: {exc}", err=True)
    raise typer.Exit(2)


def explore_on_scheduler(
    seeds: int,
    steps: int,
    seed_start: int,
    workers: int,
    out: Path,
    fail_fast: bool,
    version: str | None,
    python: str | None,
) -> int:
    """`kvspec explore --target sglang-scheduler`: 0 clean, 1 a failing seed."""
    from invariants.targets.sglang_scheduler.explore import explore_scheduler

    report = guarded(
        lambda: explore_scheduler(
            version,
            seeds,
            steps,
            seed_start=seed_start,
            workers=workers,
            fail_fast=fail_fast,
            out_dir=out,
            python=python,
        )
    )
    return print_explore_report(report, steps, workers, "SGLang", replay_flags(version))


def print_explore_report(
    report: ExploreReport, steps: int, workers: int, engine: str, flags: str
) -> int:
    """A real-engine exploration: failing seeds, the verdict line, each shrunk finding with
    its replay command; 0 clean, 1 a failing seed."""
    for r in report.failed[:20]:
        typer.echo(f"seed {r.seed} [{r.label}]: {r.key}\n  {r.detail[:300]}")
    first = "" if report.first_failure_s is None else f"; first at {report.first_failure_s:.1f}s"
    typer.echo(
        f"explored {len(report.results)} seeds x {steps} steps on {engine} {report.version} "
        f"(real scheduler) in {report.seconds:.1f}s ({workers} workers): "
        f"{len(report.failed)} failing{first}"
    )
    for f in report.findings:
        typer.echo(
            f"finding {f.key} (seed {f.seed}): shrunk {f.original_ops} -> {f.shrunk_ops} ops "
            f"in {f.shrink_runs} runs\n  replay: kvspec replay {f.path} {flags}"
        )
    return 1 if report.failed else 0


@sglang_app.command("history")
def history_command(
    versions: Annotated[
        str | None,
        typer.Option(help="Comma-separated releases (default: every installed venv)."),
    ] = None,
    seeds: Annotated[int, typer.Option(min=0, help="Exploration seeds per release.")] = 40,
    steps: Annotated[int, typer.Option(min=1, help="Ops per seed.")] = 200,
    workers: Annotated[int, typer.Option(min=1, help="Exploration processes.")] = 2,
    json_path: Annotated[Path | None, typer.Option("--json", help="Write the table here.")] = None,
) -> None:
    """Every release's real scheduler on the default specs and an exploration budget: a
    release x finding table (what fired, iteration, pages named, replay). Exit 0."""
    from invariants.targets.sglang_scheduler.history import history_json, sglang_history

    chosen = [v.strip() for v in versions.split(",")] if versions else None
    histories = sglang_history(chosen, seeds, steps, workers)
    if not histories:
        typer.echo("no sglang venv installed: run `make sglang-env`", err=True)
        raise typer.Exit(2)
    print_history(histories)
    if json_path is not None:
        json_path.write_text(json.dumps(history_json(histories), indent=2, default=str))
        typer.echo(f"wrote {json_path}")


def print_history(histories) -> None:
    """The release x finding table, then one line per release."""
    cols = (Col("release"), Col("source"), Col("seen by"), Col("invariant"), Col("iter", "num"),
            Col("pages", "text"), Col("replay"))  # fmt: skip
    rows = [
        [r.release, r.source, r.kind + (f" x{r.iterations}" if r.iterations > 1 else ""),
         r.invariant, r.iteration, ", ".join(map(str, r.pages)) or "-", r.replay]
        for h in histories
        for r in h.rows
    ]  # fmt: skip
    print_table(out_console(), cols, rows)
    for h in histories:
        if h.error:
            typer.echo(f"{h.release}: not run: {h.error}")
            continue
        first = "" if h.first_finding_s is None else f", first at {h.first_finding_s:.1f}s"
        typer.echo(
            f"{h.release}: {h.specs_clean}/{h.specs_run} specs clean "
            f"({len(h.unsupported)} unsupported), {h.seeds_failed}/{h.seeds} seeds failing"
            f"{first}; {len(h.rows)} findings in {h.seconds:.0f}s"
        )
