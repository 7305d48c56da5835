"""The pool timeline of one checked run: each pool's ownership buckets at every ``step`` event,
and the steps at which invariants failed — the data behind the report's stacked plots.

Keeps: plain data only (ints, strings, lists, dicts), so a timeline crosses process
boundaries (pickle) and lands in report.json unchanged; recording reads the pool counters of a
view built without its costly parts (no census, no tree nodes), so it never slows a run by
more than one cheap view per iteration.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from engine.view import POOL_BUCKETS, StateView

NO_PARTS: frozenset[str] = frozenset()  # counters only: what the plots need
MAX_MARKS = 500  # distinct (step, invariant) marks kept per run; the rest are counted
MESSAGE_CHARS = 240


@dataclass(slots=True)
class PoolSeries:
    """One pool over the run: ``buckets[name][i]`` tokens in that bucket at ``steps[i]``."""

    name: str
    capacity: int
    steps: list[int] = field(default_factory=list)
    buckets: dict[str, list[int]] = field(default_factory=lambda: {b: [] for b in POOL_BUCKETS})


@dataclass(frozen=True, slots=True)
class Mark:
    """An invariant that failed at one step (a red line on the plot; the text is its tooltip)."""

    step: int
    invariant: str
    event: str
    message: str


@dataclass(slots=True)
class Timeline:
    """An engine observer (``on_event``) and a memory-exercise sink (``record``) in one."""

    pools: dict[str, PoolSeries] = field(default_factory=dict)
    marks: list[Mark] = field(default_factory=list)
    dropped_marks: int = 0

    def on_event(self, event: str, engine: Any) -> None:
        if event == "step":
            self.record(engine.state_view("step", NO_PARTS))

    def record(self, view: StateView) -> None:
        """Append the bucket counts of every pool of a ``step`` view (other events are skipped)."""
        if view.event != "step":
            return
        for pool in view.pools:
            series = self.pools.get(pool.name)
            if series is None:
                series = self.pools[pool.name] = PoolSeries(pool.name, pool.capacity)
            series.steps.append(view.step)
            for bucket in POOL_BUCKETS:
                series.buckets[bucket].append(getattr(pool, bucket))

    def mark(self, violations: Iterable[Any]) -> None:
        """Add one mark per distinct (step, invariant) among ``violations`` (checker records)."""
        seen = {(m.step, m.invariant) for m in self.marks}
        for v in violations:
            if (v.step, v.invariant) in seen:
                continue
            if len(self.marks) >= MAX_MARKS:
                self.dropped_marks += 1
                continue
            seen.add((v.step, v.invariant))
            self.marks.append(Mark(v.step, v.invariant, v.event, str(v.message)[:MESSAGE_CHARS]))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
