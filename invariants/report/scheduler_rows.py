"""`kvspec report --target sglang-scheduler`: every default spec, as written, on SGLang's real
scheduler (invariants/targets/sglang_scheduler/), as the side-by-side rows of the sglang target.

Keeps: the sglang target's verdict rules (an unsupported spec is shown with its reason, an
unmet goal is shown, not failed), checked at level 2 as `kvspec run --target sglang-scheduler`
does (the first failing view, every invariant of it), and one more failing cause: SGLang's own
checker firing (recorded per iteration beside kvspec's; a disagreement is named in the notes).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from invariants.checking.checker import Level
from invariants.checking.loader import shipped_catalog
from invariants.report.model import MAX_LISTED, TargetRow
from invariants.scenarios.matrix import relative
from invariants.scenarios.spec import load_spec

CHECKER_LISTED = 3  # SGLang's own checker messages kept per row


def scheduler_row(name: str, replay: str, outcome: Any) -> TargetRow:
    """A ``SchedulerOutcome`` of ``invariants.targets.sglang_scheduler.run`` as a row."""
    if outcome.unsupported:
        why = "; ".join(outcome.unsupported)
        return TargetRow(name, replay, unsupported=why, target="sglang-scheduler")
    s = outcome.stats
    counters = {
        "finished": s.finished,
        "cached": s.cached_tokens,
        "aborted": s.aborted,
        "retracted": s.retracted,
    }
    notes = tuple(f"disagreement: {d}" for d in outcome.disagreements[:CHECKER_LISTED])
    notes += tuple(f"not checked on this release: {w}" for w in outcome.waived)
    checker = tuple(f"iteration {f.iteration}: {f.message[:200]}" for f in outcome.sglang)
    return TargetRow(
        name,
        replay + (f"  # stops in {outcome.replay_op}" if outcome.replay_op else ""),
        steps=s.iterations,
        checks=outcome.checks,
        num_violations=len(outcome.violations),
        violations=tuple(asdict(v) for v in outcome.violations[:MAX_LISTED]),
        unmet=outcome.unmet,
        error=outcome.error,
        seconds=outcome.seconds,
        counters=counters,
        notes=notes,
        version=f"{outcome.version} (real scheduler)",
        target="sglang-scheduler",
        checker=checker[:CHECKER_LISTED],
    )


def run_scheduler_rows(
    specs: list[tuple[str, Path]],
    version: str | None = None,
    python: str | None = None,
    progress: Callable[[TargetRow], None] = lambda row: None,
) -> list[TargetRow]:
    """Every spec of ``specs`` on the release's real scheduler, one driver (each trace in a
    fresh child of it); ``SGLangUnavailable``/``ShimDrift`` before any run when the release's
    venv is missing or its internals moved."""
    from invariants.targets.sglang_scheduler.run import run_spec_on_scheduler
    from invariants.targets.sglang_scheduler.target import SchedulerDriver

    flags = " --target sglang-scheduler" + (f" --sglang-version {version}" if version else "")
    catalog, rows = shipped_catalog(), []
    with SchedulerDriver(version, python) as driver:
        for name, path in specs:
            outcome = run_spec_on_scheduler(load_spec(path), catalog, Level.STRICT, driver=driver)
            row = scheduler_row(name, f"kvspec run {relative(path)}{flags}", outcome)
            rows.append(row)
            progress(row)
    return rows
