"""Where kvspec deliberately differs from SGLang 0.5.23: one list, each with its reason.

Keeps: differential mode classifies every per-step bucket difference as declared (a gap
below applies to the configuration and names that bucket) or unexpected (a finding).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Gap:
    """One deliberate difference: the buckets it moves, whose sum it must keep equal on both
    targets (else the difference is not this gap), and when it applies."""

    id: str
    buckets: tuple[str, ...]
    reason: str
    applies: Callable[[dict[str, Any]], bool]


GAPS: tuple[Gap, ...] = (
    Gap("eviction.amount", ("free", "evictable"),
        "how much an allocation evicts when the pool is short: kvspec follows SGLang 0.5.11 "
        "(alloc_token_slots evicts the whole extend at page size 1); 0.5.23's evict_for_alloc "
        "evicts the shortfall only at page size 1, and the shortfall plus per-request page "
        "padding at page size > 1 (docs/benchmarks.md). Tokens move between free and evictable; "
        "their sum is the same on both targets",
        lambda config: True),
    Gap("session.borrowed_row_is_request_owned", ("session_held", "request_owned"),
        "kvspec counts a session row lent to its running turn as request-owned (held slots "
        "exclude active rows, research/sglang.md §2.2, #22213); 0.5.23 counts every session "
        "record as session-held, including while a turn runs on it",
        lambda config: bool(config.get("sessions"))),
)


def declared(ours: dict[str, int], theirs: dict[str, int], bucket: str, config: dict[str, Any]) -> Gap | None:
    """The gap that declares a difference in ``bucket`` at one step (None: a finding)."""
    for gap in GAPS:
        if bucket in gap.buckets and gap.applies(config) and (
                sum(ours[b] for b in gap.buckets) == sum(theirs[b] for b in gap.buckets)):
            return gap
    return None
