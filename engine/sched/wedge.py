"""Sessions cannot wedge the scheduler (SGLang #27024; vLLM #49439 breaks it the same way).

Streaming sessions pin their KV between turns: session-held, invisible to eviction. When
enough sessions wait for their next turn at once, that KV can leave no room for any of them:
nothing runs, nothing is in flight, every turn waits — forever, while ``/health`` answers
200. Two iterations in a row that launch and process nothing in that state (the engine's own
stall bound; one is transient) are a *wedge*. The breaker, one action per wedged iteration:

1. reclaims the idle slot of a waiting turn's session — the youngest turn's first (the head
   last), so the oldest is admitted first (``StreamingSession.reclaim``: the slot's KV
   returns to the pool as an abort's wipe does; the turn re-prefills its history from
   whatever the prefix cache still holds, so its tokens are unchanged);
2. else the idle slot of a session with no turn waiting.

A retract whose last running request alone does not fit (SGLang raises) reclaims the same
way first. A request the pool could never hold alone is refused at submit (``max_req_len``,
400), so with every slot reclaimed a wedge cannot remain; if one did, ``stats.wedged_at``
marks it and ``sched.no_wedge`` names it. ``stats.wedge_reclaims`` counts the slots reclaimed.
"""

from __future__ import annotations

from collections.abc import Sized
from typing import Protocol

from engine.memory import KVMemory
from engine.request import Req
from engine.sched.batch import ScheduleBatch
from engine.sched.stats import SchedulerStats


class Scheduler(Protocol):
    """What the breaker reads of engine/sched/scheduler.py's ``Scheduler``."""

    waiting_queue: list[Req]
    running_batch: ScheduleBatch
    chunked_req: Req | None
    mem: KVMemory
    stats: SchedulerStats

    @property
    def result_queue(self) -> Sized: ...


def is_wedged(s: Scheduler) -> bool:
    """Work waits, but nothing runs, nothing is chunked, launched or left to process."""
    return bool(
        s.waiting_queue
        and s.running_batch.is_empty()
        and s.chunked_req is None
        and not s.result_queue
    )


def reclaim_slot(s: Scheduler) -> bool:
    """Reclaim one session slot nothing runs on: a waiting turn's (youngest first), else an
    idle session's. Also what a retract falls back on when its last running request alone
    does not fit (SGLang raises there: the rest of the pool is pinned)."""
    streaming = s.mem.streaming
    if streaming is None:
        return False
    if any(streaming.reclaim(req) for req in s.waiting_queue[::-1]) or streaming.reclaim_idle():
        s.stats.wedge_reclaims += 1
        return True
    return False


class WedgeBreaker:
    """Counts consecutive iterations that launched and processed nothing while wedged; from
    the second on (one such iteration is transient: a release lands at processing) the
    state is a wedge and the breaker acts once per iteration."""

    def __init__(self) -> None:
        self.streak = 0

    def after(self, s: Scheduler, did_nothing: bool) -> bool:
        """Called at the end of every iteration; whether the breaker relieved a wedge (an
        unrelieved one is marked ``stats.wedged_at``)."""
        self.streak = self.streak + 1 if did_nothing and is_wedged(s) else 0
        if self.streak < 2:
            return False
        if reclaim_slot(s):
            return True
        s.stats.wedged_at = s.stats.iterations
        return False
