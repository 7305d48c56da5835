"""What a scheduler iteration reports: its outcome, its counters, its errors.

Keeps: the counters only grow; each feature's counter > 0 proves the feature ran (the grid
tests and the report's `expect` goals read them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from engine.model.runner import ForwardMode

if TYPE_CHECKING:
    from engine.sched.batch import ScheduleBatch


class StepOutcome(NamedTuple):
    """What one iteration did: launched a batch, processed results, declared idle, relieved
    a wedge (engine/sched/wedge.py: progress, though nothing ran)."""

    launched: bool
    processed: bool
    idle: bool
    relieved: bool = False

    @property
    def progressed(self) -> bool:
        """Something changed: a batch launched or processed, or a wedge relieved."""
        return self.launched or self.processed or self.relieved


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
    wedge_reclaims: int = 0  # idle session slots reclaimed to break a wedge (wedge.py)
    wedged_at: int = -1  # the last iteration wedged with nothing the breaker could do


def count_batch(s: SchedulerStats, batch: ScheduleBatch, forward_ct: int) -> None:
    """Count one launched batch: its kind and its tokens."""
    fb = batch.forward
    assert fb is not None
    s.forward_ct = forward_ct
    s.prefill_batches += batch.mode is ForwardMode.EXTEND
    s.decode_batches += batch.mode is ForwardMode.DECODE
    s.mixed_batches += batch.mode is ForwardMode.MIXED
    # a decode batch keeps a stale chunked_req: count extend batches only
    s.chunked_prefills += batch.is_extend and batch.chunked_req is not None
    decode = len(batch.decoding_reqs or ()) if batch.is_extend else batch.batch_size()
    s.decode_tokens += decode
    s.extend_tokens += len(fb.input_ids) - decode if batch.is_extend else 0  # not verify
