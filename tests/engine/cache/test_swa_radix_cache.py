"""SWARadixCache scenarios: SWA lock chains and swa_uuid_for_lock, tombstones, the windowed
match, revival on insert, two-list eviction, request lifecycles (SGLang 0.5.11 semantics)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.cache.swa_radix_cache import SWARadixCache
from engine.cache.tree_util import SWATreeNode
from engine.errors import KVAccountingError
from engine.mem.allocator import SWAAllocator
from engine.mem.req_to_token import ReqToTokenPool
from engine.view import NodeView
from tests.engine.conftest import (
    Stack,
    assert_counters,
    assert_ownership,
    make_req,
    make_stack,
    slots,
)

PAGE_SIZES = [1, 4, 16, 64]


def swa(st: Stack) -> SWARadixCache:
    assert isinstance(st.cache, SWARadixCache)
    return st.cache


def alloc(st: Stack) -> SWAAllocator:
    assert isinstance(st.allocator, SWAAllocator)
    return st.allocator


def nodes(cache: SWARadixCache) -> dict[int, NodeView]:
    return {n.id: n for n in cache.tree_view().nodes}


def counters(cache: SWARadixCache) -> tuple[int, int, int, int]:
    """(full evictable, full protected, SWA evictable, SWA protected)."""
    return (
        cache.full_evictable_size(),
        cache.full_protected_size(),
        cache.swa_evictable_size(),
        cache.swa_protected_size(),
    )


def three_nodes(st: Stack) -> tuple[SWATreeNode, SWATreeNode, SWATreeNode]:
    """Root → n3 [0, ps) → n2 [ps, 3ps) → n1 [3ps, 4ps), holding pages 1..4."""
    ps, cache = st.page_size, swa(st)
    cache.insert(list(range(4 * ps)), alloc(st).alloc(4 * ps))
    cache.match_prefix(list(range(3 * ps)) + [-1] * ps)
    cache.match_prefix(list(range(ps)) + [-1] * ps)
    n1 = cache.match_prefix(list(range(4 * ps))).last_node
    assert n1.parent is not None and n1.parent.parent is not None
    return n1, n1.parent, n1.parent.parent


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_swa_lock_chain_stops_after_the_window_and_returns_its_uuid(ps: int) -> None:
    """inc_lock_ref full-locks node→root but SWA-locks only until sliding_window_size tokens
    are covered; the node where it stops gets a swa_uuid, returned as swa_uuid_for_lock;
    dec_lock_ref with it undoes exactly that."""
    st = make_stack(ps, 16 * ps, "swa_radix", window=2 * ps)
    cache = swa(st)
    n1, n2, n3 = three_nodes(st)
    assert (n1.id, n2.id, n3.id) == (1, 2, 3)
    uuid = cache.inc_lock_ref(n1)
    assert uuid == 1 and n2.swa_uuid == 1
    assert [(n.full_lock_ref, n.swa_lock_ref) for n in (n1, n2, n3)] == [(1, 1), (1, 1), (1, 0)]
    assert counters(cache) == (0, 4 * ps, ps, 3 * ps)
    assert cache.inc_lock_ref(n1) == 1  # the same stop node keeps its uuid
    cache.dec_lock_ref(n1, uuid)
    cache.dec_lock_ref(n1, uuid)
    assert counters(cache) == (4 * ps, 0, 4 * ps, 0)
    assert_counters(cache)


def test_path_shorter_than_the_window_locks_swa_to_the_root_without_uuid() -> None:
    """When the whole path is shorter than the window, there is no stop node: the uuid is
    None and dec_lock_ref SWA-unlocks up to the root."""
    st = make_stack(4, 64, "swa_radix", window=12)
    cache = swa(st)
    cache.insert(list(range(8)), alloc(st).alloc(8))
    node = cache.match_prefix(list(range(8))).last_node
    assert cache.inc_lock_ref(node) is None
    assert counters(cache) == (0, 8, 0, 8)
    cache.dec_lock_ref(node, None)
    assert counters(cache) == (8, 0, 8, 0)


@pytest.mark.parametrize("ps", [1, 4])
def test_splitting_the_uuid_node_moves_the_uuid_to_the_upper_part(ps: int) -> None:
    """A split copies the locks to the new upper node and hands it the swa_uuid, so the
    SWA unlock still stops right after the last SWA-locked token."""
    st = make_stack(ps, 16 * ps, "swa_radix", window=2 * ps)
    cache = swa(st)
    n1, n2, n3 = three_nodes(st)
    uuid = cache.inc_lock_ref(n1)
    n4 = cache.match_prefix(list(range(2 * ps)) + [-1] * ps).last_node  # splits n2
    assert (n4.id, n4.swa_uuid, n2.swa_uuid, n4.swa_lock_ref, n2.swa_lock_ref) == (
        4,
        uuid,
        None,
        1,
        1,
    )
    cache.dec_lock_ref(n1, uuid)
    assert all(n.swa_lock_ref == 0 and n.full_lock_ref == 0 for n in (n1, n2, n3, n4))
    assert_counters(cache)


def test_unbalanced_unlock_raises_and_changes_nothing() -> None:
    """SGLang's asserts are KVAccountingErrors raised before any change: dec_lock_ref of
    an unlocked node, and an SWA unlock that runs past the locked chain (wrong uuid)."""
    st = make_stack(4, 64, "swa_radix", window=8)
    cache = swa(st)
    n1, _, _ = three_nodes(st)
    with pytest.raises(KVAccountingError, match="full_lock_ref=0"):
        cache.dec_lock_ref(n1)
    cache.inc_lock_ref(n1)
    before = cache.tree_view()
    with pytest.raises(KVAccountingError, match="SWA lock of n3"):
        cache.dec_lock_ref(n1, None)  # walks SWA to the root, but n3 is not SWA-locked
    assert cache.tree_view() == before


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_swa_eviction_tombstones_the_lru_internal_node_and_frees_only_its_swa(ps: int) -> None:
    """SWA eviction visits SWA-unlocked nodes in SWA LRU order: an internal node loses its
    SWA KV (free_swa, mapping zeroed) and becomes a tombstone; its full KV stays."""
    st = make_stack(ps, 16 * ps, "swa_radix", window=ps)
    cache = swa(st)
    cache.insert(list(range(2 * ps)), alloc(st).alloc(2 * ps))
    assert cache.insert(list(range(ps)) + [9] * ps, alloc(st).alloc(2 * ps)) == ps  # frees page 3
    assert cache.evict(0, ps) == 0
    view = nodes(cache)
    assert [i for i, n in view.items() if n.swa_tombstone] == [2]  # the split-off upper node
    assert (alloc(st).full_available_size(), alloc(st).swa_available_size()) == (13 * ps, 14 * ps)
    assert alloc(st).translate_to_swa(np.array(slots(1, ps=ps))).tolist() == [0] * ps
    assert counters(cache) == (3 * ps, 0, 2 * ps, 0)
    assert [o.holds_swa for o in cache.slot_owners()] == [True, False, True]
    assert_counters(cache)


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


@pytest.mark.parametrize("ps", [1, 4, 16])
def test_full_eviction_deletes_the_lru_leaf_then_its_tombstone_parent(ps: int) -> None:
    """Full eviction takes unlocked leaves in full LRU order; a tombstone left childless is
    deleted in the same step (a leaf is never a tombstone)."""
    st = make_stack(ps, 16 * ps, "swa_radix", window=ps)
    cache = swa(st)
    cache.insert(list(range(2 * ps)), alloc(st).alloc(2 * ps))
    cache.insert(list(range(ps)) + [9] * ps, alloc(st).alloc(2 * ps))
    cache.evict(0, ps)
    assert cache.evict(ps) == ps  # n1 [ps, 2ps): older than n3
    assert sorted(nodes(cache)) == [0, 2, 3]
    assert cache.evict(1) == 2 * ps  # n3, then its tombstone parent n2
    assert sorted(nodes(cache)) == [0]
    assert (alloc(st).full_available_size(), alloc(st).swa_available_size()) == (16 * ps, 16 * ps)
    assert counters(cache) == (0, 0, 0, 0)


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


def _tombstoned(st: Stack) -> np.ndarray:
    """Tree: n1 [0, 2ps) tombstone → n2 [2ps, 3ps) live; returns the full slots stored."""
    ps = st.page_size
    vals = alloc(st).alloc(3 * ps)
    alloc(st).free_swa(vals[: 2 * ps])
    swa(st).insert(list(range(3 * ps)), vals, 0, 2 * ps)
    return vals


@pytest.mark.parametrize("ps", [1, 4, 16])
def test_insert_with_live_swa_revives_a_tombstone(ps: int) -> None:
    """Branch 1: the caller still has the SWA KV of the whole tombstoned span: the node takes
    the caller's slots (its old full slots are freed) and is live again."""
    st = make_stack(ps, 16 * ps, "swa_radix", window=ps)
    cache = swa(st)
    old = _tombstoned(st)
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
    _tombstoned(st)
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
    _tombstoned(st)
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
    old = _tombstoned(st)
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


