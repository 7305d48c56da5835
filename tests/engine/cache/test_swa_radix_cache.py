"""SWARadixCache scenarios: the windowed match, revival on insert, request lifecycles
(SGLang 0.5.11 semantics); the tree's locks and eviction: test_swa_tree.py."""

from __future__ import annotations

import numpy as np
import pytest

from engine.errors import KVAccountingError
from tests.engine.cache.swa_support import PAGE_SIZES, alloc, counters, nodes, swa, tombstoned
from tests.engine.conftest import (
    assert_counters,
    assert_ownership,
    make_req,
    make_stack,
    slots,
)


@pytest.mark.parametrize("ps", [1, 4, 16])
@pytest.mark.parametrize("window_pages,expect_pages", [(1, 2), (2, 0)])
def test_match_stops_before_a_tombstone_unless_the_window_after_it_is_live(
    ps: int, window_pages: int, expect_pages: int
) -> None:
    """A match may end past a tombstone only if at least sliding_window_size live tokens
    follow it; otherwise it ends where the last tombstone-free run was long enough."""
    st = make_stack(ps, 16 * ps, "swa_radix", window=window_pages * ps)
    cache = swa(st)
    cache.insert(list(range(2 * ps)), alloc(st).alloc(2 * ps))
    cache.insert(list(range(ps)) + [9] * ps, alloc(st).alloc(2 * ps))
    cache.evict(0, ps)  # tombstones [0, ps)
    match = cache.match_prefix(list(range(2 * ps)))
    assert len(match.prefix_indices) == expect_pages * ps
    assert match.last_node.id == (1 if expect_pages else 0)


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_insert_stores_the_swa_evicted_head_as_a_tombstone(ps: int) -> None:
    """insert(.., swa_evicted_seqlen) stores [prefix, swa_evicted) as a tombstone node and the
    rest as a live leaf; if everything is SWA-evicted the slots are freed instead."""
    st = make_stack(ps, 16 * ps, "swa_radix", window=2 * ps)
    cache = swa(st)
    vals = alloc(st).alloc(4 * ps)
    alloc(st).free_swa(vals[: 2 * ps])
    assert cache.insert(list(range(4 * ps)), vals, 0, 2 * ps) == 0
    view = nodes(cache)
    assert [(view[i].parent, view[i].key_len, view[i].swa_tombstone) for i in (1, 2)] == [
        (0, 2 * ps, True),
        (1, 2 * ps, False),
    ]
    assert counters(cache) == (4 * ps, 0, 2 * ps, 0)
    assert len(cache.match_prefix(list(range(4 * ps))).prefix_indices) == 4 * ps
    gone = alloc(st).alloc(ps)
    alloc(st).free_swa(gone)
    assert cache.insert([7] * ps, gone, 0, ps) == 0 and sorted(nodes(cache)) == [0, 1, 2]
    assert alloc(st).full_available_size() == 12 * ps


@pytest.mark.parametrize("ps", [1, 4, 16])
def test_insert_with_live_swa_revives_a_tombstone(ps: int) -> None:
    """Branch 1: the caller still has the SWA KV of the whole tombstoned span: the node takes
    the caller's slots (its old full slots are freed) and is live again."""
    st = make_stack(ps, 16 * ps, "swa_radix", window=ps)
    cache = swa(st)
    old = tombstoned(st)
    mine = alloc(st).alloc(3 * ps)  # pages 4..6
    assert cache.insert(list(range(3 * ps)), mine, 0, 0) == 3 * ps
    n1 = cache.match_prefix(list(range(2 * ps))).last_node
    assert (n1.id, n1.swa_tombstone, n1.value.tolist()) == (1, False, mine[: 2 * ps].tolist())
    assert counters(cache) == (3 * ps, 0, 3 * ps, 0)
    freed = sorted(p for g in alloc(st).full.release_pages for p in g.tolist())
    assert freed == [1, 2, 6] and old[2 * ps :].tolist() == slots(3, ps=ps)
    assert_counters(cache)


