"""The incremental census (engine/mem/census_incremental.py) equals the from-scratch census
after every operation of random engine runs — clean runs, and runs broken on purpose by a
double free, a leaked page, a freed tree node, an eviction that leaks, a reset, or one
owner (a row or a tree node) holding a page twice, in two runs or in one run longer than a
page — on radix and chunk caches, page sizes 1 and 4, whether the census is taken after every operation or only now and then."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.config import EngineConfig, MemoryConfig
from engine.engine import Engine
from engine.mem.census_incremental import IncrementalCensus, _taken_front
from engine.request import SamplingParams
from engine.snapshot import memory_view
from engine.view import Census

PREFIXES = ([7] * 12, [9, 8] * 5, [3])
OPS = st.one_of(
    st.tuples(st.just("submit"), st.integers(0, 2), st.integers(1, 20), st.integers(1, 6)),
    st.tuples(st.just("step"), st.integers(1, 8)),
    st.tuples(st.just("abort"), st.integers(0, 30)),
    st.tuples(st.just("flush")),
    st.tuples(st.just("double_free"), st.integers(0, 30)),
    st.tuples(st.just("leak"), st.integers(1, 3)),
    st.tuples(st.just("free_node"), st.integers(0, 30)),
    st.tuples(st.just("leaky_evict"), st.integers(1, 40)),
    st.tuples(st.just("row_repeat"), st.integers(0, 30), st.integers(1, 2)),
    st.tuples(st.just("node_repeat"), st.integers(0, 30), st.integers(1, 2)),
)


def _engine(page_size: int, cache: str) -> Engine:
    memory = MemoryConfig(page_size=page_size, max_total_tokens=256, max_num_reqs=8, context_len=128,
                          cache=cache, strict=False)  # type: ignore[arg-type]
    return Engine(EngineConfig(memory=memory, enable_overlap=False))


def _repeated(slots: np.ndarray, page_size: int, gap: int) -> tuple[np.ndarray, np.ndarray] | None:
    """``slots`` with its first page's slots copied ``gap`` pages on (gap 1: that page's run
    grows past a page — at page size 1 a slot twice in a row; gap 2: the page again after
    another one), and the slots it replaced; None when ``slots`` is too short for it."""
    at = gap * page_size
    if len(slots) <= at:
        return None
    out, end = slots.copy(), min(at + page_size, len(slots))
    out[at:end] = slots[: end - at]
    return out, slots[at:end]


def _apply(engine: Engine, op: tuple, rids: list[str]) -> None:
    kind, *args = op
    mem = engine.mem
    if kind in ("row_repeat", "node_repeat"):
        _plant_repeat(engine, kind, *args)
    if kind == "submit":
        prompt = PREFIXES[args[0]] + [(11 * i + args[1]) % 200 + 20 for i in range(args[1])]
        rids.append(engine.submit(prompt, SamplingParams(max_new_tokens=args[2], ignore_eos=True)))
    elif kind == "step":
        for _ in range(args[0]):
            engine.step()
    elif kind == "abort" and rids:
        engine.abort(rids[args[0] % len(rids)])
    elif kind == "flush":
        engine.flush_cache()
    elif kind == "double_free":  # a live row's slot goes back to the free list (maybe twice)
        rows = [r for r in engine.scheduler.live_reqs() if r.req_pool_idx is not None and r.kv_allocated_len]
        if rows:
            r = rows[args[0] % len(rows)]
            mem.allocator.free(mem.req_to_token_pool.read(r.req_pool_idx, 0, 1))
    elif kind == "leak":
        mem.allocator.alloc(args[0] * mem.page_size)
    elif kind == "free_node":  # a tree node's pages freed while the node keeps them
        owners = list(mem.tree_cache.slot_owners())
        if owners:
            mem.allocator.free(owners[args[0] % len(owners)].slots)
    elif kind == "leaky_evict":  # evicted nodes leave the tree, their pages are never freed
        cache, free = mem.tree_cache, mem.allocator.free
        cache.allocator.free = lambda slots: None
        try:
            cache.evict(args[0])
        finally:
            cache.allocator.free = free


def _plant_repeat(engine: Engine, kind: str, pick: int, gap: int) -> None:
    """One owner made to hold a page twice: a live row's owned range, or a tree node's value
    (noted the way the cache would, ``touch``), rewritten — and the page it replaced freed,
    so that every page total still balances (as after a double free handed out twice)."""
    mem, ps = engine.mem, engine.mem.page_size
    if kind == "row_repeat":
        rows = [r for r in engine.scheduler.live_reqs() if r.req_pool_idx is not None]
        if rows:
            r = rows[pick % len(rows)]
            owned = mem.req_to_token_pool.read(r.req_pool_idx, r.cache_protected_len, r.kv_allocated_len)
            planted = _repeated(owned, ps, gap)
            if planted is not None:
                mem.req_to_token_pool.write(r.req_pool_idx, r.cache_protected_len, planted[0])
                mem.allocator.free(planted[1])
        return
    registry = getattr(mem.tree_cache, "node_registry", None)
    nodes = [n for n in registry().all() if n.parent is not None] if registry is not None else []
    if nodes:
        node = nodes[pick % len(nodes)]
        planted = _repeated(np.asarray(node.value), ps, gap)
        if planted is not None:
            node.value = planted[0]
            registry().touch(node)
            mem.allocator.free(planted[1])


def _scratch_census(engine: Engine) -> Census:
    view = memory_view(engine.mem, "step", 0, engine.scheduler.live_reqs())
    return view.pools[0].census


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([1, 4]), st.sampled_from(["radix", "chunk"]),
       st.lists(st.tuples(OPS, st.booleans()), min_size=1, max_size=25))
def test_incremental_census_equals_from_scratch(page_size: int, cache: str, ops: list[tuple]) -> None:
    """After any sequence of operations, the census the engine's views carry (incremental)
    is the from-scratch census of the same state, witnesses included."""
    engine = _engine(page_size, cache)
    rids: list[str] = []
    for op, look in ops:
        _apply(engine, op, rids)
        if look:  # sometimes several operations pass between two censuses
            assert engine.state_view("step").pools[0].census == _scratch_census(engine), op
    assert engine.state_view("step").pools[0].census == _scratch_census(engine)


def test_a_broken_state_gets_its_witnesses() -> None:
    """A double free of a live row's slot is seen at once: the incremental census falls back
    to the from-scratch one and names the dangling page."""
    engine = _engine(1, "radix")
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
    engine = _engine(1, "radix")
    rids: list[str] = []
    _apply(engine, ("submit", 0, 5, 3), rids)
    _apply(engine, ("step", 6), rids)
    assert engine.state_view("step").pools[0].census == Census(num_pages=256)
    _apply(engine, ("leaky_evict", 40), rids)
    census = engine.state_view("step").pools[0].census
    assert census.orphans and census == _scratch_census(engine)


@pytest.mark.parametrize(("prefix", "suffix"), [(2, 2), (0, 80)])  # page by page, or as arrays
def test_a_leak_cannot_hide_a_double_count(prefix: int, suffix: int) -> None:
    """Tree pages put back on the free list (counted twice) and as many leaked pages (counted
    by nobody) balance the page totals; the census still names both, as from scratch."""
    engine = _engine(1, "radix")
    rids: list[str] = []
    _apply(engine, ("submit", prefix, suffix, 3), rids)
    _apply(engine, ("step", 6), rids)
    assert engine.state_view("step").pools[0].census == Census(num_pages=256)
    _apply(engine, ("free_node", 0), rids)
    _apply(engine, ("leak", len(next(iter(engine.mem.tree_cache.slot_owners())).slots)), rids)
    census = engine.state_view("step").pools[0].census
    assert census.dangling and census.orphans and census == _scratch_census(engine)


def test_a_clean_run_never_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a clean run through a full pool (evictions, free-list merges) every census is
    answered by the counts, never by the from-scratch fallback."""
    fallbacks: list[int] = []
    scratch = IncrementalCensus._from_scratch
    monkeypatch.setattr(IncrementalCensus, "_from_scratch",
                        lambda self, *args: fallbacks.append(1) or scratch(self, *args))
    engine = _engine(1, "radix")
    for i in range(12):
        engine.submit(PREFIXES[i % 3] + [20 + i] * 30, SamplingParams(max_new_tokens=8, ignore_eos=True))
    while not engine.is_idle():
        engine.step()
        assert engine.state_view("step").pools[0].census == Census(num_pages=256)
    assert not fallbacks


