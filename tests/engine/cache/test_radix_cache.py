"""RadixCache scenarios with exact slot ids, node ids and eviction order (SGLang 0.5.11)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.cache.radix_cache import RadixCache
from engine.cache.tree_util import TreeNode
from engine.errors import KVAccountingError
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


def tree(st: Stack) -> RadixCache:
    assert isinstance(st.cache, RadixCache)
    return st.cache


def nodes(cache: RadixCache) -> dict[int, NodeView]:
    return {n.id: n for n in cache.tree_view().nodes}


def freed_pages(st: Stack) -> list[list[int]]:
    """Pages in the order the allocator got them back (one list per free call)."""
    return [p.tolist() for p in st.allocator.release_pages]


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_insert_stores_the_page_aligned_head_and_match_returns_it(ps: int) -> None:
    """insert keeps floor(len, page) tokens; match returns their slots and the leaf."""
    st = make_stack(ps, 16 * ps)
    cache = tree(st)
    key = list(range(4 * ps - 1))  # three pages and a partial one (page size 1: three)
    assert cache.insert(key, np.array(slots(1, 2, 3, ps=ps) + [0] * (ps - 1))) == 0
    match = cache.match_prefix(key)
    assert match.prefix_indices.tolist() == slots(1, 2, 3, ps=ps)
    assert match.last_node.id == 1 and match.cache_protected_len is None
    assert cache.evictable_size() == cache.total_size() == 3 * ps
    assert cache.match_prefix([]).last_node is cache.root_node
    assert cache.match_prefix(list(range(ps - 1))).prefix_indices.tolist() == []


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_match_ending_inside_a_node_splits_it_at_the_page_boundary(ps: int) -> None:
    """A match that stops inside a node splits it: the new upper node (next id) takes the
    matched pages and the lock count; the old node keeps the rest."""
    st = make_stack(ps, 16 * ps)
    cache = tree(st)
    cache.insert(list(range(3 * ps)), np.array(slots(1, 2, 3, ps=ps)))
    match = cache.match_prefix(list(range(2 * ps)) + [-1])
    assert match.prefix_indices.tolist() == slots(1, 2, ps=ps)
    assert match.last_node.id == 2
    view = nodes(cache)
    assert (view[2].parent, view[2].key_len, view[2].is_leaf) == (0, 2 * ps, False)
    assert (view[1].parent, view[1].key_len, view[1].is_leaf) == (2, ps, True)
    assert [o.slots.tolist() for o in cache.slot_owners()] == [slots(3, ps=ps), slots(1, 2, ps=ps)]


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_insert_of_a_diverging_key_returns_the_shared_prefix_and_adds_a_sibling(ps: int) -> None:
    """insert returns the length already cached; the divergent rest becomes a new leaf next
    to the split-off remainder."""
    st = make_stack(ps, 16 * ps)
    cache = tree(st)
    cache.insert(list(range(3 * ps)), np.array(slots(1, 2, 3, ps=ps)))
    other = list(range(ps)) + [1000 + i for i in range(2 * ps)]
    assert cache.insert(other, np.array(slots(4, 5, 6, ps=ps))) == ps
    view = nodes(cache)
    assert sorted(view) == [0, 1, 2, 3]
    assert (view[2].parent, view[2].key_len) == (0, ps)
    assert (view[1].parent, view[3].parent, view[3].key_len) == (2, 2, 2 * ps)
    assert cache.match_prefix(other).prefix_indices.tolist() == slots(1, 5, 6, ps=ps)
    assert cache.evictable_size() == 5 * ps


def test_extra_key_namespaces_never_share_nodes() -> None:
    """Equal tokens under different extra_key values are different keys."""
    st = make_stack(4, 64)
    cache = tree(st)
    cache.insert(list(range(8)), np.array(slots(1, 2, ps=4)), extra_key="lora-a")
    assert cache.match_prefix(list(range(8))).prefix_indices.tolist() == []
    assert cache.match_prefix(list(range(8)), "lora-b").prefix_indices.tolist() == []
    assert cache.insert(list(range(8)), np.array(slots(3, 4, ps=4))) == 0
    assert cache.match_prefix(list(range(8)), "lora-a").prefix_indices.tolist() == slots(1, 2, ps=4)
    assert cache.match_prefix(list(range(8))).prefix_indices.tolist() == slots(3, 4, ps=4)


@pytest.mark.parametrize("ps", [1, 4])
def test_lock_ref_moves_sizes_only_on_zero_one_transitions(ps: int) -> None:
    """inc_lock_ref/dec_lock_ref walk node→root; only 0→1 and 1→0 move a node's tokens
    between evictable and protected; the root stays at lock_ref 1."""
    st = make_stack(ps, 16 * ps)
    cache = tree(st)
    cache.insert(list(range(3 * ps)), np.array(slots(1, 2, 3, ps=ps)))
    cache.insert(list(range(ps)) + [99] * 2 * ps, np.array(slots(4, 5, 6, ps=ps)))
    n1 = cache.match_prefix(list(range(3 * ps))).last_node
    n3 = cache.match_prefix(list(range(ps)) + [99] * 2 * ps).last_node
    assert (n1.id, n3.id) == (1, 3)
    assert cache.inc_lock_ref(n3) is None
    assert (cache.evictable_size(), cache.protected_size()) == (2 * ps, 3 * ps)
    cache.inc_lock_ref(n1)
    assert (cache.evictable_size(), cache.protected_size()) == (0, 5 * ps)
    assert [nodes(cache)[i].lock_ref for i in (0, 1, 2, 3)] == [1, 1, 2, 1]
    cache.dec_lock_ref(n3)
    assert (cache.evictable_size(), cache.protected_size()) == (2 * ps, 3 * ps)
    cache.dec_lock_ref(n1)
    assert (cache.evictable_size(), cache.protected_size()) == (5 * ps, 0)
    assert [nodes(cache)[i].lock_ref for i in (0, 1, 2, 3)] == [1, 0, 0, 0]
    assert nodes(cache)[nodes(cache)[2].parent].lock_ref == 1  # the parent's lock, in its own view


def test_lock_of_none_or_of_another_trees_node_raises_and_changes_nothing() -> None:
    """dec_lock_ref must end at this tree's root (SGLang's "node from another tree")."""
    st, other = make_stack(4, 64), make_stack(4, 64)
    tree(other).insert(list(range(4)), np.array(slots(1, ps=4)))
    foreign = tree(other).match_prefix(list(range(4))).last_node
    tree(st).insert(list(range(4)), np.array(slots(1, ps=4)))
    before = tree(st).tree_view()
    with pytest.raises(KVAccountingError, match="another tree"):
        tree(st).dec_lock_ref(foreign)
    with pytest.raises(KVAccountingError, match="another tree"):
        tree(st).inc_lock_ref(foreign)
    with pytest.raises(KVAccountingError, match="no tree node"):
        tree(st).dec_lock_ref(None)
    assert tree(st).tree_view() == before and tree(other).tree_view().nodes[1].lock_ref == 0


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_evict_frees_least_recently_used_leaves_first(ps: int) -> None:
    """Three disjoint prompts A, B, C inserted in order, then A matched: eviction takes B,
    then C, then A (logical clock; no wall time)."""
    st = make_stack(ps, 16 * ps)
    cache = tree(st)
    st.allocator.alloc(3 * ps)
    for i, page in enumerate((1, 2, 3)):
        cache.insert([100 * i + t for t in range(ps)], np.array(slots(page, ps=ps)))
    cache.match_prefix(list(range(ps)))
    assert cache.evict(1) == ps
    assert freed_pages(st) == [[2]]
    assert cache.evict(2 * ps) == 2 * ps
    assert freed_pages(st) == [[2], [3], [1]]
    assert cache.evictable_size() == 0 and cache.tree_view().nodes[1:] == ()


@pytest.mark.parametrize("ps", [1, 4])
def test_evict_takes_a_parent_once_its_children_are_gone_and_skips_locked_leaves(ps: int) -> None:
    """A parent left childless and unlocked becomes a candidate in the same evict call;
    a locked leaf (and so its ancestors) is never evicted."""
    st = make_stack(ps, 16 * ps)
    cache = tree(st)
    st.allocator.alloc(4 * ps)
    cache.insert([7] * ps + [1] * ps, np.array(slots(1, 2, ps=ps)))  # X then Y
    cache.insert([7] * ps + [2] * ps, np.array(slots(1, 3, ps=ps)))  # Z beside Y
    cache.insert([8] * ps, np.array(slots(4, ps=ps)))  # W, locked below
    w = cache.match_prefix([8] * ps).last_node
    cache.inc_lock_ref(w)
    assert cache.evict(10 * ps) == 3 * ps
    assert freed_pages(st) == [[2], [3], [1]]  # Y (older), Z, then their parent X
    assert cache.protected_size() == ps and cache.evictable_size() == 0


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_finished_duplicates_are_freed_and_the_tree_keeps_the_first_copy(ps: int) -> None:
    """Two requests prefill the same prompt before either finishes. The first finish inserts
    its page-aligned KV and frees its unaligned tail; the second frees its duplicates
    [cpl=0, prefix_len) and its own tail: the tree keeps only the first copy."""
    st = make_stack(ps, 16 * ps)
    a, b = make_req("a", range(2 * ps + 1)), make_req("b", range(2 * ps + 1))
    st.prefill(a)
    st.prefill(b)
    assert st.row(a) == slots(1, 2, ps=ps) + [3 * ps] and st.row(b) == slots(4, 5, ps=ps) + [6 * ps]
    st.finish(a)
    st.finish(b)
    if ps == 1:  # the whole prompt is page aligned: no tails
        assert freed_pages(st) == [[4, 5, 6]]
        assert [o.slots.tolist() for o in tree(st).slot_owners()] == [[1, 2, 3]]
    else:  # a's tail page 3, b's duplicate pages 4 and 5, b's tail page 6
        assert freed_pages(st) == [[3], [4, 5], [6]]
        assert [o.slots.tolist() for o in tree(st).slot_owners()] == [slots(1, 2, ps=ps)]
    assert_ownership(st)
    assert_counters(tree(st))


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_finished_request_with_a_cached_prefix_inserts_only_its_extension(ps: int) -> None:
    """b matches a's 2 cached pages (cpl = 2 pages), decodes, finishes: the tree grows by b's
    page-aligned extension, b's partial last page is freed and its lock released."""
    st = make_stack(ps, 16 * ps)
    a = make_req("a", range(2 * ps + 1))
    st.prefill(a)
    st.finish(a)
    b = make_req("b", list(range(2 * ps)) + [500] * ps)
    st.prefill(b)
    assert b.cache_protected_len == 2 * ps and tree(st).protected_size() == 2 * ps
    for t in range(ps + 1):
        st.decode(b, 600 + t)
    st.finish(b)
    owners = [(o.label, o.slots.tolist()) for o in tree(st).slot_owners()]
    if ps == 1:  # b's match split a's node [0 1 2] after two tokens (new upper node n2)
        assert owners == [("tree:n1", [3]), ("tree:n2", [1, 2]), ("tree:n3", [4, 5, 6])]
    else:  # b's extension took never-used pages 4, 5 and 6; page 6 (tail) went back
        assert owners == [("tree:n1", slots(1, 2, ps=ps)), ("tree:n2", slots(4, 5, ps=ps))]
        assert freed_pages(st) == [[3], [6]]
    assert tree(st).protected_size() == 0
    assert_ownership(st)
    assert_counters(tree(st))


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_finished_without_insert_frees_everything_past_the_protected_prefix(ps: int) -> None:
    """is_insert=False frees [cpl, committed) and leaves the tree as it was, unlocked."""
    st = make_stack(ps, 16 * ps)
    a = make_req("a", range(2 * ps))
    st.prefill(a)
    st.finish(a)
    b = make_req("b", list(range(2 * ps)) + [9] * (ps + 1))
    st.prefill(b)
    assert b.cache_protected_len == 2 * ps  # the logit reserve only drops the last token
    assert st.row(b) == slots(1, 2, ps=ps) + slots(3, ps=ps) + [4 * ps]
    before = [(o.label, o.slots.tolist()) for o in tree(st).slot_owners()]
    st.finish(b, is_insert=False)
    assert freed_pages(st) == ([[3, 4]] if ps == 1 else [[3], [4]])
    assert [(o.label, o.slots.tolist()) for o in tree(st).slot_owners()] == before
    assert (tree(st).evictable_size(), tree(st).protected_size()) == (2 * ps, 0)
    assert st.full_available() == 14 * ps
    assert_ownership(st)


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_unfinished_request_publishes_its_pages_and_moves_its_lock(ps: int) -> None:
    """Chunked prefill: cache_unfinished_req inserts fill_ids[:page floor], sets
    cache_protected_len to it, keeps the partial page in prefix_indices, and moves the lock
    from the old last node to the new one."""
    st = make_stack(ps, 16 * ps)
    a = make_req("a", range(4 * ps))
    st.prefill(a, upto=2 * ps + 1)
    row = st.row(a)
    st.checkpoint(a)
    key_len = 3 if ps == 1 else 2 * ps
    assert a.cache_protected_len == key_len and a.prefix_indices.tolist() == row
    assert tree(st).protected_size() == key_len and tree(st).evictable_size() == 0
    assert a.last_node.id == 1 and nodes(tree(st))[1].lock_ref == 1
    st.prefill(a)
    assert st.row(a)[: 2 * ps + 1] == row
    st.checkpoint(a, chunked=False)
    assert a.cache_protected_len == 4 * ps and tree(st).protected_size() == 4 * ps
    assert_ownership(st) and assert_counters(tree(st))
    st.finish(a)
    assert tree(st).protected_size() == 0 and tree(st).evictable_size() == 4 * ps
    assert_ownership(st)


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_unfinished_duplicate_is_freed_and_its_row_rewritten_to_the_tree_copy(ps: int) -> None:
    """b prefilled the same pages as a; when b checkpoints after a, b's duplicate slots
    [cpl, prefix_len) are freed and b's row is rewritten to a's (the tree's) slots."""
    st = make_stack(ps, 16 * ps)
    a, b = make_req("a", range(3 * ps)), make_req("b", range(3 * ps))
    st.prefill(a, upto=2 * ps + 1)
    st.prefill(b, upto=2 * ps + 1)
    a_row, b_row = st.row(a), st.row(b)
    st.checkpoint(a)
    st.checkpoint(b)
    key_len = 3 if ps == 1 else 2 * ps
    assert st.row(b) == a_row[:key_len] + b_row[key_len:]
    assert sorted(p for g in freed_pages(st) for p in g) == sorted(
        {s // ps for s in b_row[:key_len]}
    )
    assert b.last_node is a.last_node and nodes(tree(st))[a.last_node.id].lock_ref == 2
    assert_ownership(st) and assert_counters(tree(st))
    st.finish(b)
    st.finish(a)
    assert tree(st).protected_size() == 0
    assert_ownership(st) and assert_counters(tree(st))


def test_views_list_every_node_with_stable_ids_and_tree_owners() -> None:
    """tree_view(): kind "radix", root first with parent -1 and lock_ref 1, nodes by id;
    slot_owners(): one "tree:n<id>" owner per non-root node with its slots."""
    st = make_stack(4, 64)
    cache = tree(st)
    cache.insert(list(range(8)), np.array(slots(1, 2, ps=4)))
    cache.insert([0, 1, 2, 3, 9, 9, 9, 9], np.array(slots(1, 3, ps=4)))
    view = cache.tree_view()
    assert (view.kind, view.page_size, view.num_evictable_leaves) == ("radix", 4, 2)
    assert view.nodes[0] == NodeView(id=0, parent=-1, is_root=True, is_leaf=False, lock_ref=1)
    assert [(n.id, n.parent, n.key_len, n.is_leaf) for n in view.nodes[1:]] == [
        (1, 2, 4, True),
        (2, 0, 4, False),
        (3, 2, 4, True),
    ]
    assert [(o.label, o.slots.tolist(), o.holds_swa) for o in cache.slot_owners()] == [
        ("tree:n1", slots(2, ps=4), True),
        ("tree:n2", slots(1, ps=4), True),
        ("tree:n3", slots(3, ps=4), True),
    ]


def test_reset_drops_every_node_and_restarts_ids() -> None:
    """reset() leaves an empty tree whose next node is n1 again; old nodes are foreign."""
    st = make_stack(4, 64)
    cache = tree(st)
    cache.insert(list(range(8)), np.array(slots(1, 2, ps=4)))
    old = cache.match_prefix(list(range(8))).last_node
    cache.reset()
    assert cache.tree_view().nodes[1:] == () and cache.evictable_size() == 0
    cache.insert(list(range(4)), np.array(slots(3, ps=4)))
    assert [n.id for n in cache.tree_view().nodes] == [0, 1]
    with pytest.raises(KVAccountingError, match="another tree"):
        cache.inc_lock_ref(old)


def test_nodes_are_slotted_records() -> None:
    """TreeNode is a slotted, identity-compared record (no accidental attribute typos)."""
    node = TreeNode(0, (), np.empty(0, dtype=np.int64))
    with pytest.raises(AttributeError):
        node.lock = 1
    assert node != TreeNode(0, (), np.empty(0, dtype=np.int64))
