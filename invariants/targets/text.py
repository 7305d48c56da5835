"""A real-engine run, exploration or replay command in words, the same for every target (what
`kvspec run|explore --target NAME` and a target's own commands print).

Keeps: a failing run always ends with the command that replays it; a run that could not run
says why, and is never counted clean.
"""

from __future__ import annotations

from invariants.targets.explore import ExploreReport
from invariants.targets.outcome import TargetOutcome
from invariants.targets.registry import TargetOptions
from invariants.targets.registry import target as registered

LISTED = 5  # violations listed in a run's lines


def target_flags(name: str, options: TargetOptions) -> str:
    """The flags that pick this target and release on a replay command line."""
    flags = f"--target {name}"
    flags += f" --target-version {options.version}" if options.version else ""
    return flags + (f" --target-python {options.python}" if options.python else "")


def outcome_lines(name: str, outcome: TargetOutcome, replay: str) -> list[str]:
    """One run (it ran: see ``unsupported_line`` otherwise), then its replay if it failed."""
    entry = registered(outcome.target)
    fired = len(outcome.findings)
    checker = f", {fired} {entry.engine} checker messages" if fired else ""
    lines = [
        f"{name} on {entry.engine} {outcome.version} ({entry.runs}): {outcome.stats}",
        f"{outcome.checks} checks, {len(outcome.violations)} violations{checker}, "
        f"{outcome.seconds:.1f}s",
        *(str(v) for v in outcome.violations[:LISTED]),
    ]
    said = outcome.findings[:3]
    lines += [f"{entry.engine}'s checker, iteration {f.iteration}: {f.message}" for f in said]
    lines += [f"error: {outcome.error}"] if outcome.error else []
    tuned = "(goals were tuned on kvspec's schedule)"
    lines += [f"note: expected {goal} {tuned}" for goal in outcome.unmet]
    lines += [f"note: {note}" for note in outcome.notes]
    if not outcome.ok:
        where = f" (stopped in {outcome.stopped_in})" if outcome.stopped_in else ""
        lines.append(f"replay: {replay}{where}")
    return lines


def unsupported_line(name: str, outcome: TargetOutcome) -> str:
    return f"{name}: not supported by the {outcome.target} target: {'; '.join(outcome.unsupported)}"


def explore_lines(report: ExploreReport, steps: int, flags: str) -> list[str]:
    """An exploration: the failing seeds, the verdict line, each shrunk finding with its
    replay command."""
    entry = registered(report.target)
    lines = [f"seed {r.seed} [{r.label}]: {r.key}\n  {r.detail[:300]}" for r in report.failed[:20]]
    first = "" if report.first_failure_s is None else f"; first at {report.first_failure_s:.1f}s"
    lines.append(
        f"explored {len(report.results)} seeds x {steps} steps on {entry.engine} "
        f"{report.version} ({entry.runs}) in {report.seconds:.1f}s ({report.where}): "
        f"{len(report.failed)} failing{first}"
    )
    lines += [f"infrastructure error (not a finding): {why}" for why in report.infra]
    lines += [
        f"finding {f.key} (seed {f.seed}): shrunk {f.original_ops} -> {f.shrunk_ops} ops in "
        f"{f.shrink_runs} runs\n  replay: kvspec replay {f.path} {flags}"
        for f in report.findings
    ]
    return lines
