"""Session tags over the radix tree (SGLang --enable-session-radix-cache, #27058/#29173), with
exact node ids, refs and eviction order. A node's ``session_ref`` is the number of (session,
frontier) pairs in its subtree; a tag never locks."""

from __future__ import annotations

import pytest

from engine.cache.radix_cache import RadixCache
from engine.cache.session_refs import SessionRefs
from engine.request import FinishReason, Req
from tests.engine.conftest import Stack, assert_counters, make_req, make_stack

PAGE_SIZES = [1, 4]


def tagged(st: Stack) -> tuple[RadixCache, SessionRefs]:
    assert isinstance(st.cache, RadixCache) and st.cache.session_refs is not None
    return st.cache, st.cache.session_refs


def turn(st: Stack, rid: str, ids: list[int], session: str | None, abort: bool = False) -> Req:
    """One request run to its end: prefilled whole, finished (length, or aborted), released."""
    _, refs = tagged(st)
    req = make_req(rid, ids)
    if session is not None:
        req.session_tag = (session, refs.generation(session))
    st.prefill(req)
    req.finished_reason = (
        FinishReason("abort", message="aborted") if abort else FinishReason.of_length(0)
    )
    st.finish(req)
    return req


def refs_by_node(cache: RadixCache) -> dict[int, tuple[int, tuple[str, ...]]]:
    """Every non-root node's (session_ref, session_tags)."""
    return {n.id: (n.session_ref, n.session_tags) for n in cache.tree_view().nodes if not n.is_root}


def pages(n: int, ps: int, base: int = 0) -> list[int]:
    return [base + i for i in range(n * ps)]


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_a_finished_turn_tags_its_last_node_and_counts_the_path(ps: int) -> None:
    """Two sessions through one shared prefix: the shared node counts both frontiers, each
    leaf its own; nothing is locked (all KV stays evictable)."""
    st = make_stack(ps, 32 * ps, "session_radix")
    cache, _ = tagged(st)
    turn(st, "a1", pages(3, ps), "a")  # node 1: three pages
    turn(st, "b1", pages(2, ps) + pages(1, ps, 100), "b")  # splits node 1 after two pages
    assert refs_by_node(cache) == {1: (1, ("a",)), 2: (2, ()), 3: (1, ("b",))}
    assert cache.protected_size() == 0 and cache.evictable_size() == 4 * ps
    assert_counters(cache)


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_the_next_turn_moves_the_frontier_down_and_a_branch_adds_one(ps: int) -> None:
    """Turn 2 extending turn 1 replaces its frontier (the count above is unchanged); a branch
    from turn 1's prefix is a second frontier of the same session."""
    st = make_stack(ps, 32 * ps, "session_radix")
    cache, refs = tagged(st)
    turn(st, "a1", pages(2, ps), "a")
    turn(st, "a2", pages(4, ps), "a")
    assert refs_by_node(cache) == {1: (1, ()), 2: (1, ("a",))}
    turn(st, "a3", pages(1, ps) + pages(1, ps, 200), "a")  # branches inside node 1
    assert refs_by_node(cache) == {1: (1, ()), 2: (1, ("a",)), 3: (2, ()), 4: (1, ("a",))}
    assert list(refs.frontiers["a"]) == [2, 4]


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_close_drops_only_its_own_pairs_and_remembers_the_id(ps: int) -> None:
    """Closing a keeps b's count on the shared node; a's turn finishing after the close tags
    nothing (the closed id is remembered); a reopen starts a new generation, and a turn of
    the old one tags nothing either."""
    st = make_stack(ps, 32 * ps, "session_radix")
    cache, refs = tagged(st)
    turn(st, "a1", pages(3, ps), "a")
    turn(st, "b1", pages(2, ps) + pages(1, ps, 100), "b")
    old = refs.generation("a")
    assert refs.release("a") == 1
    assert refs_by_node(cache) == {1: (0, ()), 2: (1, ()), 3: (1, ("b",))}
    late = make_req("a2", pages(4, ps))
    late.session_tag = ("a", old)
    st.prefill(late)
    late.finished_reason = FinishReason.of_length(0)
    st.finish(late)
    assert "a" not in refs.frontiers and refs.closed == {"a": None}
    refs.open("a")
    stale = make_req("a3", pages(5, ps))
    stale.session_tag = ("a", old)
    st.prefill(stale)
    stale.finished_reason = FinishReason.of_length(0)
    st.finish(stale)
    assert "a" not in refs.frontiers and "a" not in refs.closed


def test_an_aborted_turn_tags_nothing() -> None:
    """Only a turn that finished (length or stop) tags its KV (SGLang skips FINISH_ABORT)."""
    st = make_stack(1, 32, "session_radix")
    cache, refs = tagged(st)
    turn(st, "a1", [1, 2, 3], "a", abort=True)
    assert refs.frontiers == {} and all(r == (0, ()) for r in refs_by_node(cache).values())


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_eviction_takes_untagged_leaves_first_then_tagged_ones_moving_the_frontier_up(
    ps: int,
) -> None:
    """The tagged leaf is the least recently used, yet the untagged one goes first; when only
    tagged KV is left it goes too (a tag never wedges the pool) and its frontier moves to the
    parent."""
    st = make_stack(ps, 32 * ps, "session_radix")
    cache, refs = tagged(st)
    turn(st, "a1", pages(2, ps) + pages(1, ps, 100), "a")  # slots: pages 1, 2, 3
    turn(st, "p1", pages(2, ps) + pages(1, ps, 200), None)  # untagged leaf: page 4
    assert refs_by_node(cache) == {1: (1, ("a",)), 2: (1, ()), 3: (0, ())}
    assert cache.evict(ps) == ps
    assert [p.tolist() for p in st.allocator.release_pages][-1:] == [[4]]  # page ids
    assert cache.evict(ps) == ps  # only tagged KV left: the frontier leaf goes
    assert refs_by_node(cache) == {2: (1, ("a",))}
    assert list(refs.frontiers["a"]) == [2]
    assert cache.evict(2 * ps) == 2 * ps
    assert refs.frontiers == {} and refs_by_node(cache) == {}
    assert_counters(cache)


def test_without_tags_eviction_is_plain_lru() -> None:
    """A cache without session tags evicts by recency alone (the order is unchanged)."""
    st = make_stack(1, 32, "radix")
    assert isinstance(st.cache, RadixCache) and st.cache.session_refs is None
    for rid, tail in (("r1", 100), ("r2", 200)):
        req = make_req(rid, [1, 2, tail])
        st.prefill(req)
        st.finish(req)
    assert st.cache.evict(1) == 1
    assert [p.tolist() for p in st.allocator.release_pages][-1:] == [
        [3]
    ]  # r1's tail (slot 3), the least recent
