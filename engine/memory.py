"""KVMemory: the wired memory stack (allocator, request rows, prefix cache) and its view.

Keeps: the pool views report each component's own counters and, separately, the census
of actual references, so `state_view()` can show the two disagreeing (DESIGN.md decision 2).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from engine.cache.base import PrefixCache, SlotOwner
from engine.cache.chunk_cache import ChunkCache
from engine.cache.radix_cache import RadixCache
from engine.cache.swa_radix_cache import SWARadixCache
from engine.config import MemoryConfig
from engine.mem import paging
from engine.mem.allocator import PagedAllocator, SWAAllocator, TokenAllocator
from engine.mem.census import PageRefs, take_census
from engine.mem.req_to_token import ReqToTokenPool
from engine.request import Req
from engine.view import PoolView, ReqPoolView, ReqView, StateView


@dataclass(slots=True, eq=False)
class KVMemory:
    """The memory layer the scheduler drives; built from a MemoryConfig."""

    config: MemoryConfig
    allocator: PagedAllocator | SWAAllocator
    req_to_token_pool: ReqToTokenPool
    tree_cache: PrefixCache

    @classmethod
    def from_config(cls, config: MemoryConfig) -> KVMemory:
        ps, strict = config.page_size, config.strict
        pool = ReqToTokenPool(config.max_num_reqs, config.context_len + 8, strict=strict)
        allocator: PagedAllocator | SWAAllocator
        if config.swa_tokens is not None:
            allocator = SWAAllocator(config.max_total_tokens, config.swa_tokens, ps, strict=strict)
        elif ps == 1:
            allocator = TokenAllocator(config.max_total_tokens, strict=strict)
        else:
            allocator = PagedAllocator(config.max_total_tokens, ps, strict=strict)
        return cls(config, allocator, pool, _make_cache(config, pool, allocator))

    @property
    def page_size(self) -> int:
        return self.config.page_size

    def state_view(self, event: str, step: int, reqs: Iterable[Req] = ()) -> StateView:
        """The plain-data snapshot of the memory layer with ``reqs`` as the live requests."""
        live = [r for r in reqs if r.req_pool_idx is not None and not r.kv_committed_freed]
        pools = [self._full_pool_view(live)]
        if isinstance(self.allocator, SWAAllocator):
            pools.append(self._swa_pool_view(live))
        rows = tuple(sorted(r.req_pool_idx for r in live))
        return StateView(
            event=event, step=step, page_size=self.page_size, pools=tuple(pools),
            tree=self.tree_cache.tree_view(),
            req_pool=ReqPoolView(self.req_to_token_pool.size, tuple(self.req_to_token_pool.free_rows), rows),
            reqs=tuple(_req_view(r) for r in reqs),
        )

    def _full_pool_view(self, live: list[Req]) -> PoolView:
        alloc = self.allocator.full if isinstance(self.allocator, SWAAllocator) else self.allocator
        ps = self.page_size
        owned, referenced = self._row_refs(live, swa=False)
        owned += [(o.label, o.slots // ps) for o in self.tree_cache.slot_owners()]
        return PoolView(
            name="full", page_size=ps, capacity=alloc.size, free=alloc.available_size(),
            evictable=self.tree_cache.evictable_size(), protected=self.tree_cache.protected_size(),
            request_owned=sum(paging.held_len(r.kv_allocated_len, r.cache_protected_len, ps) for r in live),
            census=take_census(alloc.num_pages, alloc.all_free_pages(), owned, referenced),
        )

    def _swa_pool_view(self, live: list[Req]) -> PoolView:
        assert isinstance(self.allocator, SWAAllocator)
        swa, ps, cache = self.allocator.swa, self.page_size, self.tree_cache
        owned, referenced = self._row_refs(live, swa=True)
        owned += [(o.label, self._swa_pages(o.slots)) for o in cache.slot_owners() if o.holds_swa]
        return PoolView(
            name="swa", page_size=ps, capacity=swa.size, free=swa.available_size(),
            evictable=_swa_size(cache, "swa_evictable_size"), protected=_swa_size(cache, "swa_protected_size"),
            request_owned=sum(
                paging.held_swa_len(r.kv_allocated_len, r.cache_protected_len, r.swa_evicted_seqlen, ps)
                for r in live
            ),
            census=take_census(swa.num_pages, swa.all_free_pages(), owned, referenced),
        )

    def _row_refs(self, live: list[Req], swa: bool) -> tuple[list[PageRefs], list[PageRefs]]:
        """Per live row: the pages it owns ([protected, allocated)) and all it reads."""
        owned: list[PageRefs] = []
        referenced: list[PageRefs] = []
        table = self.req_to_token_pool.req_to_token
        for r in live:
            label = f"req:{r.rid}@row{r.req_pool_idx}"
            row = table[r.req_pool_idx, : r.kv_allocated_len].astype(np.int64)
            start = max(r.cache_protected_len, r.swa_evicted_seqlen) if swa else r.cache_protected_len
            to_pages = self._swa_pages if swa else (lambda s: s // self.page_size)
            owned.append((label, to_pages(row[start:])))
            referenced.append((label, to_pages(row[r.swa_evicted_seqlen:] if swa else row)))
        return owned, referenced

    def _swa_pages(self, full_slots: np.ndarray) -> np.ndarray:
        assert isinstance(self.allocator, SWAAllocator)
        swa = self.allocator.full_to_swa[full_slots]
        return swa[swa > 0] // self.page_size


def _make_cache(config: MemoryConfig, pool: ReqToTokenPool, allocator: PagedAllocator | SWAAllocator) -> PrefixCache:
    if config.cache == "chunk":
        return ChunkCache(pool, allocator, config.page_size, sliding_window_size=config.sliding_window)
    if isinstance(allocator, SWAAllocator):
        assert config.sliding_window is not None
        return SWARadixCache(pool, allocator, config.page_size, config.sliding_window)
    return RadixCache(pool, allocator, config.page_size)


def _swa_size(cache: PrefixCache, name: str) -> int:
    # the chunk cache has no SWA counters: it holds nothing
    getter = getattr(cache, name, None)
    return int(getter()) if getter is not None else 0


def _req_view(r: Req) -> ReqView:
    return ReqView(
        rid=r.rid, req_pool_idx=-1 if r.req_pool_idx is None else r.req_pool_idx,
        seq_len=len(r.fill_ids), kv_committed_len=r.kv_committed_len,
        kv_allocated_len=r.kv_allocated_len, cache_protected_len=r.cache_protected_len,
        swa_evicted_seqlen=r.swa_evicted_seqlen, is_chunked=r.is_chunked,
        kv_committed_freed=r.kv_committed_freed, kv_overallocated_freed=r.kv_overallocated_freed,
    )
