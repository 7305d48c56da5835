"""The incremental census (engine/observe/census_incremental.py) equals the from-scratch census
after every operation of random engine runs — clean runs, and runs broken on purpose by a
double free, a leaked page, a freed tree node, an eviction that leaks, a reset, or one
owner (a row or a tree node) holding a page twice, in two runs or in one run longer than a
page — on radix and chunk caches, page sizes 1 and 4, whether the census is taken after
every operation or only now and then."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.engine import Engine
from engine.observe.census_incremental import IncrementalCensus
from engine.observe.memory_view import memory_view
from engine.request import SamplingParams
from engine.view import Census
from tests.engine.observe.census_ops import OPS, PREFIXES, apply_op, census_engine


def _scratch_census(engine: Engine) -> Census:
    view = memory_view(engine.mem, "step", 0, engine.scheduler.live_reqs())
    return view.pools[0].census


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from([1, 4]),
    st.sampled_from(["radix", "chunk"]),
    st.lists(st.tuples(OPS, st.booleans()), min_size=1, max_size=25),
)
def test_incremental_census_equals_from_scratch(
    page_size: int, cache: str, ops: list[tuple]
) -> None:
    """After any sequence of operations, the census the engine's views carry (incremental)
    is the from-scratch census of the same state, witnesses included."""
    engine = census_engine(page_size, cache)
    rids: list[str] = []
    for op, look in ops:
        apply_op(engine, op, rids)
        if look:  # sometimes several operations pass between two censuses
            assert engine.state_view("step").pools[0].census == _scratch_census(engine), op
            _assert_counts_kept(engine)
    assert engine.state_view("step").pools[0].census == _scratch_census(engine)


def _assert_counts_kept(engine: Engine) -> None:
    """The kept ledger is that of a census counting the same state anew: the tree's and the
    free list's counts, (page size 1) the rows', and which pages are blocked."""
    kept = engine.views.memo._census
    assert kept is not None  # a non-SWA engine's views keep their census
    if kept._stale:
        return  # every census goes from scratch until a recount finds the state in range
    anew = IncrementalCensus(
        engine.mem.allocator,
        engine.mem.tree_cache,
        engine.mem.req_to_token_pool if kept.rows is not None else None,
    )
    anew._recount()
    assert not anew._stale
    if kept.rows is not None:
        if not kept.rows._counted:  # the rows were not countable: recounted at the next census
            assert (
                np.array_equal(kept.counts[:2], anew.counts[:2])
                and (kept.totals[:2] == anew.totals[:2]).all()
            )
            return
        live = [
            r
            for r in engine.scheduler.live_reqs()
            if r.req_pool_idx is not None and not r.kv_committed_freed
        ]
        spans = [(r.req_pool_idx, r.cache_protected_len, r.kv_allocated_len) for r in live]
        assert anew.rows.update(spans)
    for kept_part, anew_part in zip(kept.ledger, anew.ledger):
        assert np.array_equal(kept_part, anew_part)


def test_pages_listed_twice_and_taken_together_are_counted_twice() -> None:
    """A page freed twice sits twice in the free list (a bad page); an allocation that takes
    both copies at once moves its counts twice, as a recount finds them."""
    engine = census_engine(1, "radix")
    engine.submit([5] * 10, SamplingParams(max_new_tokens=4, ignore_eos=True))
    engine.step()
    alloc = engine.mem.allocator
    page = int(alloc.free_pages[3])
    alloc.free(np.array([page]))  # strict=False: now listed twice
    alloc.merge_and_sort_free()
    assert engine.state_view("step").pools[0].census == _scratch_census(engine)
    alloc.alloc(int(np.searchsorted(alloc.free_pages, page)) + 2)  # both copies, leaked
    assert engine.state_view("step").pools[0].census == _scratch_census(engine)
    _assert_counts_kept(engine)


def test_a_broken_state_gets_its_witnesses() -> None:
    """A double free of a live row's slot is seen at once: the incremental census falls back
    to the from-scratch one and names the dangling page."""
    engine = census_engine(1, "radix")
    engine.submit([5] * 10, SamplingParams(max_new_tokens=4, ignore_eos=True))
    engine.step()
    assert engine.state_view("step").pools[0].census == Census(num_pages=256)
    req = engine.scheduler.live_reqs()[0]
    engine.mem.allocator.free(engine.mem.req_to_token_pool.read(req.req_pool_idx, 0, 1))
    census = engine.state_view("step").pools[0].census
    assert census.dangling and census == _scratch_census(engine)


def test_an_eviction_that_leaks_is_seen() -> None:
    """Nodes that leave the tree without their pages being freed are leaks: the census
    that followed the tree's removals names the orphans, as the from-scratch one does."""
    engine = census_engine(1, "radix")
    rids: list[str] = []
    apply_op(engine, ("submit", 0, 5, 3), rids)
    apply_op(engine, ("step", 6), rids)
    assert engine.state_view("step").pools[0].census == Census(num_pages=256)
    apply_op(engine, ("leaky_evict", 40), rids)
    census = engine.state_view("step").pools[0].census
    assert census.orphans and census == _scratch_census(engine)


