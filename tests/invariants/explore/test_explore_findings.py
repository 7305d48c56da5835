"""Findings of the coverage-guided explorer on kvspec's own engine, each pinned as the trace
that showed it and fixed: the trace must now run clean under the whole catalog."""

from __future__ import annotations

from pathlib import Path

from invariants.checking.loader import shipped_catalog
from invariants.scenarios.ops import Trace
from invariants.scenarios.trace_run import run_trace

TRACES = Path(__file__).parent / "traces"


def test_a_continuing_chunk_that_does_not_fit_waits_a_round() -> None:
    """Found by a mutant (seed 7, run m155) as engine.out_of_memory: a chunked prefill
    continued with a full chunk while the running decodes held all but 7 free slots, and its
    extend of 8 could not be allocated. A continuing chunk now takes at most what the pool can
    give it (the rest of its last page, then free or evictable pages) and waits a round when
    that is nothing; the trace runs clean, and at least one round waited."""
    trace = Trace.load(TRACES / "continuing-chunk-does-not-fit.json")
    out = run_trace(trace, shipped_catalog(), stop_at_first=True)
    assert out.ok, out.describe(3)
    assert out.stats.chunked_prefills > 0 and out.stats.chunk_deferred_at > 0
