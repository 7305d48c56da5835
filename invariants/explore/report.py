"""The explorer's printed report: failing seeds, the coverage of the `sometimes` goals, and
for each shrunk finding the command that replays it.

Keeps: every failure is printed with what reproduces it — the shrunk trace's
`kvspec replay PATH`, and for seeds that were not shrunk the explore command of that seed.
"""

from __future__ import annotations

from collections.abc import Callable

from invariants.explore.coverage import GOALS
from invariants.explore.explorer import ExploreReport

Echo = Callable[[str], None]
MAX_LISTED = 20  # failing seeds listed one by one


def print_report(report: ExploreReport, steps: int, workers: int, echo: Echo = print) -> None:
    """The whole report, in seed order."""
    failed = report.failed
    for r in failed[:MAX_LISTED]:
        echo(f"seed {r.seed} [{r.label}]: {r.failure}\n  {r.detail}")
    if len(failed) > MAX_LISTED:
        echo(f"... {len(failed) - MAX_LISTED} more failing seeds")
    seeds = len(report.results)
    echo(
        f"explored {seeds} seeds x {steps} steps in {report.seconds:.1f} s ({workers} worker"
        f"{'s' if workers > 1 else ''}): {len(failed)} failing"
    )
    echo("sometimes goals (seeds that made each happen):")
    for goal, count in report.coverage.items():
        echo(f"  {goal:<14} {count:>5}/{seeds}  {'' if count else 'NEVER: '}{GOALS[goal]}")
    for f in report.findings:
        echo(
            f"finding {f.key} (seed {f.seed}): shrunk {f.original_ops} -> {f.shrunk_ops} ops "
            f"in {f.shrink_runs} runs\n  replay: kvspec replay {f.path}"
        )
    shrunk = {f.seed for f in report.findings}
    for r in failed:
        if r.seed not in shrunk and r.failure == "config":
            echo(f"seed {r.seed}: the swarm drew a configuration the engine refuses: {r.detail}")
    rest = [r.seed for r in failed if r.seed not in shrunk and r.failure != "config"]
    if rest:
        echo(
            "not shrunk (same failure as a shrunk seed, or over the limit): "
            f"seeds {rest[:MAX_LISTED]}; "
            f"rerun one with: kvspec explore --seeds 1 --steps {steps} --seed-start SEED"
        )
