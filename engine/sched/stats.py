"""What a scheduler iteration reports: its outcome, its counters, its errors.

Keeps: the counters only grow; each feature's counter > 0 proves the feature ran (the grid
tests and the report's `expect` goals read them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


class StepOutcome(NamedTuple):
    """What one iteration did: launched a batch, processed results, declared idle."""

    launched: bool
    processed: bool
    idle: bool


class SchedulerError(RuntimeError):
    """A scheduling rule was broken (e.g. a second chunked prefill while one is in flight)."""


@dataclass(slots=True)
class SchedulerStats:
    """Counters of what the scheduler did; each feature's counter > 0 proves it ran."""

    iterations: int = 0
    forward_ct: int = 0
    prefill_batches: int = 0
    decode_batches: int = 0
    mixed_batches: int = 0
    chunked_prefills: int = 0  # forwards that carried a truncated (non-final) chunk
    retract_rounds: int = 0
    retracted_reqs: int = 0
    finished_reqs: int = 0
    aborted_reqs: int = 0
    extend_tokens: int = 0
    decode_tokens: int = 0
    cached_tokens: int = 0
    evicted_tokens: int = 0  # the memory layer's counter, copied at the end of each iteration
    spec_accept_hist: tuple[int, ...] = ()  # EAGLE: verifies by accepted draft count 0..num_steps
    chunk_deferred_at: int = -1  # the last iteration whose continuing chunk could not fit