@pytest.mark.parametrize(("prefix", "suffix"), [(2, 2), (0, 80)])  # page by page, or as arrays
def test_a_leak_cannot_hide_a_double_count(prefix: int, suffix: int) -> None:
    """Tree pages put back on the free list (counted twice) and as many leaked pages (counted
    by nobody) balance the page totals; the census still names both, as from scratch."""
    engine = census_engine(1, "radix")
    rids: list[str] = []
    apply_op(engine, ("submit", prefix, suffix, 3), rids)
    apply_op(engine, ("step", 6), rids)
    assert engine.state_view("step").pools[0].census == Census(num_pages=256)
    apply_op(engine, ("free_node", 0), rids)
    apply_op(engine, ("leak", len(next(iter(engine.mem.tree_cache.slot_owners())).slots)), rids)
    census = engine.state_view("step").pools[0].census
    assert census.dangling and census.orphans and census == _scratch_census(engine)


def test_a_clean_run_never_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a clean run through a full pool (evictions, free-list merges) every census is
    answered by the counts, never by the from-scratch fallback."""
    fallbacks: list[int] = []
    scratch = IncrementalCensus._from_scratch
    monkeypatch.setattr(
        IncrementalCensus,
        "_from_scratch",
        lambda self, *args: fallbacks.append(1) or scratch(self, *args),
    )
    engine = census_engine(1, "radix")
    for i in range(12):
        engine.submit(
            PREFIXES[i % 3] + [20 + i] * 30, SamplingParams(max_new_tokens=8, ignore_eos=True)
        )
    while not engine.is_idle():
        engine.step()
        assert engine.state_view("step").pools[0].census == Census(num_pages=256)
    assert not fallbacks


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("kind", ["row_repeat", "node_repeat"])
@pytest.mark.parametrize("gap", [1, 2])  # one run past a page, or the page again in a second run
def test_one_owner_holding_a_page_twice_is_a_duplicate(page_size: int, kind: str, gap: int) -> None:
    """A row or a tree node holding one page twice is a duplicate naming that owner alone
    ('... (twice)'), seen by the incremental census as by the from-scratch one."""
    engine = census_engine(page_size, "radix")
    rids: list[str] = []
    apply_op(engine, ("submit", 0, 20, 30), rids)
    # a row then owns 12+ decoded tokens (3 pages at page size 4); a finished one left its
    # pages to tree nodes no live row reads
    apply_op(engine, ("step", 14 if kind == "row_repeat" else 40), rids)
    assert engine.state_view("step").pools[0].census == Census(num_pages=256 // page_size)
    apply_op(engine, (kind, 0, gap), rids)
    census = engine.state_view("step").pools[0].census
    assert census == _scratch_census(engine)
    assert len(census.duplicates) == 1 and len(census.duplicates[0].owners) == 1
    assert census.duplicates[0].owners[0].endswith(" (twice)")
    assert not census.orphans and not census.dangling  # only the census's duplicates show it


def test_a_counted_node_value_is_read_only() -> None:
    """The incremental census keeps the slots it counted for each tree node; a node's value
    written in place afterwards (not rebuilt, so not logged) would go unseen — so once
    counted, a node's value is read-only and such a write raises."""
    engine = census_engine(1, "radix")
    engine.submit([5] * 10, SamplingParams(max_new_tokens=4, ignore_eos=True))
    engine.run_until_idle()
    assert engine.state_view("step").pools[0].census == Census(num_pages=256)
    node = next(n for n in engine.mem.tree_cache.node_registry().all() if len(n.value))
    with pytest.raises(ValueError, match="read-only"):
        node.value[0] = 1
