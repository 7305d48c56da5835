"""Builds the StateView of the memory layer: component counters plus the exact census.

Keeps: docs/design.md decision 2 — the pool counters are read from the components as SGLang
maintains them, and the census is computed separately from the index references
(free lists, tree node values, request rows), so the two can disagree.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import fields, replace
from typing import cast

import numpy as np

from engine.cache.base import PrefixCache
from engine.cache.session_slot import HeldSlot
from engine.mem import paging
from engine.mem.allocator import PagedAllocator, SWAAllocator
from engine.memory import KVMemory
from engine.observe.census import PageRefs, take_census
from engine.observe.census_incremental import IncrementalCensus
from engine.observe.crosscheck import cross_check, crosscheck_enabled
from engine.observe.req_views import NOWHERE, ReqPlaces, ReqViewCache, SpecState
from engine.observe.session_views import with_session_locks
from engine.request import Req
from engine.view import (
    OPTIONAL_PARTS,
    Census,
    PoolView,
    ReqPoolView,
    ReqView,
    StateView,
    TreeView,
    wanted_sections,
)

NOT_TAKEN = Census(taken=False)
# every section of a StateView at its default, built once (frozen: shared by every view)
_SECTIONS = {f.name: getattr(StateView(), f.name) for f in fields(StateView)[3:]}


def memory_view(
    mem: KVMemory,
    event: str,
    step: int,
    reqs: Iterable[Req] = (),
    places: ReqPlaces = NOWHERE,
    parts: frozenset[str] = OPTIONAL_PARTS,
    memo: ViewMemo | None = None,
    **extra: object,
) -> StateView:
    """The snapshot of ``mem`` with ``reqs`` as the live requests, placed by ``places``;
    the census and the tree's nodes only when ``parts`` names them, and only the sections
    ``parts`` asks for (``view.wanted_sections``). ``memo`` (an engine's, kept between its
    views) reuses unchanged ReqViews and keeps the full pool's census incrementally;
    ``extra`` are further StateView fields (the scheduler's parts)."""
    sections = wanted_sections(parts)
    reqs = list(reqs)
    built = extra
    if "pools" in sections or "req_pool" in sections:
        live = [r for r in reqs if r.req_pool_idx is not None and not r.kv_committed_freed]
        slots = mem.streaming.held_slots() if mem.streaming is not None else []  # idle slots
        if "pools" in sections:
            built["pools"] = _pool_views(mem, live, "census" in parts, slots, memo)
        if "req_pool" in sections:
            pool = mem.req_to_token_pool
            rows = [r.req_pool_idx for r in live] + [s.req_pool_idx for s in slots]
            in_use = sorted(cast("list[int]", rows))  # live rows and held slots: all set
            built["req_pool"] = ReqPoolView(pool.size, tuple(pool.free_rows), tuple(in_use))
    if "tree" in sections:
        built["tree"] = _tree_view(mem, nodes="nodes" in parts)
        if memo is not None and memo.crosscheck:
            _cross_check_tree(mem.tree_cache, cast(TreeView, built["tree"]))
    if "reqs" in sections:
        built["reqs"] = _req_views(reqs, places, memo)
    return StateView(event, step, mem.page_size, **{**_SECTIONS, **built})


def _req_views(reqs: list[Req], places: ReqPlaces, memo: ViewMemo | None) -> tuple[ReqView, ...]:
    """The request views: the memo's reused ones (cross-checked against fresh ones)."""
    if memo is None:
        return ReqViewCache().views(reqs, places)
    views = memo.req_views.views(reqs, places)
    if memo.crosscheck:
        fresh = ReqViewCache(memo.req_views.spec_state).views(reqs, places)
        cross_check("request views", views, fresh)
    return views


def _pool_views(
    mem: KVMemory, live: list[Req], census: bool, slots: list[HeldSlot], memo: ViewMemo | None
) -> tuple[PoolView, ...]:
    pools = [_full_pool_view(mem, live, census, slots, memo)]
    if isinstance(mem.allocator, SWAAllocator):
        pools.append(_swa_pool_view(mem, mem.allocator, live, census, slots))
    return tuple(pools)


def _tree_view(mem: KVMemory, nodes: bool) -> TreeView:
    """The cache's own view (with the streaming sessions' locks), or — when no rule reads the
    nodes — only its counters."""
    cache = mem.tree_cache
    if nodes:
        view = cache.tree_view()
        return view if mem.streaming is None else with_session_locks(view, mem.streaming)
    return TreeView(
        kind="unlisted",
        page_size=mem.page_size,
        evictable_size=cache.evictable_size(),
        protected_size=cache.protected_size(),
        swa_evictable_size=cache.swa_evictable_size(),
        swa_protected_size=cache.swa_protected_size(),
        nodes_taken=False,
    )


def _cross_check_tree(cache: PrefixCache, view: TreeView) -> None:
    """The registry's kept node views and census owners against a walk of the tree."""
    registry = getattr(cache, "node_registry", None)
    if registry is None:
        return  # a chunk cache: no tree
    registry = registry()
    views, owners = registry.from_scratch()
    if view.nodes_taken:
        cross_check("tree node views", tuple(registry.views()), views)
    kept = [(o.label, o.slots.tolist(), o.holds_swa) for o in registry.slot_owners()]
    cross_check(
        "tree census owners",
        tuple(kept),
        tuple((o.label, o.slots.tolist(), o.holds_swa) for o in owners),
    )


def _full_pool_view(
    mem: KVMemory,
    live: list[Req],
    census: bool,
    slots: list[HeldSlot],
    memo: ViewMemo | None = None,
) -> PoolView:
    alloc = mem.allocator.full if isinstance(mem.allocator, SWAAllocator) else mem.allocator
    ps, cache = mem.page_size, mem.tree_cache
    return PoolView(
        name="full",
        page_size=ps,
        capacity=alloc.size,
        free=alloc.available_size(),
        evictable=cache.evictable_size(),
        protected=cache.protected_size(),
        request_owned=paging.total_held_len(
            [r.kv_allocated_len for r in live], [r.cache_protected_len for r in live], ps
        ),
        session_held=sum(
            paging.held_len(s.kv_allocated_len, s.cache_protected_len, ps) for s in slots
        ),
        census=_full_census(mem, alloc, [*live, *slots], memo) if census else NOT_TAKEN,
    )


def _full_census(
    mem: KVMemory, alloc: PagedAllocator, rows: list[Req | HeldSlot], memo: ViewMemo | None
) -> Census:
    """The full pool's census: kept incrementally by the engine's memo, else from scratch."""
    kept = memo.census_of(mem) if memo is not None else None
    if kept is None:
        return _scratch_full_census(mem, alloc, rows)
    census = incremental_census(kept, mem.req_to_token_pool.req_to_token, rows)
    if memo is not None and memo.crosscheck:
        cross_check("census of the full pool", census, _scratch_full_census(mem, alloc, rows))
    return census


def _scratch_full_census(
    mem: KVMemory, alloc: PagedAllocator, rows: list[Req | HeldSlot]
) -> Census:
    ps = mem.page_size

    def to_pages(slots: np.ndarray) -> np.ndarray:
        return slots // ps

    owned, referenced = _row_refs(mem, rows, to_pages, swa=False)
    owned += [
        (o.label, o.slots if ps == 1 else o.slots // ps) for o in mem.tree_cache.slot_owners()
    ]
    return take_census(
        alloc.num_pages, alloc.all_free_pages(), owned, referenced, slots_per_page=ps
    )


def _swa_pool_view(
    mem: KVMemory, alloc: SWAAllocator, live: list[Req], census: bool, slots: list[HeldSlot]
) -> PoolView:
    ps, cache = mem.page_size, mem.tree_cache

    def to_pages(full_slots: np.ndarray) -> np.ndarray:
        swa = alloc.full_to_swa[full_slots]
        return swa[swa > 0] // ps

    view = replace(
        _swa_counters(alloc, cache, live, ps),
        sliding_window=mem.config.sliding_window or 0,
        session_held=sum(
            paging.held_swa_len(s.kv_allocated_len, s.cache_protected_len, s.swa_evicted_seqlen, ps)
            for s in slots
        ),
    )
    if not census:
        return view
    owned, referenced = _row_refs(mem, [*live, *slots], to_pages, swa=True)
    owned += [(o.label, to_pages(o.slots)) for o in cache.slot_owners() if o.holds_swa]
    taken = take_census(
        alloc.swa.num_pages, alloc.swa.all_free_pages(), owned, referenced, slots_per_page=ps
    )
    return replace(view, census=taken)


def _swa_counters(alloc: SWAAllocator, cache: PrefixCache, live: list[Req], ps: int) -> PoolView:
    return PoolView(
        name="swa",
        page_size=ps,
        capacity=alloc.swa.size,
        free=alloc.swa.available_size(),
        evictable=cache.swa_evictable_size(),
        protected=cache.swa_protected_size(),
        request_owned=sum(
            paging.held_swa_len(r.kv_allocated_len, r.cache_protected_len, r.swa_evicted_seqlen, ps)
            for r in live
        ),
        census=NOT_TAKEN,
    )


def _row_refs(
    mem: KVMemory,
    live: list[Req | HeldSlot],
    to_pages: Callable[[np.ndarray], np.ndarray],
    swa: bool,
) -> tuple[list[PageRefs], list[PageRefs]]:
    """Per live row (a request's, or an idle session slot's): the pages it owns and every
    page it reads.

        [0, protected)          read; owned by the tree
        [protected, allocated)  owned by the row (SWA: from max(protected, swa_evicted))
    """
    owned: list[PageRefs] = []
    referenced: list[PageRefs] = []
    table = mem.req_to_token_pool.req_to_token
    for r in live:
        label = _row_label(r)
        row = table[r.req_pool_idx, : r.kv_allocated_len].astype(np.int64)
        start = max(r.cache_protected_len, r.swa_evicted_seqlen) if swa else r.cache_protected_len
        owned.append((label, to_pages(row[start:])))
        referenced.append((label, to_pages(row[r.swa_evicted_seqlen :] if swa else row)))
    return owned, referenced


class ViewMemo:
    """What an engine keeps between its views: the last ReqViews (with the speculative
    worker's ``spec_state`` under EAGLE), and the incremental census of its full pool (none
    for a hybrid SWA pool: those are counted from scratch); in cross-check mode
    (crosscheck.py) both are compared with fresh ones at every view."""

    __slots__ = ("_census", "crosscheck", "req_views")

    def __init__(self, spec_state: SpecState | None = None) -> None:
        self.req_views = ReqViewCache(spec_state)
        self._census: IncrementalCensus | None = None
        self.crosscheck = crosscheck_enabled()  # each view's fast parts beside fresh ones

    def census_of(self, mem: KVMemory) -> IncrementalCensus | None:
        alloc, kept = mem.allocator, self._census
        if isinstance(alloc, SWAAllocator):
            return None
        if (
            kept is None
            or kept.alloc is not alloc
            or kept.cache is not mem.tree_cache
            or (kept.rows is not None and kept.rows.pool is not mem.req_to_token_pool)
        ):
            kept = self._census = IncrementalCensus(alloc, mem.tree_cache, mem.req_to_token_pool)
        return kept


def incremental_census(
    census: IncrementalCensus, table: np.ndarray, live: list[Req | HeldSlot]
) -> Census:
    """The census of the full pool with these live rows (what the bench times)."""
    rows = [(r.req_pool_idx, r.cache_protected_len, r.kv_allocated_len) for r in live]
    return census.take(
        table, cast("list[tuple[int, int, int]]", rows), lambda: [_row_label(r) for r in live]
    )


def _row_label(r: Req | HeldSlot) -> str:
    return r.label if isinstance(r, HeldSlot) else f"req:{r.rid}@row{r.req_pool_idx}"
