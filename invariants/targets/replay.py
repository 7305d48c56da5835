"""`kvspec replay TRACE --target NAME`: a trace on a real engine to its first finding, with the op
it came in, the engine's own checkers beside it, and the state-view diff from the last step
before it (the engine replay's ``first_violation_diff``).

Keeps: the replay runs the trace exactly as the explorer checked it (same catalog, level 2, a
fresh engine from the config op), so a shrunk failure reproduces with the same key.
"""

from __future__ import annotations

from dataclasses import dataclass

from invariants.explore.replay import first_violation_diff
from invariants.scenarios.ops import Trace
from invariants.targets.explore import RealTarget, failure_key
from invariants.targets.outcome import TargetOutcome, disagreements
from invariants.targets.registry import TargetOptions
from invariants.targets.registry import target as registered

LISTED = 3  # engine checker messages and disagreements shown


@dataclass(frozen=True, slots=True)
class TargetReplay:
    trace: Trace
    outcome: TargetOutcome

    @property
    def failure(self) -> str | None:
        return failure_key(self.outcome)

    def describe(self) -> list[str]:
        out, entry = self.outcome, registered(self.outcome.target)
        head = f"{entry.engine} {out.version} ({entry.runs}), {out.iterations} iterations"
        if self.failure is None:
            return [f"{head}: no finding ({len(self.trace.ops)} ops, idle reached)"]
        lines = [f"{head}: {self.failure}", f"  in {out.stopped_in or 'the drain'}"]
        if out.violations:
            v = out.violations[0]
            lines += [str(v), f"  title: {v.title}", *(f"  witness: {w}" for w in v.witnesses)]
        lines += [
            f"  {entry.engine}'s checker, iteration {f.iteration}: {f.message}"
            for f in out.findings[:LISTED]
        ]
        if entry.engine_checks:
            split = disagreements(out, entry.engine)[:LISTED]
            lines += [f"  disagreement: {d}" for d in split]
        if out.error:
            lines.append(f"  error: {out.error}")
        return lines + first_violation_diff(out.views, bool(out.violations))


def replay_on(name: str, trace: Trace, options: TargetOptions | None = None) -> TargetReplay:
    """``trace`` on target ``name`` as the explorer ran it, its views kept for the diff."""
    target = RealTarget(name, options or TargetOptions())
    return TargetReplay(trace, target.run(trace, keep_views=True))
