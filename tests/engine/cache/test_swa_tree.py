"""The SWA tree (engine/cache/swa_tree.py): SWA lock chains and swa_uuid_for_lock, two-list
eviction and tombstones, the node views, construction (SGLang 0.5.11 semantics)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.cache.swa_radix_cache import SWARadixCache
from engine.errors import KVAccountingError
from engine.mem.allocator import SWAAllocator
from engine.mem.req_to_token import ReqToTokenPool
from engine.view import NodeView
from tests.engine.cache.swa_support import (
    PAGE_SIZES,
    alloc,
    counters,
    nodes,
    swa,
    three_nodes,
    tombstoned,
)
from tests.engine.conftest import (
    assert_counters,
    make_stack,
    slots,
)


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


def test_views_show_swa_fields_andtombstoned_owners() -> None:
    """tree_view(): kind "swa_radix" with the four counters and per-node SWA locks and
    tombstones; slot_owners() marks tombstones holds_swa=False."""
    st = make_stack(4, 64, "swa_radix", window=4)
    tombstoned(st)
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
