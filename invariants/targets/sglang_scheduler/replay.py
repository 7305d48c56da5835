"""`kvspec replay TRACE --target sglang-scheduler`: a trace on one SGLang release to its first
finding, with the op it came in, SGLang's own checkers beside it, and the state-view diff from
the last step before it (the engine replay's ``view_diff``).

Keeps: the replay runs the trace exactly as the explorer checked it (same catalog, level 2, a
fresh Scheduler), so a shrunk failure reproduces with the same key.
"""

from __future__ import annotations

from dataclasses import dataclass

from invariants.checking.loader import shipped_catalog
from invariants.explore.real import failure_key
from invariants.explore.replay import first_violation_diff
from invariants.scenarios.ops import Trace
from invariants.targets.sglang_scheduler.run import SchedulerOutcome, run_trace_on_scheduler


@dataclass(frozen=True, slots=True)
class SchedulerReplay:
    outcome: SchedulerOutcome

    @property
    def failure(self) -> str | None:
        return failure_key(self.outcome)

    def describe(self) -> list[str]:
        out = self.outcome
        head = f"SGLang {out.version} (real scheduler), {out.stats.iterations} iterations"
        if self.failure is None:
            return [f"{head}: no finding ({len(out.trace.ops)} ops, idle reached)"]
        lines = [f"{head}: {self.failure}", f"  in {out.replay_op}"]
        if out.violations:
            v = out.violations[0]
            lines += [str(v), f"  title: {v.title}", *(f"  witness: {w}" for w in v.witnesses)]
        lines += [
            f"  SGLang's checker, iteration {f.iteration}: {f.message}" for f in out.sglang[:3]
        ]
        lines += [f"  disagreement: {d}" for d in out.disagreements[:3]]
        if out.error:
            lines.append(f"  error: {out.error}")
        return lines + first_violation_diff(out.views, bool(out.violations))


def replay_on_scheduler(
    trace: Trace, version: str | None = None, python: str | None = None
) -> SchedulerReplay:
    outcome = run_trace_on_scheduler(
        trace, shipped_catalog(), version=version, python=python, keep_views=True
    )
    return SchedulerReplay(outcome)
