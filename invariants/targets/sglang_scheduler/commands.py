"""`kvspec sglang env|probe|history|bisect|lockstep|seed-bugs`: the sglang-scheduler target's
own commands — a release's (or a checkout's) venv, which adapter drives it and why, releases
side by side, where a finding came in, kvspec's scheduler beside the real one, and how long
exploration takes to each seed bug a release shipped.

Exit codes: 0 clean (history: always, it is a table), 1 a divergence (lockstep) or no answer
(bisect), 2 no such release venv, a release whose internals moved (one line naming the
attribute and the adapter module), an invalid spec, or a trace the real scheduler cannot
express.
"""

from __future__ import annotations

import json
import textwrap
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from invariants.terminal import Col, out_console, print_table

if TYPE_CHECKING:
    from invariants.targets.sglang_scheduler.bisect import Bisection
    from invariants.targets.sglang_scheduler.history import ReleaseHistory
    from invariants.targets.sglang_scheduler.lockstep import LockstepResult

VersionOpt = Annotated[
    str | None,
    typer.Option(
        "--target-version",
        "--sglang-version",
        help="The SGLang release to check (its venv: make sglang-env SGLANG_VERSION=V; "
        "default 0.5.23).",
    ),
]
PythonOpt = Annotated[
    str | None,
    typer.Option(
        "--target-python", "--sglang-python", help="Another interpreter with SGLang (a checkout)."
    ),
]
Sets = Annotated[
    list[str] | None,
    typer.Option("--set", help="Override an engine field: KEY=VALUE (enable_overlap=false)."),
]


def register(group: typer.Typer) -> None:
    """Attach the commands to the `kvspec sglang` group."""
    group.command("env")(env_command)
    group.command("probe")(probe_command)
    group.command("history")(history_command)
    group.command("bisect")(bisect_command)
    group.command("lockstep")(lockstep_command)
    group.command("seed-bugs")(seed_bugs_command)


def env_command(
    versions: Annotated[
        str,
        typer.Option(
            "--version", help="Comma-separated releases, or `all` (every one from 0.5.10)."
        ),
    ] = "0.5.23",
    src: Annotated[
        Path | None, typer.Option(help="An SGLang checkout: its venv, over the nearest release's.")
    ] = None,
    venv: Annotated[Path | None, typer.Option(help="Build into this directory instead.")] = None,
) -> None:
    """Build the CPU venv of SGLang releases (each a layer over one shared base, from the
    wheel's own declared requirements) or of a checkout; a venv already up to date is left
    alone. Exit 2, naming the release or path, when one cannot be built."""
    from invariants.targets.sglang_scheduler.checkout import build_checkout
    from invariants.targets.sglang_scheduler.venvs import build_release, index_releases

    if src is not None:
        built, version = build_checkout(src, index_releases(), venv=venv)
        typer.echo(f"run it: --target-python {built / 'bin' / 'python'}  (sglang {version})")
        return
    chosen = index_releases() if versions == "all" else [v.strip() for v in versions.split(",")]
    if venv is not None and len(chosen) > 1:
        raise typer.BadParameter("--venv takes one release", param_hint="--venv")
    for version in chosen:
        build_release(version, venv=venv)


def probe_command(version: VersionOpt = None, python: PythonOpt = None) -> None:
    """Which adapter drives a release (or a checkout's interpreter) and why: each probe's
    answer and reason, the features beyond the plain ones it drives, the catalog ids its
    design does not promise. Exit 0; 2 when it has no venv or no adapter drives it."""
    from invariants.targets.sglang_scheduler.releases import SchedulerDriver

    with SchedulerDriver(version, python) as driver:
        banner = driver.banner
    typer.echo(f"sglang {banner['version']}: {banner['adapter']}")
    rows = [[name, *said.split(": ", 1)] for name, said in banner["probes"].items()]
    print_table(out_console(), (Col("probe"), Col("answer"), Col("why", "text")), rows)
    typer.echo(f"drives beyond the plain features: {', '.join(banner['supports']) or 'none'}")
    for invariant, why in banner["not_applicable"].items():
        typer.echo(f"not applicable: {invariant}: {why}")


def bisect_command(
    trace: Annotated[Path, typer.Argument(help="A finding's trace (JSON) or a spec (YAML).")],
    good: Annotated[str | None, typer.Option(help="A release on one side (e.g. 0.5.11).")] = None,
    bad: Annotated[str | None, typer.Option(help="A release on the other side.")] = None,
    sglang_src: Annotated[
        Path | None, typer.Option(help="An SGLang git clone: bisect its commits instead.")
    ] = None,
    commits: Annotated[
        str | None, typer.Option(help="With --sglang-src: the commit range A..B.")
    ] = None,
    finding: Annotated[
        str | None,
        typer.Option(help="The failure key to follow (default: the failing end's, the bad end's)."),
    ] = None,
    json_path: Annotated[Path | None, typer.Option("--json", help="Write the steps here.")] = None,
) -> None:
    """Replay a finding's trace release by release (or commit by commit of a clone) and name
    the first release (or commit) where it appears or disappears. Exit 0 with an answer, 1
    without one (skips hide it, or the ends agree), 2 on bad input."""
    from invariants.targets.sglang_scheduler.bisect import bisect_commits, bisect_releases

    loaded = _load_trace(trace)
    if sglang_src is not None:
        if not commits:
            raise typer.BadParameter("--sglang-src needs --commits A..B", param_hint="--commits")
        result = bisect_commits(loaded, sglang_src, commits, trace.name, finding)
    elif good and bad:
        result = bisect_releases(loaded, good, bad, trace.name, finding)
    else:
        raise typer.BadParameter("give --good and --bad, or --sglang-src and --commits")
    print_bisection(result)
    if json_path is not None:
        json_path.write_text(json.dumps(asdict(result), indent=2))
    raise typer.Exit(0 if result.first else 1)


