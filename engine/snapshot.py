"""Builds the StateView of the memory layer: component counters plus the exact census.

Keeps: DESIGN.md decision 2 — the pool counters are read from the components as SGLang
maintains them, and the census is computed separately from the index references
(free lists, tree node values, request rows), so the two can disagree.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import replace
from typing import NamedTuple

import numpy as np

from engine.cache.base import PrefixCache
from engine.cache.streaming_session import HeldSlot, held_slots
from engine.mem import paging
from engine.mem.allocator import SWAAllocator
from engine.mem.census import PageRefs, take_census
from engine.memory import KVMemory
from engine.request import Req
from engine.view import OPTIONAL_PARTS, Census, PoolView, ReqPoolView, ReqView, StateView, TreeView

NOT_TAKEN = Census(taken=False)


class ReqPlaces(NamedTuple):
    """Where the scheduler holds each request (sets of requests; Req hashes by identity)."""

    waiting: Collection[Req] = frozenset()
    running: Collection[Req] = frozenset()
    batch: Collection[Req] = frozenset()  # this iteration's batch


def memory_view(mem: KVMemory, event: str, step: int, reqs: Iterable[Req] = (),
                places: ReqPlaces = ReqPlaces(), parts: frozenset[str] = OPTIONAL_PARTS) -> StateView:
    """The snapshot of ``mem`` with ``reqs`` as the live requests, placed by ``places``;
    the census and the tree's nodes only when ``parts`` names them."""
    reqs = list(reqs)
    live = [r for r in reqs if r.req_pool_idx is not None and not r.kv_committed_freed]
    census = "census" in parts
    slots = held_slots(mem.tree_cache, (r.req_pool_idx for r in live))  # idle streaming slots
    pools = [_full_pool_view(mem, live, census, slots)]
    if isinstance(mem.allocator, SWAAllocator):
        pools.append(_swa_pool_view(mem, mem.allocator, live, census, slots))
    pool = mem.req_to_token_pool
    in_use = sorted([r.req_pool_idx for r in live] + [s.req_pool_idx for s in slots])
    return StateView(
        event=event, step=step, page_size=mem.page_size, pools=tuple(pools),
        tree=_tree_view(mem, nodes="nodes" in parts),
        req_pool=ReqPoolView(pool.size, tuple(pool.free_rows), tuple(in_use)),
        reqs=tuple(_req_view(r, places) for r in reqs),
    )


def _tree_view(mem: KVMemory, nodes: bool) -> TreeView:
    """The cache's own view, or — when no rule reads the nodes — only its counters."""
    cache = mem.tree_cache
    if nodes:
        return cache.tree_view()
    return TreeView(kind="unlisted", page_size=mem.page_size, evictable_size=cache.evictable_size(),
                    protected_size=cache.protected_size(),
                    swa_evictable_size=cache.swa_evictable_size(),
                    swa_protected_size=cache.swa_protected_size(), nodes_taken=False)


def _full_pool_view(mem: KVMemory, live: list[Req], census: bool, slots: list[HeldSlot]) -> PoolView:
    alloc = mem.allocator.full if isinstance(mem.allocator, SWAAllocator) else mem.allocator
    ps, cache = mem.page_size, mem.tree_cache
    view = PoolView(
        name="full", page_size=ps, capacity=alloc.size, free=alloc.available_size(),
        evictable=cache.evictable_size(), protected=cache.protected_size(),
        request_owned=sum(paging.held_len(r.kv_allocated_len, r.cache_protected_len, ps) for r in live),
        session_held=sum(paging.held_len(s.kv_allocated_len, s.cache_protected_len, ps) for s in slots),
        census=NOT_TAKEN,
    )
    if not census:
        return view
    to_pages: Callable[[np.ndarray], np.ndarray] = lambda slots: slots // ps  # noqa: E731
    owned, referenced = _row_refs(mem, [*live, *slots], to_pages, swa=False)
    owned += [(o.label, o.slots if ps == 1 else o.slots // ps) for o in cache.slot_owners()]
    return replace(view, census=take_census(alloc.num_pages, alloc.all_free_pages(), owned, referenced))


def _swa_pool_view(mem: KVMemory, alloc: SWAAllocator, live: list[Req], census: bool,
                   slots: list[HeldSlot]) -> PoolView:
    ps, cache = mem.page_size, mem.tree_cache

    def to_pages(full_slots: np.ndarray) -> np.ndarray:
        swa = alloc.full_to_swa[full_slots]
        return swa[swa > 0] // ps

    view = replace(_swa_counters(alloc, cache, live, ps), session_held=sum(
        paging.held_swa_len(s.kv_allocated_len, s.cache_protected_len, s.swa_evicted_seqlen, ps) for s in slots))
    if not census:
        return view
    owned, referenced = _row_refs(mem, [*live, *slots], to_pages, swa=True)
    owned += [(o.label, to_pages(o.slots)) for o in cache.slot_owners() if o.holds_swa]
    return replace(view, census=take_census(alloc.swa.num_pages, alloc.swa.all_free_pages(), owned, referenced))


def _swa_counters(alloc: SWAAllocator, cache: PrefixCache, live: list[Req], ps: int) -> PoolView:
    return PoolView(
        name="swa", page_size=ps, capacity=alloc.swa.size, free=alloc.swa.available_size(),
        evictable=cache.swa_evictable_size(), protected=cache.swa_protected_size(),
        request_owned=sum(
            paging.held_swa_len(r.kv_allocated_len, r.cache_protected_len, r.swa_evicted_seqlen, ps)
            for r in live
        ),
        census=NOT_TAKEN,
    )


def _row_refs(
    mem: KVMemory, live: list[Req | HeldSlot], to_pages: Callable[[np.ndarray], np.ndarray], swa: bool
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
        label = r.label if isinstance(r, HeldSlot) else f"req:{r.rid}@row{r.req_pool_idx}"
        row = table[r.req_pool_idx, : r.kv_allocated_len].astype(np.int64)
        start = max(r.cache_protected_len, r.swa_evicted_seqlen) if swa else r.cache_protected_len
        owned.append((label, to_pages(row[start:])))
        referenced.append((label, to_pages(row[r.swa_evicted_seqlen:] if swa else row)))
    return owned, referenced


def _req_view(r: Req, places: ReqPlaces) -> ReqView:
    return ReqView(
        r.rid, -1 if r.req_pool_idx is None else r.req_pool_idx, len(r.fill_ids), r.kv_committed_len,
        r.kv_allocated_len, r.cache_protected_len, r.swa_evicted_seqlen, r.is_chunked,
        r.kv_committed_freed, r.kv_overallocated_freed, len(r.origin_input_ids), len(r.output_ids),
        r.finished(), r.to_finish is not None, r.is_retracted, r in places.waiting, r in places.running,
        r in places.batch,
    )  # fmt: skip
