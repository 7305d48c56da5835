"""Random engine operations for the census tests, clean and broken on purpose (a double
free, a leaked page, a freed tree node, an eviction that leaks, one owner holding a page
twice): shared by the incremental-census and incremental-checker tests."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from engine.config import EngineConfig, MemoryConfig
from engine.engine import Engine
from engine.request import SamplingParams

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


def census_engine(page_size: int, cache: str) -> Engine:
    memory = MemoryConfig(
        page_size=page_size,
        max_total_tokens=256,
        max_num_reqs=8,
        context_len=128,
        cache=cache,
        strict=False,
    )
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


def apply_op(engine: Engine, op: tuple, rids: list[str]) -> None:
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
        rows = [
            r
            for r in engine.scheduler.live_reqs()
            if r.req_pool_idx is not None and r.kv_allocated_len
        ]
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
            owned = mem.req_to_token_pool.read(
                r.req_pool_idx, r.cache_protected_len, r.kv_allocated_len
            )
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
