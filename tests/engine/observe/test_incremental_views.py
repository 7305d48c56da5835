"""Views built for reuse are the views a fresh build gives: the positional builder makes the
same object as a view dataclass's constructor, a request's ReqView is handed out again only while
its fields read the same, a lock rebuilds only the locked nodes' views, sections left out of
a selective view stay at their defaults, and the census gathers row pages as slices would."""

from __future__ import annotations

from dataclasses import fields

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.config import EngineConfig, MemoryConfig
from engine.engine import Engine
from engine.mem import paging
from engine.observe.census_incremental import _row_block
from engine.observe.req_views import DERIVED, ReqPlaces, ReqViewCache
from engine.request import FinishReason, Req, SamplingParams
from engine.view import REQ_COPIED, SELECTIVE, ReqView, StateView


def test_req_views_are_built_from_one_field_list() -> None:
    """ReqView's fields are the Req attributes it copies (``REQ_COPIED``: same name, same
    meaning, read in one call) followed by the derived ones, and a built view carries the
    request's values under each name (no positional slip between builder and schema)."""
    assert ReqView._fields == REQ_COPIED + DERIVED
    assert set(REQ_COPIED) <= {f.name for f in fields(Req)}
    req = Req("r1", [1, 2, 3], output_ids=[4, 5], fill_ids=[1, 2, 3, 4], req_pool_idx=9)
    req.kv_committed_len, req.kv_allocated_len, req.cache_protected_len = 4, 6, 2
    req.swa_evicted_seqlen, req.is_chunked, req.is_retracted = 1, 3, True
    req.to_finish = FinishReason.of_abort("stop it")
    cache = ReqViewCache(spec_state=lambda r: (11, 7))
    (view,) = cache.views([req], ReqPlaces(running={req}))
    assert view == ReqView(
        rid="r1",
        req_pool_idx=9,
        seq_len=4,
        kv_committed_len=4,
        kv_allocated_len=6,
        cache_protected_len=2,
        swa_evicted_seqlen=1,
        is_chunked=3,
        is_retracted=True,
        origin_len=3,
        num_output=2,
        to_finish=True,
        in_running=True,
        spec_seq_len=11,
        spec_accept_len=7,
    )
    (waiting,) = ReqViewCache().views([req], ReqPlaces(waiting={req}, batch={req}))
    assert (waiting.in_waiting, waiting.in_running, waiting.in_batch) == (True, False, True)


def test_req_views_are_reused_only_while_unchanged() -> None:
    """An unchanged request gets the very same ReqView; a changed one a new, equal-to-fresh one."""
    engine = Engine(EngineConfig(memory=MemoryConfig(max_total_tokens=256)))
    engine.submit([1, 2, 3, 4], SamplingParams(max_new_tokens=4, ignore_eos=True))
    engine.step()
    reqs = engine.scheduler.live_reqs()
    cache = ReqViewCache()
    first = cache.views(reqs, ReqPlaces())
    assert cache.views(reqs, ReqPlaces())[0] is first[0]
    moved = cache.views(reqs, ReqPlaces(running=set(reqs)))
    assert (
        moved[0] is not first[0]
        and moved[0].in_running
        and moved == ReqViewCache().views(reqs, ReqPlaces(running=set(reqs)))
    )


def test_selective_view_builds_only_named_sections() -> None:
    """With SELECTIVE, unnamed sections are the defaults; the named ones equal a full view's."""
    engine = Engine(EngineConfig(memory=MemoryConfig(max_total_tokens=256)))
    engine.submit([1, 2, 3, 4], SamplingParams(max_new_tokens=4, ignore_eos=True))
    engine.step()
    full = engine.state_view("schedule")
    only = engine.state_view("schedule", frozenset({SELECTIVE, "reqs"}))
    assert only.reqs == full.reqs and only.reqs
    assert only.pools == StateView().pools and only.req_pool == StateView().req_pool
    assert only.sched == StateView().sched != full.sched
    assert engine.state_view("schedule", frozenset({SELECTIVE, "sched"})).sched == full.sched


