"""KV integrity: every slot a request reads holds the fingerprint of its own token at that
position; a broken read is reported (rid, position, slot, pool) at the next forward that
reads it, and never raised."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from engine.mem.allocator import SWAAllocator, TokenAllocator
from engine.model.fingerprint import IntegrityFailure, KVFingerprints, fingerprint
from engine.model.runner import ForwardBatch, ForwardMode
from engine.request import Req

MakeDriver = Callable[..., Any]  # the SimDriver class from conftest.py


def _fp(token: int, position: int) -> int:
    return int(fingerprint(np.array([token]), np.array([position]))[0])


def test_fingerprints_are_never_zero_and_distinguish_tokens_and_positions() -> None:
    """0 means "never written", so no (token, position) maps to it; neighbours differ."""
    toks, pos = np.meshgrid(np.arange(259), np.arange(64))
    fps = fingerprint(toks.ravel(), pos.ravel())
    assert (fps != 0).all() and len(np.unique(fps)) == fps.size


def test_arrays_match_the_allocator_slot_space() -> None:
    """One array per pool, num_pages * page_size + page_size long; SWA shares the mapping."""
    kv = KVFingerprints.for_allocator(SWAAllocator(64, 32, 4), sliding_window=8)
    assert len(kv.full) == 68 and kv.swa is not None and len(kv.swa) == 36 and kv.is_hybrid
    assert len(KVFingerprints.for_allocator(TokenAllocator(10)).full) == 11


@given(
    st.sampled_from([1, 2, 4]),
    st.lists(st.integers(1, 30), min_size=1, max_size=4),
    st.integers(1, 7),
    st.booleans(),
)
def test_correct_schedules_report_nothing(
    driver: MakeDriver, ps: int, lens: list[int], chunk: int, hybrid: bool
) -> None:
    """Chunked prefills, batched decodes, a shared page-aligned prefix and slots freed by
    one request and reused by the next never trip the check."""
    swa = dict(swa_size=256, window=5) if hybrid else {}
    d = driver(page_size=ps, size=256, **swa)
    reqs = [d.add(f"r{i}", list(range(n))) for i, n in enumerate(lens)]
    while not all(r.output_ids for r in reqs):
        d.extend([(r, chunk) for r in reqs if not r.output_ids])
    for _ in range(3):
        d.decode(reqs)
    sharer = d.add("sharer", reqs[0].all_ids() + [9, 9])
    d.share_prefix(sharer, reqs[0], reqs[0].kv_committed_len // ps * ps)
    d.extend([(sharer, 99)])
    d.release(d.generate("gone", list(range(9)), 2))
    for alloc in (d.alloc.full, d.alloc.swa) if isinstance(d.alloc, SWAAllocator) else (d.alloc,):
        alloc.merge_and_sort_free()  # the next allocation takes the freed slots first
    late = d.generate("late", [5] * 20, 3, chunk=chunk)
    d.decode([late, sharer, *reqs])
    assert d.sim.take_integrity_failures() == [] and d.sim.num_integrity_failures == 0


def test_freed_slot_reused_by_another_request_is_reported(driver: MakeDriver) -> None:
    """A partial free of live KV (#22862's shape): the slots go to the next request, whose
    prefill overwrites them; the victim's next forward reports each clobbered position."""
    d = driver(size=9)
    a = d.generate("a", [10, 11, 12, 13], 1)  # slots 1..4
    d.alloc.free(np.array([3, 4]))  # the bug: positions 2, 3 of a still live
    b = d.add("b", [20, 21, 22, 23, 24, 25])
    d.extend([(b, 6)])  # 6 > 5 free: the released 3, 4 merge in, lowest first
    assert d.slot(b, 0) == 3 and d.sim.take_integrity_failures() == []  # nothing read them yet
    d.decode([a])
    assert d.sim.take_integrity_failures() == [
        IntegrityFailure("a", 2, 3, "full", _fp(12, 2), _fp(20, 0)),
        IntegrityFailure("a", 3, 4, "full", _fp(13, 3), _fp(21, 1)),
    ]


def test_row_pointing_at_the_wrong_slot_is_reported(driver: MakeDriver) -> None:
    """A row entry naming another position's slot, or slot 0 (padding), fails when read."""
    d = driver()
    a = d.generate("a", [1, 2, 3, 4, 5], 1)
    s3 = d.slot(a, 3)
    d.pool.write(a.req_pool_idx, 1, np.array([s3, 0]))
    d.decode([a])
    assert d.sim.take_integrity_failures() == [
        IntegrityFailure("a", 1, s3, "full", _fp(2, 1), _fp(4, 3)),
        IntegrityFailure("a", 2, 0, "full", _fp(3, 2), 0),
    ]


def test_tokens_that_disagree_with_the_kv_are_reported(driver: MakeDriver) -> None:
    """A request whose token list changed under its KV (#22897's shape: tokens and KV
    disagree) is reported at the position that changed."""
    d = driver()
    a = d.generate("a", [1, 2, 3, 4], 2)
    a.origin_input_ids[2] = 77
    d.decode([a])
    found = [(f.rid, f.position, f.expected) for f in d.sim.take_integrity_failures()]
    assert found == [("a", 2, _fp(77, 2))]


def test_row_that_misses_the_written_slot_is_reported_at_once(driver: MakeDriver) -> None:
    """The row must name the slots the forward wrote (out_cache_loc): a mismatch is caught
    at once, not only when the next forward reads the position."""
    d = driver()
    a = d.generate("a", [1, 2, 3], 1)
    pos, tok, row = a.kv_committed_len, a.output_ids[-1], a.req_pool_idx
    d.pool.write(row, pos, np.array([101]))  # the row names 101, the forward writes 100
    batch = ForwardBatch(
        ForwardMode.DECODE,
        [a],
        np.array([tok]),
        np.array([pos]),
        np.array([100]),
        np.array([row]),
        np.array([pos]),
        np.array([1]),
        np.array([pos + 1]),
        d.pool.req_to_token,
    )
    d.sim.forward(batch)
    assert d.sim.take_integrity_failures() == [
        IntegrityFailure("a", pos, 101, "full", _fp(tok, pos), 0)
    ]


def test_failures_are_capped_per_forward_and_counted(driver: MakeDriver) -> None:
    """At most 8 failures are recorded per forward; num_integrity_failures counts all;
    take_integrity_failures returns and clears."""
    d = driver()
    a = d.generate("a", list(range(30)), 1)
    d.kv.full[:] = 1  # every slot clobbered
    d.decode([a])
    assert len(d.sim.integrity_failures) == 8 and d.sim.num_integrity_failures == 30
    assert [f.position for f in d.sim.take_integrity_failures()] == list(range(8))
    assert d.sim.integrity_failures == []


def _swa_driver(driver: MakeDriver, window: int) -> tuple[Any, Req]:
    d = driver(size=64, swa_size=64, window=window)
    a = d.generate("a", list(range(1, 13)), 1)  # 12 tokens: KV at positions 0..11
    return d, a


def test_swa_verification_reads_only_the_window(driver: MakeDriver) -> None:
    """Decode at position 12 with window 4 reads SWA positions 8..11: a clobbered SWA slot
    outside it is not reported, one inside it is (pool "swa", SWA slot id); the full pool
    is still checked everywhere."""
    d, a = _swa_driver(driver, 4)
    assert d.kv.swa is not None and isinstance(d.alloc, SWAAllocator)
    swa_of = lambda pos: int(d.alloc.full_to_swa[d.slot(a, pos)])  # noqa: E731
    d.kv.swa[swa_of(7)] = 5
    d.decode([a])
    assert d.sim.take_integrity_failures() == []
    d.kv.swa[swa_of(9)] = 5
    d.kv.full[d.slot(a, 0)] = 5
    d.decode([a])
    assert d.sim.take_integrity_failures() == [
        IntegrityFailure("a", 0, d.slot(a, 0), "full", _fp(1, 0), 5),
        IntegrityFailure("a", 9, swa_of(9), "swa", _fp(10, 9), 5),
    ]


def test_swa_reads_follow_the_window_never_the_eviction_cursor(driver: MakeDriver) -> None:
    """Positions before the window (decode at 12, window 4: before 8) may have no SWA slot;
    inside the window a full slot without one (mapping 0) fails at SWA slot 0 — even when the
    request's cursor claims it evicted them (the engine's claim is not the model's window)."""
    d, a = _swa_driver(driver, 4)
    assert isinstance(d.alloc, SWAAllocator)
    d.alloc.free_swa(d.pool.read(a.req_pool_idx, 0, 4))
    a.swa_evicted_seqlen = 4
    d.decode([a])
    assert d.sim.take_integrity_failures() == []
    d.alloc.free_swa(d.pool.read(a.req_pool_idx, 4, 10))
    a.swa_evicted_seqlen = 10  # the cursor claims [0, 10) evicted; the window reads 9, 10, 11, 12
    d.decode([a])
    found = [(f.position, f.slot, f.pool) for f in d.sim.take_integrity_failures()]
    assert found == [(9, 0, "swa")]


def test_swa_read_start_covers_every_query_of_an_extend() -> None:
    """Queries q >= prefix_len read keys [q - window, q]: the prefix is read from
    prefix_len - window (decode: seq_len - 1 - window) — the model's window, whatever the
    engine's eviction cursor claims."""
    kv = KVFingerprints.for_allocator(SWAAllocator(64, 64, 1), sliding_window=4)
    assert kv.swa_read_start(prefix_len=10) == 6
    assert kv.swa_read_start(prefix_len=3) == 0


def test_write_uses_the_batch_swa_slots_when_given() -> None:
    """SWA fingerprints go to swa_out_cache_loc when the batch names it, else through
    full_to_swa; page 0 stays zero (padding writes are dropped)."""
    alloc = SWAAllocator(16, 16, 1)
    kv = KVFingerprints.for_allocator(alloc, sliding_window=4)
    full = alloc.alloc(2)
    assert full is not None and kv.swa is not None
    fps = fingerprint(np.array([7, 8]), np.array([0, 1]))
    kv.write(full, fps)
    assert kv.swa[alloc.full_to_swa[full]].tolist() == fps.tolist()
    kv.write(np.array([0, full[0]]), fps, swa_out_cache_loc=np.array([0, 9]))
    assert kv.full[0] == 0 and kv.swa[0] == 0 and kv.swa[9] == fps[1]
