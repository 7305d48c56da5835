"""ChunkCache (and its sliding-window flavour): no reuse, the request owns all its KV."""

from __future__ import annotations

import pytest

from engine.cache.chunk_cache import ChunkCache, SWAChunkCache
from engine.config import EngineConfig, MemoryConfig
from engine.engine import Engine
from engine.errors import KVAccountingError
from engine.mem.allocator import PagedAllocator
from engine.mem.req_to_token import ReqToTokenPool
from engine.request import SamplingParams
from tests.engine.conftest import assert_ownership, make_req, make_stack, slots

PAGE_SIZES = [1, 4, 16, 64]


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_match_never_reuses_anything(ps: int) -> None:
    """match_prefix returns no slots and no node, even for a prompt that just finished."""
    st = make_stack(ps, 8 * ps, "chunk")
    a = make_req("a", range(3 * ps))
    st.prefill(a)
    st.finish(a)
    match = st.cache.match_prefix(list(range(3 * ps)))
    assert match.prefix_indices.tolist() == [] and match.last_node is None
    assert st.cache.insert(list(range(ps)), slots(1, ps=ps)) == 0


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_finished_request_frees_exactly_its_committed_kv(ps: int) -> None:
    """cache_finished_req frees req_to_token[row, :committed] (partial page included) and the
    cache keeps nothing: evictable = protected = 0."""
    st = make_stack(ps, 8 * ps, "chunk")
    a = make_req("a", range(2 * ps + 1))
    st.prefill(a)
    assert st.row(a) == slots(1, 2, ps=ps) + [3 * ps]
    st.decode(a, 99)  # continues page 3 (page size 1: takes slot 4)
    assert st.full_available() == (4 if ps == 1 else 5 * ps)
    st.finish(a)
    assert st.full_available() == 8 * ps
    assert a.kv_committed_freed and a.req_pool_idx is None
    assert (st.cache.evictable_size(), st.cache.protected_size(), st.cache.total_size()) == (
        0,
        0,
        0,
    )


def test_finished_request_cannot_release_twice() -> None:
    """The committed range is released once: a second cache_finished_req raises."""
    st = make_stack(4, 32, "chunk")
    a = make_req("a", range(5))
    st.prefill(a)
    st.cache.cache_finished_req(a)
    with pytest.raises(KVAccountingError, match="committed KV released twice"):
        st.cache.cache_finished_req(a)


@pytest.mark.parametrize("ps", [1, 4, 16])
def test_unfinished_request_keeps_its_own_kv_as_prefix(ps: int) -> None:
    """cache_unfinished_req sets prefix_indices = row[:len(fill_ids)] (a copy) and frees
    nothing; the next chunk continues after it."""
    st = make_stack(ps, 8 * ps, "chunk")
    a = make_req("a", range(3 * ps + 2))
    st.prefill(a, upto=ps + 1)
    st.checkpoint(a)
    assert a.prefix_indices.tolist() == slots(1, ps=ps) + [2 * ps]
    a.prefix_indices[0] = -5  # a copy: the table is untouched
    assert st.row(a)[0] == ps
    a.prefix_indices = st.pool.read(a.req_pool_idx, 0, ps + 1)
    st.prefill(a)
    assert st.row(a) == slots(1, 2, 3, ps=ps) + [4 * ps, 4 * ps + 1]
    assert_ownership(st)
    st.finish(a)
    assert st.full_available() == 8 * ps


def test_views_are_empty() -> None:
    """tree_view() is kind "chunk" with zero counters; slot_owners() yields nothing."""
    st = make_stack(4, 32, "chunk")
    a = make_req("a", range(9))
    st.prefill(a)
    view = st.cache.tree_view()
    assert view.kind == "chunk" and view.page_size == 4 and view.nodes == ()
    assert (view.evictable_size, view.protected_size) == (0, 0)
    assert list(st.cache.slot_owners()) == []
    assert st.cache.inc_lock_ref(None) is None and st.cache.evict(100) == 0


@pytest.mark.parametrize("ps", [1, 4, 16])
def test_swa_chunk_cache_frees_full_and_remaining_swa(ps: int) -> None:
    """SWA flavour: SWA KV of [0, swa_evicted_seqlen) was freed by the scheduler; finish
    frees the full KV and only the SWA slots still mapped (no double free in strict mode)."""
    st = make_stack(ps, 16 * ps, "swa_chunk", window=ps)
    assert st.cache.supports_swa() and st.cache.sliding_window_size == ps
    a = make_req("a", range(6 * ps))
    st.prefill(a)
    st.evict_swa(a)  # cursor = floor(6ps - ps - ps) = 4ps
    assert a.swa_evicted_seqlen == 4 * ps
    assert st.allocator.swa_available_size() == 14 * ps
    assert_ownership(st)
    st.finish(a)
    assert st.allocator.swa_available_size() == st.allocator.full_available_size() == 16 * ps
    assert st.cache.full_evictable_size() == st.cache.swa_protected_size() == 0


def test_swa_chunk_cache_needs_an_swa_allocator() -> None:
    """A sliding window without an SWAAllocator is a wiring error, reported at construction."""
    pool = ReqToTokenPool(2, 16)
    with pytest.raises(KVAccountingError, match="SWAAllocator"):
        ChunkCache(pool, PagedAllocator(16, 4), 4, sliding_window_size=8)
    with pytest.raises(KVAccountingError, match="SWAAllocator"):
        SWAChunkCache(pool, PagedAllocator(16, 4), 4, 8)


def test_a_window_without_a_swa_pool_builds_a_plain_chunk_cache() -> None:
    """A sliding window with one full pool (no SWA pool to free from) is a valid memory
    configuration, as it is for the radix cache: the chunk cache is built without a window and
    the engine runs (found by explore's configuration mutations: it raised at construction)."""
    config = EngineConfig(
        memory=MemoryConfig(max_total_tokens=256, cache="chunk", sliding_window=16)
    )
    engine = Engine(config)
    results = engine.generate([[1, 2, 3, 4]], SamplingParams(max_new_tokens=4))
    assert isinstance(engine.mem.tree_cache, ChunkCache) and results[0].completion_tokens == 4