def test_a_lock_rebuilds_the_locked_path_only() -> None:
    """A node view holds its own locks only: locking a path rebuilds the views of that path's
    nodes, not those of their other children (each still equal to a fresh node view)."""
    engine = Engine(EngineConfig(memory=MemoryConfig(max_total_tokens=512)))
    engine.generate([[5] * 8 + [i] * 4 for i in range(1, 7)])  # one shared prefix, six children
    cache = engine.mem.tree_cache
    registry = cache.node_registry()
    before = registry.views()
    shared = cache.match_prefix([5] * 8).last_node
    cache.inc_lock_ref(shared)
    after = registry.views()
    assert {v.id for v in after.fresh} == {shared.id}  # the root's lock is fixed at 1
    kept = {v.id: v for v in before}
    assert len(shared.children) >= 2 and all(v is kept[v.id] for v in after if v.id != shared.id)
    assert [v.lock_ref for v in after if v.id == shared.id] == [1] and all(
        v.parent_lock_ref == -1 for v in after
    )


def test_the_views_follow_request_places() -> None:
    """A request's view follows where the scheduler holds it (waiting, running, this batch)
    and is reused when none of them moved."""
    engine = Engine(EngineConfig(memory=MemoryConfig(max_total_tokens=256)))
    engine.submit([1, 2, 3, 4], SamplingParams(max_new_tokens=4, ignore_eos=True))
    engine.step()
    reqs, cache = engine.scheduler.live_reqs(), ReqViewCache()
    for places in (
        ReqPlaces(waiting=set(reqs)),
        ReqPlaces(batch=set(reqs)),
        ReqPlaces(batch=set(reqs)),
    ):
        views = cache.views(reqs, places)
        assert views == ReqViewCache().views(reqs, places)
    assert views[0].in_batch and not views[0].in_waiting


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 12),
    st.lists(
        st.tuples(st.integers(0, 15), st.integers(-3, 14), st.integers(-2, 16)),
        min_size=1,
        max_size=40,
    ),
)
def test_the_census_row_block_equals_the_row_slices(
    width: int, spans: list[tuple[int, int, int]]
) -> None:
    """The incremental census's gathered row pages are the per-row slices ``table[row,
    start:end]`` and ``table[row, :end]`` concatenated, or None (then it slices row by row)."""
    table = np.arange(16 * width, dtype=np.int32).reshape(16, width) + 1
    block = _row_block(table, spans)
    if block is None:
        assert (
            min(min(s) for s in spans) < 0
            or max(e for *_, e in spans) * len(spans) > 4 * sum(e for *_, e in spans) + 4096
        )
        return
    owned = [table[r, s:e] for r, s, e in spans]
    assert np.array_equal(block[0], np.concatenate(owned)) and block[2] == [len(o) for o in owned]
    assert np.array_equal(block[1], np.concatenate([table[r, :e] for r, _, e in spans]))


@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from([1, 4, 16]),
    st.lists(st.tuples(st.integers(-3, 300), st.integers(-3, 300)), max_size=12),
)
def test_request_owned_is_the_sum_of_held_lengths(
    page_size: int, lengths: list[tuple[int, int]]
) -> None:
    """A pool view's request_owned (paging.total_held_len) is Σ paging.held_len over the rows —
    broken lengths (negative, protected past allocated) included."""
    live = [
        Req(f"r{i}", [1], kv_allocated_len=a, cache_protected_len=p)
        for i, (a, p) in enumerate(lengths)
    ]
    expected = sum(
        paging.held_len(r.kv_allocated_len, r.cache_protected_len, page_size) for r in live
    )
    allocated, protected = [r.kv_allocated_len for r in live], [r.cache_protected_len for r in live]
    assert paging.total_held_len(allocated, protected, page_size) == expected
