"""Replay a trace to its first violation and show what changed: the violation, its
witnesses, and the state-view diff between the last step before it and the event where it
fired.

Keeps: the replay's checker is the catalog at level 2 over full views (census and tree
nodes at every event), fed the same events in the same order as the explorer's run, so it
stops at the same violation; the diff is bounded and keyed by identity (requests by rid,
pools by name, tree nodes by id, slots and sessions by session id), not by list position,
so a request that came or went reads as one line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.view import StateView, view_to_dict
from invariants.checking.checker import Checker, InvariantViolation, Level, Violation
from invariants.checking.loader import Catalog
from invariants.explore.explorer import default_catalog, failure_key
from invariants.scenarios.ops import Trace, op_label
from invariants.scenarios.trace_run import TraceOutcome, run_trace

KEYS = ("rid", "name", "session_id", "id", "page")  # what identifies a record in a list
MAX_DIFF_LINES = 40


class ViewRecorder:
    """An observer that checks every event with its own strict checker over full views and,
    at the first violation, keeps that view and the last ``step`` view before it."""

    def __init__(self, catalog: Catalog) -> None:
        self.checker = Checker(catalog, Level.RECORD)
        self.last_step: StateView | None = None
        self.before: StateView | None = None
        self.at: StateView | None = None
        self.violation: Violation | None = None

    def on_event(self, event: str, engine: Any) -> None:
        if not self.checker.wants(event):
            return
        view = engine.state_view(event)
        found = self.checker.check(event, view)
        if found:
            self.before, self.at, self.violation = self.last_step, view, found[0]
            raise InvariantViolation(found[0])  # the runner stops here, as at level 2
        if event == "step":
            self.last_step = view


@dataclass(frozen=True, slots=True)
class Replay:
    """A replay's findings: the first violation (with the op it fired in) and the diff, or
    the run's other failure (engine error, liveness), or nothing."""

    trace: Trace
    outcome: TraceOutcome
    violation: Violation | None
    op_index: int | None
    diff: list[str] = field(default_factory=list)

    @property
    def failure(self) -> str | None:
        return self.violation.invariant if self.violation is not None else failure_key(self.outcome)

    def describe(self) -> list[str]:
        """The printable report: violation, witnesses, op, diff; or the other failure."""
        v, ops = self.violation, self.trace.ops
        if v is None:
            if self.failure is None:
                return [f"no violation: {len(ops)} ops, {self.outcome.steps} steps, idle reached"]
            return [
                f"failure: {self.failure}",
                self.outcome.describe() or "the drain did not reach idle",
                *(self.outcome.error_traceback or "").rstrip().splitlines()[-6:],
            ]
        where = (
            op_label(ops[self.op_index])
            if self.op_index is not None and self.op_index < len(ops)
            else "drain"
        )
        lines = [str(v), f"  title: {v.title}", f"  op #{self.op_index}: {where}"]
        lines += [f"  witness: {w}" for w in v.witnesses]
        lines += [
            "",
            f"state diff (last step view -> {v.event} view at step {v.step}):",
            *self.diff,
        ]
        return lines


def replay(trace: Trace, catalog: Catalog | None = None) -> Replay:
    """Run ``trace`` to its first violation (level 2) and diff the views around it."""
    recorder = ViewRecorder(catalog or default_catalog())
    # the run's own checker records what the recorder cannot see: a crash (engine.*)
    outcome = run_trace(trace, catalog or default_catalog(), Level.RECORD, observers=[recorder])
    if recorder.violation is None:
        crash = next((v for v in outcome.violations if v.event == "crash"), None)
        if crash is not None:
            return Replay(trace, outcome, crash.violation, crash.op_index)
        return Replay(trace, outcome, None, None)
    diff = view_diff(recorder.before or StateView(), recorder.at or StateView())
    return Replay(trace, outcome, recorder.violation, outcome.stopped_at, diff)


def first_violation_diff(views: tuple[StateView, ...], violated: bool) -> list[str]:
    """A real-engine run's views up to its first violating one (the last kept): the diff
    from the last step before it to it, headed; empty when nothing was violated."""
    if not violated or not views:
        return []
    at = views[-1]
    before = next((v for v in reversed(views[:-1]) if v.event == "step"), None)
    if before is None:
        return []
    return [
        "",
        f"state diff (step {before.step} view -> {at.event} view at step {at.step}):",
        *view_diff(before, at),
    ]


def view_diff(before: StateView, after: StateView, limit: int = MAX_DIFF_LINES) -> list[str]:
    """``path: old -> new`` per changed field; ``+ record`` / ``- record`` (its non-empty
    fields on one line) per request, node, slot … that came or went; at most ``limit`` lines."""
    old, new = flatten(view_to_dict(before)), flatten(view_to_dict(after))
    old_records, new_records = _records(old), _records(new)
    lines = []
    for path in sorted(old.keys() | new.keys()):
        record = _record(path)
        if path in old and path in new:
            if old[path] != new[path]:
                lines.append(f"  {path}: {old[path]} -> {new[path]}")
        elif (record is None or (record in old_records and record in new_records)) and (
            value := new.get(path, old.get(path))
        ) != ():  # an empty list: its records say it
            lines.append(f"{'+' if path in new else '-'} {path}: {value}")
    for sign, records, side in (
        ("+", new_records - old_records, new),
        ("-", old_records - new_records, old),
    ):
        for record in sorted(records):
            fields = [
                f"{p[len(record) + 1 :]}={v}" for p, v in side.items() if _record(p) == record and v
            ]
            lines.append(f"{sign} {record}: {' '.join(fields)}"[:160])
    if len(lines) > limit:
        lines = [*lines[:limit], f"  ... {len(lines) - limit} more"]
    return lines


def _record(path: str) -> str | None:
    """The innermost record a leaf path belongs to (``reqs[r3]``), or None."""
    end = path.rfind("]")
    return path[: end + 1] if end >= 0 else None


def _records(flat: dict[str, Any]) -> set[str]:
    return {r for p in flat if (r := _record(p)) is not None}


def flatten(data: Any, path: str = "") -> dict[str, Any]:
    """Leaf paths of plain view data; a list of records becomes ``name[key]`` entries, each
    record one leaf (its fields compared as a whole only when it came or went)."""
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for name, value in data.items():
            out.update(flatten(value, f"{path}.{name}" if path else name))
        return out
    if isinstance(data, list) and data and all(isinstance(x, dict) for x in data):
        out = {}
        for i, record in enumerate(data):
            key = next((record[k] for k in KEYS if k in record), i)
            out.update(flatten(record, f"{path}[{key}]"))
        return out
    return {path: tuple(data) if isinstance(data, list) else data}
