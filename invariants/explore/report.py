"""The explorer's printed report and its JSON record: failing runs, what the campaign reached
(the `sometimes` goals, the (event, feature) pairs, the engine's arcs), and for each shrunk
finding the command that replays it.

Keeps: every failure is printed with what reproduces it — the shrunk trace's
`kvspec replay PATH`, and for a fresh seed that was not shrunk the explore command of that
seed (a mutant's trace is written beside the findings).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from invariants.explore.explorer import ExploreReport
from invariants.explore.features import REQUIRED
from invariants.fleet import write_atomic

Echo = Callable[[str], None]
MAX_LISTED = 20  # failing runs listed one by one


def print_report(report: ExploreReport, steps: int, echo: Echo = print) -> None:
    """The whole report, in run order."""
    failed = report.failed
    for r in failed[:MAX_LISTED]:
        echo(f"{r.name} [{r.label}]: {r.failure}\n  {r.detail}")
    if len(failed) > MAX_LISTED:
        echo(f"... {len(failed) - MAX_LISTED} more failing runs")
    runs = len(report.results)
    echo(
        f"explored {runs} runs x {steps} steps in {report.seconds:.1f} s ({report.where}): "
        f"{len(failed)} failing"
    )
    for why in report.infra:
        echo(f"infrastructure error (not a finding): {why}")
    echo(
        f"reached {len(report.features)} (event, feature) pairs and {len(report.arcs)} engine "
        f"arcs; {report.corpus} runs kept for reaching something new"
    )
    echo("sometimes goals (runs that made each happen):")
    for goal, count in report.coverage.items():
        text = REQUIRED[goal][1]
        echo(f"  {goal:<22} {count:>5}/{runs}  {'' if count else 'NEVER: '}{text}")
    for f in report.findings:
        echo(
            f"finding {f.key} ({f.name}): shrunk {f.original_ops} -> {f.shrunk_ops} ops "
            f"in {f.shrink_runs} runs\n  replay: kvspec replay {f.path}"
        )
    _print_unshrunk(report, steps, echo)


def _print_unshrunk(report: ExploreReport, steps: int, echo: Echo) -> None:
    shrunk = {f.name for f in report.findings}
    for r in report.failed:
        if r.name not in shrunk and r.failure == "config":
            echo(f"{r.name}: a configuration the engine refuses: {r.detail}")
    rest = [r.name for r in report.failed if r.name not in shrunk and r.failure != "config"]
    if rest:
        echo(
            "not shrunk (same failure as a shrunk run, or over the limit): "
            f"{', '.join(rest[:MAX_LISTED])}; rerun a fresh seed with: "
            f"kvspec explore --seeds 1 --steps {steps} --seed-start SEED"
        )


def report_json(report: ExploreReport, steps: int) -> dict[str, Any]:
    """The campaign as JSON: every run, the findings, the coverage."""
    return {
        "runs": len(report.results),
        "steps": steps,
        "seconds": round(report.seconds, 2),
        "where": report.where,
        "infra": report.infra,
        "failing": [
            {"run": r.name, "label": r.label, "failure": r.failure, "detail": r.detail}
            for r in report.failed
        ],
        "findings": [
            {"run": f.name, "key": f.key, "replay": f"kvspec replay {f.path}", "ops": f.shrunk_ops}
            for f in report.findings
        ],
        "coverage": {
            "goals": {
                goal: {"runs": n, "feature": REQUIRED[goal][0], "means": REQUIRED[goal][1]}
                for goal, n in report.coverage.items()
            },
            "features": sorted(report.features),
            "arcs": len(report.arcs),
            "corpus": report.corpus,
        },
    }


def write_report_json(report: ExploreReport, steps: int, path: Path) -> Path:
    return write_atomic(path, json.dumps(report_json(report, steps), indent=2) + "\n")
