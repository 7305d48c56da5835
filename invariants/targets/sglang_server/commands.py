"""`kvspec sglang repro|session-tests`: the sglang-server target's own commands — a finding's
trace as a reproducer a maintainer runs without kvspec (repro.py), and the release's own
streaming-session tests against its real server (session_tests.py).

Exit codes: 0 a validated reproducer written; 1 written but not reproducible over HTTP alone
(the reason in ISSUE.md), or the trace runs clean on the server; 2 no such release venv, a
server that does not start, an invalid trace.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from invariants.targets.sglang_scheduler.commands import VersionOpt, _load_trace


def register(group: typer.Typer) -> None:
    """Attach the commands to the `kvspec sglang` group."""
    group.command("repro")(repro_command)
    group.command("session-tests")(session_tests_command)


def session_tests_command(
    version: VersionOpt = None,
    tests: Annotated[
        list[str] | None, typer.Argument(help="Test method names (default: all).")
    ] = None,
) -> None:
    """Run the release's own streaming-session tests (its sglang/test kits, composed as its
    test_streaming_session.py composes them) against its real HTTP server on CPU, only the
    server launch kvspec's; each test passed, failed (with SGLang's exception when the
    scheduler died) or not applicable on CPU, with the reason. Exit 1 when one failed."""
    from invariants.targets.sglang_server.session_tests import print_results, run_session_tests

    results = run_session_tests(version, tests or [])
    print_results(results)
    raise typer.Exit(1 if any(r["outcome"] == "failed" for r in results) else 0)


def repro_command(
    finding: Annotated[Path, typer.Argument(help="A finding's trace (JSON) or a spec (YAML).")],
    out: Annotated[Path, typer.Option(help="Write the reproducer here.")] = Path("repro"),
    version: VersionOpt = None,
    tries: Annotated[int, typer.Option(help="How often the script may try (timing).")] = 20,
    history: Annotated[
        bool, typer.Option(help="Run the trace on every installed release (affected releases).")
    ] = True,
) -> None:
    """Write a self-contained reproducer of a finding (on any sglang target): the exact
    `launch_server` line, a script (Python's standard library only) that performs the trace
    over HTTP and says what it observed, and an issue text — after validating both against
    SGLang's real server on CPU. Exit 0 validated, 1 not reproducible over HTTP alone (said
    why), 2 bad input."""
    from invariants.targets.sglang_server.repro import NothingToReproduce, reproduce

    try:
        done = reproduce(_load_trace(finding), version, out, tries, history)
    except NothingToReproduce as exc:
        typer.echo(f"nothing to reproduce: {exc}")
        raise typer.Exit(1) from None
    state = "validated" if done.validated else "NOT reproducible over HTTP alone"
    typer.echo(f"{done.key}: {state}")
    typer.echo(f"  the script said: {done.said.splitlines()[0] if done.said else '-'}")
    typer.echo(
        f"  affected: {', '.join(done.releases) or '-'}; not: {', '.join(done.clean) or '-'}"
    )
    typer.echo(f"  written: {out}/launch.sh, {out}/repro.py, {out}/ISSUE.md, {out}/trace.json")
    raise typer.Exit(0 if done.validated else 1)
