"""Random request lifecycles over every prefix cache: the exact ownership census and the
counters hold after every step, and the same seed replays the same trees."""

from __future__ import annotations

import random

import pytest

from engine.mem.allocator import SWAAllocator
from engine.view import TreeView
from tests.engine.conftest import Stack, assert_counters, assert_ownership, make_req, make_stack

CASES = [  # (cache, page size, window in pages)
    *[("radix", ps, 0) for ps in (1, 4, 16)],
    *[("swa_radix", ps, w) for ps in (1, 4) for w in (1, 3)],
    ("chunk", 4, 0),
    ("swa_chunk", 4, 2),
]


def _room(st: Stack, num_tokens: int) -> bool:
    """Evict just enough for ``num_tokens`` in every pool (the scheduler's evict-before-alloc)."""
    alloc = st.allocator
    if isinstance(alloc, SWAAllocator):
        full, part = (
            num_tokens - alloc.full_available_size(),
            num_tokens - alloc.swa_available_size(),
        )
        if full > 0 or part > 0:
            st.cache.evict(max(full, 0), max(part, 0))
    elif alloc.available_size() < num_tokens:
        st.cache.evict(num_tokens - alloc.available_size())
    return alloc.available_size() >= num_tokens


def _step(st: Stack, rng: random.Random, prompts: list[list[int]], step: int) -> None:
    """One random scheduler action: admit (maybe chunked), advance a chunk, publish committed
    KV, decode (then SWA-evict), finish, or evict."""
    op, ps = rng.random(), st.page_size
    if op < 0.3 and st.pool.available_size() and len(st.live) < 3:
        req = make_req(f"r{step}", rng.choice(prompts) + [rng.randrange(4)])
        if _room(st, len(req.origin_input_ids) + ps):
            st.prefill(req, rng.choice([None, len(req.origin_input_ids) // 2 + 1]))
    elif op < 0.6 and st.live:
        req = rng.choice(st.live)
        if len(req.fill_ids) < len(req.origin_input_ids):
            st.checkpoint(req)  # the next chunk extends from req.prefix_indices
            if _room(st, len(req.origin_input_ids)):
                st.prefill(req)
        elif rng.random() < 0.2:  # publish a decoding request's committed KV
            req.fill_ids = req.all_ids()[: req.kv_committed_len]
            st.checkpoint(req, chunked=False)
        elif _room(st, ps):
            st.decode(req, rng.randrange(4))
            if isinstance(st.allocator, SWAAllocator):
                st.evict_swa(req)
    elif op < 0.85 and st.live:
        req = rng.choice(st.live)
        if len(req.fill_ids) >= len(req.origin_input_ids):  # no chunk pending
            st.finish(req, is_insert=rng.random() < 0.8)
    elif isinstance(st.allocator, SWAAllocator):
        st.cache.evict(rng.randrange(0, 3 * ps), rng.randrange(0, 4 * ps))
    else:
        st.cache.evict(rng.randrange(1, 4 * ps))


def lifecycle(
    cache: str, ps: int, window_pages: int, seed: int, steps: int = 200
) -> tuple[Stack, list[TreeView]]:
    rng = random.Random(seed)
    st = make_stack(ps, 40 * ps, cache, swa_size=30 * ps, window=window_pages * ps or None, rows=6)
    prompts = [
        [1] * 2 * ps + [rng.randrange(4) for _ in range(rng.randrange(1, 3 * ps))] for _ in range(5)
    ]
    views = []
    for step in range(steps):
        _step(st, rng, prompts, step)
        assert_ownership(st)
        assert_counters(st.cache)
        views.append(st.cache.tree_view())
    return st, views


@pytest.mark.parametrize("cache,ps,window_pages", CASES)
@pytest.mark.parametrize("seed", range(5))
def test_random_lifecycles_keep_the_exact_ownership_partition(
    cache: str, ps: int, window_pages: int, seed: int
) -> None:
    """Every page of every pool is free, in exactly one tree node, or held by exactly one live
    request, and the counters equal the node sums, after every step; once all requests are
    released no lock is left and free + evictable is the whole pool."""
    st, _ = lifecycle(cache, ps, window_pages, seed)
    for req in list(st.live):
        if len(req.fill_ids) < len(req.origin_input_ids):
            st.checkpoint(req)
            assert _room(st, len(req.origin_input_ids))
            st.prefill(req)
        st.finish(req)
    assert st.cache.protected_size() == 0
    assert st.full_available() + st.cache.evictable_size() == 40 * ps
    assert_ownership(st)


@pytest.mark.parametrize("cache,ps,window_pages", [("radix", 4, 0), ("swa_radix", 4, 1)])
def test_same_seed_replays_the_same_trees(cache: str, ps: int, window_pages: int) -> None:
    """Determinism: the same workload twice yields identical tree views at every step
    (logical clocks, id-ordered views; nothing depends on time or hashing)."""
    assert (
        lifecycle(cache, ps, window_pages, 7, 80)[1] == lifecycle(cache, ps, window_pages, 7, 80)[1]
    )
