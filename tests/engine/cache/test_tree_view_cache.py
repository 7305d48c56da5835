"""The incremental node views and census owners (``tree_view_cache.NodeRegistry``) equal a
straightforward rebuild — a DFS over the tree, sorted by id — after random operation
sequences on the radix and SWA radix caches (inserts with tombstoned heads, matches that
split, locks, unlocks, full and SWA eviction), whether or not a view was read in between."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from engine.cache.radix_cache import RadixCache
from engine.cache.swa_radix_cache import SWARadixCache
from engine.cache.tree_util import all_nodes, node_view
from engine.errors import KVAccountingError
from engine.mem.allocator import SWAAllocator
from tests.engine.conftest import Stack, make_stack

OPS = st.lists(
    st.tuples(
        st.sampled_from(
            ["insert", "insert", "match_lock", "unlock", "evict", "evict_swa", "evict_swa"]
        ),
        st.lists(st.integers(0, 1), min_size=1, max_size=10),  # key, in pages
        st.integers(0, 8),  # a size or an index
        st.booleans(),  # read the views after this op (else changes pile up unread)
    ),
    max_size=60,
)


def _reference(cache: RadixCache | SWARadixCache) -> tuple[tuple, list]:
    swa = isinstance(cache, SWARadixCache)
    root, attr = cache.root_node, "full_lock_ref" if swa else "lock_ref"
    nodes = all_nodes(root)
    views = tuple(node_view(n, n is root, attr) for n in nodes)
    owners = [
        (f"tree:n{n.id}", n.value.tolist(), not n.swa_tombstone if swa else True) for n in nodes[1:]
    ]
    return views, owners


def _check(cache: RadixCache | SWARadixCache) -> None:
    views, owners = _reference(cache)
    assert cache.tree_view().nodes == views
    assert [(o.label, o.slots.tolist(), o.holds_swa) for o in cache.slot_owners()] == owners
    assert cache._registry.all() == all_nodes(cache.root_node)


def _insert(s: Stack, pages: list[int], arg: int) -> None:
    ps, cache = s.page_size, s.cache
    key = [t for p in pages for t in [p] * ps]
    value = s.allocator.alloc(len(key))
    if value is None:
        return
    if isinstance(cache, SWARadixCache):
        assert isinstance(s.allocator, SWAAllocator)
        evicted = min(arg, len(pages)) * ps if arg % 3 == 0 else 0  # a tombstoned head
        s.allocator.free_swa(value[:evicted])
        cache.insert(key, value, 0, evicted)
    else:
        s.allocator.free(value[: cache.insert(key, value)])


def _apply(s: Stack, held: list, op: str, pages: list[int], arg: int) -> None:
    cache = s.cache
    if op == "insert":
        _insert(s, pages, arg)
    elif op == "match_lock":
        node = cache.match_prefix([t for p in pages for t in [p] * s.page_size]).last_node
        held.append((node, cache.inc_lock_ref(node)))
    elif op == "unlock" and held:
        node, handle = held.pop(arg % len(held))
        cache.dec_lock_ref(node, handle)
    elif op == "evict":
        cache.evict(arg * s.page_size)
    elif op == "evict_swa" and isinstance(cache, SWARadixCache):
        cache.evict(0, max(1, arg // 4) * s.page_size)  # small: tombstones internal nodes first


def _run(s: Stack, ops: list) -> None:
    held: list = []
    for op, pages, arg, read in ops:
        try:
            _apply(s, held, op, pages, arg)
        except KVAccountingError:
            pass  # a refused operation changes nothing; the views must still agree
        if read:
            _check(s.cache)
    _check(s.cache)


@given(ps=st.sampled_from([1, 2]), ops=OPS)
def test_radix_views_equal_a_rebuild(ps: int, ops: list) -> None:
    _run(make_stack(ps, 64 * ps, "radix"), ops)


@given(ps=st.sampled_from([1, 2]), window=st.integers(1, 4), ops=OPS)
def test_swa_radix_views_equal_a_rebuild(ps: int, window: int, ops: list) -> None:
    _run(make_stack(ps, 64 * ps, "swa_radix", swa_size=24 * ps, window=window * ps), ops)


def test_unchanged_tree_returns_the_same_tuple() -> None:
    s = make_stack(1, 64, "radix")
    _insert(s, [0, 1, 2], 0)
    first = s.cache.tree_view().nodes
    assert s.cache.tree_view().nodes is first
    node = s.cache.match_prefix([0, 1]).last_node  # splits: a new node
    assert s.cache.tree_view().nodes is not first
    s.cache.inc_lock_ref(node)
    assert [n.lock_ref for n in s.cache.tree_view().nodes] == [1, 0, 1]  # n2: the upper half
    views = s.cache.tree_view().nodes
    assert views[views[1].parent].lock_ref == 1  # the parent's lock, in its own view
    assert np.array_equal(list(s.cache.slot_owners())[-1].slots, node.value)


def test_swa_tombstone_and_revival_rebuild_the_node() -> None:
    s = make_stack(1, 64, "swa_radix", swa_size=24, window=1)
    _insert(s, [0, 0, 1], 1)
    _insert(s, [0, 0, 0], 1)  # splits: n2 = [0, 0] is internal
    _check(s.cache)
    s.cache.evict(0, 1)  # the LRU SWA node is the internal n2: tombstoned
    assert [n.swa_tombstone for n in s.cache.tree_view().nodes] == [False, False, True, False]
    _check(s.cache)
    _insert(s, [0, 0], 1)  # live SWA KV over the tombstone: revived
    assert not any(n.swa_tombstone for n in s.cache.tree_view().nodes)
    _check(s.cache)
