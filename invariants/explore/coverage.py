"""`sometimes` goals: what an exploration must have made happen at least once.

Keeps: a goal is a coverage claim, not a safety property (Antithesis `sometimes`, TigerBeetle
marks): a run whose seeds never retract cannot have tested retract, so an unmet goal is a
test-design finding, reported with the run (FoundationDB treats it the same way).
Each goal is read from the run's own record: the scheduler's counters, the op results, and
one observer that sees a streaming turn borrow its session slot's KV.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from invariants.scenarios.ops import Abort
from invariants.scenarios.trace_run import TraceOutcome

GOALS: dict[str, str] = {
    "retract": "a running request was retracted (memory pressure or a forced retract)",
    "eviction": "the prefix cache evicted KV to make room",
    "chunking": "a prefill was split into chunks",
    "spec_reject": "EAGLE verification rejected a draft token",
    "session_reuse": "a streaming turn reused its session slot's KV",
    "abort": "an abort op found a live request and finished it",
}


class SlotReuseObserver:
    """Sees a streaming turn match its session slot with a non-empty prefix (the slot's
    ``restored_prefix_len``, set by the restore and cleared by the next save)."""

    __slots__ = ("seen",)

    def __init__(self) -> None:
        self.seen = False

    def on_event(self, event: str, engine: Any) -> None:
        if event == "schedule" and not self.seen:
            slots = getattr(engine.mem.tree_cache, "slots", None) or {}
            self.seen = any(slot.restored_prefix_len > 0 for slot in slots.values())


def goals_met(outcome: TraceOutcome, reuse: SlotReuseObserver) -> frozenset[str]:
    """The goals one seed's run met."""
    stats = outcome.stats
    ops = outcome.trace.ops
    met = {
        "retract": stats.retracted_reqs > 0,
        "eviction": stats.evicted_tokens > 0,
        "chunking": stats.chunked_prefills > 0,
        "spec_reject": any(stats.spec_accept_hist[:-1]),  # a verify accepted fewer than all drafts
        "session_reuse": reuse.seen,
        "abort": any(
            r.status == "ok" and r.index < len(ops) and isinstance(ops[r.index], Abort)
            for r in outcome.results
        ),
    }
    return frozenset(goal for goal, hit in met.items() if hit)


def coverage(per_seed: Iterable[frozenset[str]]) -> dict[str, int]:
    """Per goal, how many seeds met it (0: unmet)."""
    counts = dict.fromkeys(GOALS, 0)
    for met in per_seed:
        for goal in met:
            counts[goal] += 1
    return counts