def test_taken_front_follows_slices_only() -> None:
    """The free list's head is followed only as a suffix slice of the array seen before."""
    base = np.arange(1, 11)
    assert _taken_front(base, base[3:]).tolist() == [1, 2, 3]
    assert _taken_front(base[3:], base[5:]).tolist() == [4, 5]
    assert _taken_front(base, base) is not None and len(_taken_front(base, base)) == 0
    assert _taken_front(base, base[2:8]) is None  # the end moved
    assert _taken_front(base, np.arange(4, 11)) is None  # another buffer, equal values


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("kind", ["row_repeat", "node_repeat"])
@pytest.mark.parametrize("gap", [1, 2])  # one run past a page, or the page again in a second run
def test_one_owner_holding_a_page_twice_is_a_duplicate(page_size: int, kind: str, gap: int) -> None:
    """A row or a tree node holding one page twice is a duplicate naming that owner alone
    ('... (twice)'), seen by the incremental census as by the from-scratch one."""
    engine = _engine(page_size, "radix")
    rids: list[str] = []
    _apply(engine, ("submit", 0, 20, 30), rids)
    # a row then owns 12+ decoded tokens (3 pages at page size 4); a finished one left its
    # pages to tree nodes no live row reads
    _apply(engine, ("step", 14 if kind == "row_repeat" else 40), rids)
    assert engine.state_view("step").pools[0].census == Census(num_pages=256 // page_size)
    _apply(engine, (kind, 0, gap), rids)
    census = engine.state_view("step").pools[0].census
    assert census == _scratch_census(engine)
    assert len(census.duplicates) == 1 and len(census.duplicates[0].owners) == 1
    assert census.duplicates[0].owners[0].endswith(" (twice)")
    assert not census.orphans and not census.dangling  # only the census's duplicates show it