def _load_trace(path: Path):
    """A trace file, or a spec's trace."""
    from invariants.scenarios.ops import Trace
    from invariants.scenarios.scenario import build_trace
    from invariants.scenarios.spec import load_spec

    if path.suffix in (".yaml", ".yml"):
        return build_trace(load_spec(path))
    return Trace.load(path)


def print_bisection(result: Bisection) -> None:
    """Each step tried, in order, then the answer."""
    cols = (Col("tried"), Col("ran as"), Col("verdict"), Col("failure key"), Col("s", "num"))
    rows: list[list[str | float]] = [
        [s.label, s.version or "-", s.verdict, s.key or s.why or "clean", round(s.seconds, 1)]
        for s in result.steps
    ]
    print_table(out_console(), cols, rows)
    typer.echo(f"{result.trace}: {result.conclusion()}")


def history_command(
    versions: Annotated[
        str | None,
        typer.Option(help="Comma-separated releases, or `all` (default: every installed venv)."),
    ] = None,
    seeds: Annotated[int, typer.Option(min=0, help="Exploration seeds per release.")] = 40,
    steps: Annotated[int, typer.Option(min=1, help="Ops per seed.")] = 200,
    workers: Annotated[int, typer.Option(min=1, help="Exploration processes.")] = 2,
    json_path: Annotated[Path | None, typer.Option("--json", help="Write the table here.")] = None,
) -> None:
    """Every release's real scheduler on the default specs and an exploration budget: a
    release x finding table (what fired, iteration, pages named, replay). Exit 0."""
    from invariants.targets.sglang_scheduler.history import history_json, sglang_history

    every = versions is None or versions == "all"  # every installed release
    chosen = None if every else [v.strip() for v in str(versions).split(",")]
    histories = sglang_history(chosen, seeds, steps, workers)
    if not histories:
        typer.echo("no sglang venv installed: run `make sglang-env`", err=True)
        raise typer.Exit(2)
    print_history(histories)
    if json_path is not None:
        json_path.write_text(json.dumps(history_json(histories), indent=2, default=str))
        typer.echo(f"wrote {json_path}")


def print_history(histories: list[ReleaseHistory]) -> None:
    """The release x finding table, each finding's span over the releases, then one line
    per release."""
    from invariants.targets.sglang_scheduler.history import finding_spans

    cols = (Col("release"), Col("source"), Col("seen by"), Col("invariant"), Col("iter", "num"),
            Col("pages", "text"), Col("replay"))  # fmt: skip
    rows = [
        [r.release, r.source, r.kind + (f" x{r.iterations}" if r.iterations > 1 else ""),
         r.invariant, r.iteration, ", ".join(map(str, r.pages)) or "-", r.replay]
        for h in histories
        for r in h.rows
    ]  # fmt: skip
    print_table(out_console(), cols, rows)
    spans = finding_spans(histories)
    if spans:
        span_cols = (Col("finding"), Col("seen by"), Col("first"), Col("last"), Col("releases"))
        span_rows = [
            [
                s.invariant,
                s.kind,
                s.first,
                s.last,
                f"{len(s.releases)}/{len(s.releases) + len(s.clean)}",
            ]
            for s in spans
        ]
        print_table(out_console(), span_cols, span_rows)
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


def lockstep_command(
    spec: Annotated[Path, typer.Argument(help="A scenario spec (specs/*.yaml).")],
    target_version: VersionOpt = None,
    target_python: PythonOpt = None,
    set_: Sets = None,
    reasons: Annotated[bool, typer.Option(help="Print each declared gap's reason.")] = False,
) -> None:
    """The spec's trace on kvspec's engine and on SGLang's real scheduler in lockstep: each
    iteration's batch (forward mode, requests, new tokens each, retractions) and pool
    buckets compared; the first difference no declared gap explains is printed with both
    sides' batch and buckets."""
    from invariants.scenarios.spec import load_spec, parse_overrides
    from invariants.targets.sglang_scheduler.lockstep import lockstep_spec

    loaded = load_spec(spec, parse_overrides(set_ or []))
    result = lockstep_spec(loaded, version=target_version, python=target_python)
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


def seed_bugs_command(
    seeds: Annotated[int, typer.Option(min=1, help="Seeds explored per release at most.")] = 40,
    workers: Annotated[int, typer.Option(min=1, help="Exploration processes.")] = 2,
    releases: Annotated[
        str, typer.Option(help="Releases to explore (default: each seed bug's own).")
    ] = "",
) -> None:
    """The time exploration takes to its first finding of each seed bug a release shipped
    (JSON; needs the release venvs)."""
    from invariants.machine import machine_info
    from invariants.targets.sglang_scheduler.seed_bugs import first_findings

    chosen = tuple(r.strip() for r in releases.split(",") if r.strip())
    rows = first_findings(seeds, workers=workers, releases=chosen)
    typer.echo(json.dumps({"machine": machine_info(), "first_findings": rows}, indent=2))