def test_views_show_swa_fields_and_tombstoned_owners() -> None:
    """tree_view(): kind "swa_radix" with the four counters and per-node SWA locks and
    tombstones; slot_owners() marks tombstones holds_swa=False."""
    st = make_stack(4, 64, "swa_radix", window=4)
    _tombstoned(st)
    cache = swa(st)
    node = cache.match_prefix(list(range(12))).last_node
    cache.inc_lock_ref(node)
    view = cache.tree_view()
    assert (view.kind, view.evictable_size, view.protected_size) == ("swa_radix", 0, 12)
    assert (view.swa_evictable_size, view.swa_protected_size, view.num_evictable_leaves) == (
        0,
        4,
        0,
    )
    assert view.nodes[1:] == (
        NodeView(
            id=1,
            parent=0,
            is_leaf=False,
            key_len=8,
            value_len=8,
            lock_ref=1,
            swa_lock_ref=0,
            swa_tombstone=True,
        ),
        NodeView(
            id=2,
            parent=1,
            is_leaf=True,
            key_len=4,
            value_len=4,
            lock_ref=1,
            swa_lock_ref=1,
            swa_tombstone=False,
        ),
    )
    assert [(o.label, o.slots.tolist(), o.holds_swa) for o in cache.slot_owners()] == [
        ("tree:n1", slots(1, 2, ps=4), False),
        ("tree:n2", slots(3, ps=4), True),
    ]


def test_construction_needs_an_swa_allocator_and_a_window() -> None:
    """A plain allocator, a page-size mismatch or a window < 1 is rejected at construction."""
    pool = ReqToTokenPool(2, 16)
    with pytest.raises(KVAccountingError, match="SWAAllocator"):
        SWARadixCache(pool, SWAAllocator(16, 16, 4), 2, 4)
    with pytest.raises(KVAccountingError, match="window"):
        SWARadixCache(pool, SWAAllocator(16, 16, 4), 4, 0)
