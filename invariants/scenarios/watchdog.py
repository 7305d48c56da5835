"""A step-progress watchdog: a run whose engine owes work but advances no request for
``STALL_ITERATIONS`` scheduler iterations is stalled — ``SchedulerStall``, the ``crash`` event,
``engine.stall`` at that iteration, naming the op and what waits, runs and is chunked — instead
of a cell that spins to its drain budget while every iteration "launches" something.

The engine's own bound (``Engine.run_until_idle``: two empty iterations in a row) catches a
scheduler that runs nothing; this one catches one that keeps running without getting anywhere
(a wedge "relieved" without anything released, a batch that decodes a request whose result is
dropped, a retract and re-admit loop). An iteration advances a request when a request finishes
or an output token is appended; an idle engine owes nothing (idle session slots included).

Keeps: it only reads the engine at its ``step`` event (the last of an iteration) and raises
there, after every other observer saw the iteration, so the checker's findings come first and
the state the crash check reads is the iteration's end; a run is still a pure function of its
trace (the count is of iterations, never of time).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from engine.engine import SchedulerStall

STALL_ITERATIONS = 1_024  # a prompt's chunks at the smallest chunk take ~128; decode advances each
CHECK_EVERY = 32  # iterations between reads of the progress count (it walks the requests)
NAMED = 8  # requests named per queue in the message


class ProgressWatch:
    """An engine observer that raises ``SchedulerStall`` when work is owed but no request has
    advanced for ``limit`` iterations; ``where`` names what the run is doing (the op)."""

    def __init__(self, where: Callable[[], str], limit: int = STALL_ITERATIONS) -> None:
        self.where, self.limit = where, limit
        self.count: tuple[int, int] | None = None  # (finished, output tokens) last seen
        self.since = 0  # the iteration the count last moved (or the engine was idle)

    def on_event(self, event: str, engine: Any) -> None:
        if event != "step":
            return
        iteration = engine.scheduler.stats.iterations
        if engine.is_idle():
            self.count, self.since = None, iteration
            return
        if iteration - self.since < CHECK_EVERY and self.count is not None:
            return
        count = progress_count(engine)
        if count != self.count:
            self.count, self.since = count, iteration
        elif iteration - self.since >= self.limit:
            raise SchedulerStall(self._message(engine, iteration - self.since))

    def _message(self, engine: Any, iterations: int) -> str:
        sched = engine.scheduler
        chunked = sched.chunked_req.rid if sched.chunked_req is not None else "none"
        return (
            f"no request advanced in {iterations} iterations (iteration "
            f"{sched.stats.iterations}, {self.where()}): waiting {_rids(sched.waiting_queue)}, "
            f"running {_rids(sched.running_batch.reqs)}, chunked {chunked}, "
            f"{len(sched.result_queue)} batch(es) in flight"
        )


def progress_count(engine: Any) -> tuple[int, int]:
    """Requests finished, and output tokens of the requests the engine still holds."""
    held = sum(len(r.output_ids) for r in engine.requests.values())
    return engine.scheduler.stats.finished_reqs, held


def _rids(reqs: list[Any]) -> str:
    return f"{len(reqs)} [{named([r.rid for r in reqs])}]"


def named(rids: Sequence[str]) -> str:
    """The first ``NAMED`` ids, comma-separated, and how many more (a stall's message)."""
    more = f" +{len(rids) - NAMED}" if len(rids) > NAMED else ""
    return ", ".join(rids[:NAMED]) + more


__all__ = ["STALL_ITERATIONS", "ProgressWatch", "named", "progress_count"]