@pytest.mark.parametrize("ps", [1, 4, 16])
def test_insert_with_a_partly_evicted_window_revives_the_tombstone_tail(ps: int) -> None:
    """Branch 2: the caller's SWA is gone below swa_evicted_seqlen: the tombstone splits there;
    the tail takes the caller's slots and revives, the head stays a tombstone."""
    st = make_stack(ps, 16 * ps, "swa_radix", window=ps)
    cache = swa(st)
    tombstoned(st)
    mine = alloc(st).alloc(3 * ps)
    alloc(st).free_swa(mine[:ps])
    cache.insert(list(range(3 * ps)), mine, 0, ps)
    view = nodes(cache)
    assert [(i, view[i].parent, view[i].key_len, view[i].swa_tombstone) for i in (3, 1, 2)] == [
        (3, 0, ps, True),
        (1, 3, ps, False),
        (2, 1, ps, False),
    ]
    n1 = cache.match_prefix(list(range(2 * ps))).last_node
    assert n1.value.tolist() == slots(5, ps=ps)
    assert_counters(cache)


@pytest.mark.parametrize("ps", [1, 4])
def test_insert_without_swa_keeps_the_tombstone_and_frees_the_callers_slots(ps: int) -> None:
    """Branch 3: the caller's SWA of the span is gone too: nothing revives; its full slots
    for the span are freed as duplicates."""
    st = make_stack(ps, 16 * ps, "swa_radix", window=ps)
    cache = swa(st)
    tombstoned(st)
    mine = alloc(st).alloc(3 * ps)
    alloc(st).free_swa(mine[: 2 * ps])
    cache.insert(list(range(3 * ps)), mine, 0, 2 * ps)
    assert nodes(cache)[1].swa_tombstone and alloc(st).full_available_size() == 13 * ps
    assert_counters(cache)


@pytest.mark.parametrize("ps", [1, 4])
def test_reviving_a_full_locked_tombstone_keeps_its_full_slots(ps: int) -> None:
    """A tombstone whose full KV a running request still reads keeps node.value; the caller's
    SWA slots move under it (full_to_swa) and only the caller's full slots are freed."""
    st = make_stack(ps, 16 * ps, "swa_radix", window=ps)
    cache = swa(st)
    old = tombstoned(st)
    cache.inc_lock_ref(cache.match_prefix(list(range(3 * ps))).last_node)  # n1: full lock only
    mine = alloc(st).alloc(3 * ps)
    cache.insert(list(range(3 * ps)), mine, 0, 0)
    n1 = nodes(cache)[1]
    assert (n1.swa_tombstone, n1.lock_ref, n1.swa_lock_ref) == (False, 1, 0)
    node = cache.match_prefix(list(range(2 * ps))).last_node
    assert node.value.tolist() == old[: 2 * ps].tolist()
    assert alloc(st).translate_to_swa(node.value).tolist() == mine[: 2 * ps].tolist()
    assert alloc(st).translate_to_swa(mine[: 2 * ps]).tolist() == [0] * 2 * ps
    assert alloc(st).full.is_free(np.array([4, 5])).tolist() == [True, True]
    assert_counters(cache)


@pytest.mark.parametrize("ps", [1, 4, 16])
def test_finished_request_with_swa_eviction_leaves_a_tombstone_head(ps: int) -> None:
    """A decoding request's out-of-window SWA KV is freed by the scheduler; at finish the
    tree stores [0, swa_evicted_seqlen) as a tombstone and the rest live; the next request
    with the same prompt still matches it all (a full window follows the tombstone)."""
    st = make_stack(ps, 32 * ps, "swa_radix", window=ps)
    a = make_req("a", range(4 * ps))
    st.prefill(a)
    for t in range(2 * ps):
        st.decode(a, 900 + t)
    st.evict_swa(a)
    assert a.swa_evicted_seqlen == 4 * ps  # floor(6ps - ps - ps)
    assert_ownership(st)
    tokens = a.all_ids()
    st.finish(a)
    view = nodes(swa(st))
    assert [(view[i].key_len, view[i].swa_tombstone) for i in (1, 2)] == [
        (4 * ps, True),
        (2 * ps, False),
    ]
    assert counters(swa(st)) == (6 * ps, 0, 2 * ps, 0)
    b = make_req("b", tokens + [1])
    st.prefill(b)
    assert b.cache_protected_len == 6 * ps and b.swa_uuid_for_lock == 1
    assert counters(swa(st)) == (0, 6 * ps, 0, 2 * ps)
    assert_ownership(st)
    st.finish(b)
    assert_ownership(st)
    assert_counters(swa(st))


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_unfinished_request_moves_its_locks_and_uuid(ps: int) -> None:
    """cache_unfinished_req: insert (duplicates freed inside insert), re-match, rewrite the
    row, move full and SWA locks to the new last node and store the new swa_uuid_for_lock."""
    st = make_stack(ps, 16 * ps, "swa_radix", window=ps)
    a, b = make_req("a", range(4 * ps)), make_req("b", range(4 * ps))
    st.prefill(a, upto=2 * ps + 1)
    st.prefill(b, upto=2 * ps + 1)
    a_row, b_row = st.row(a), st.row(b)
    st.checkpoint(a)
    st.checkpoint(b)
    key_len = 3 if ps == 1 else 2 * ps
    assert st.row(b) == a_row[:key_len] + b_row[key_len:]
    assert a.swa_uuid_for_lock == b.swa_uuid_for_lock == 1 and a.last_node is b.last_node
    assert counters(swa(st)) == (0, key_len, 0, key_len)
    assert_ownership(st)
    st.prefill(a)
    st.prefill(b)
    st.finish(a)
    st.finish(b)
    assert swa(st).full_protected_size() == swa(st).swa_protected_size() == 0
    assert_ownership(st)
    assert_counters(swa(st))


@pytest.mark.parametrize("ps", [1, 4, 16])
def test_checkpointing_a_decoding_request_stores_its_swa_evicted_head_as_tombstone(ps: int) -> None:
    """Publishing a decoding request's committed KV after SWA eviction (a deliberate extension:
    SGLang 0.5.11 passes swa_evicted_seqlen=0 here, which is only right before any eviction):
    [cpl, swa_evicted) becomes a tombstone, the rest live, and the request locks it all."""
    st = make_stack(ps, 32 * ps, "swa_radix", window=ps)
    a = make_req("a", range(4 * ps))
    st.prefill(a)
    for t in range(2 * ps):
        st.decode(a, 900 + t)
    st.evict_swa(a)
    a.fill_ids = a.all_ids()[: a.kv_committed_len]
    st.checkpoint(a, chunked=False)
    view = nodes(swa(st))
    assert [(view[i].key_len, view[i].swa_tombstone) for i in (1, 2)] == [
        (4 * ps, True),
        (2 * ps, False),
    ]
    assert a.cache_protected_len == 6 * ps and a.last_node.id == 2
    assert counters(swa(st)) == (0, 6 * ps, 0, 2 * ps)
    assert_ownership(st)
    st.finish(a)
    assert counters(swa(st)) == (6 * ps, 0, 2 * ps, 0)
    assert_ownership(st)


def test_checkpoint_without_a_live_window_after_the_swa_cursor_raises() -> None:
    """If the SWA cursor passed the page-aligned fill, the tail cannot be published without a
    tombstone leaf: cache_unfinished_req refuses before changing anything."""
    st = make_stack(4, 64, "swa_radix", window=4)
    a = make_req("a", range(16))
    st.prefill(a)
    for t in range(8):
        st.decode(a, 900 + t)
    st.evict_swa(a)
    assert a.swa_evicted_seqlen == 16
    before = swa(st).tree_view()
    with pytest.raises(KVAccountingError, match="live window"):
        st.checkpoint(a)  # fill_ids is still the 16-token prompt
    assert swa(st).tree_view() == before
