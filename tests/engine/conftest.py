"""Helpers for the engine tests: requests, a wired memory stack, and exact ownership checks.

``Stack`` plays the scheduler's part in the smallest faithful way (match with the one-token
logit reserve, lock, allocate the extend, write the row, commit; decode; release) so cache
tests can drive real request lifecycles and pin exact slot ids.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from engine.cache.chunk_cache import ChunkCache
from engine.cache.radix_cache import RadixCache
from engine.cache.swa_radix_cache import SWARadixCache
from engine.mem import paging
from engine.mem.allocator import PagedAllocator, SWAAllocator, TokenAllocator
from engine.mem.req_to_token import ReqToTokenPool
from engine.request import Req

Cache = ChunkCache | RadixCache | SWARadixCache


def make_req(
    rid: str,
    input_ids: list[int] | range,
    output_ids: list[int] | None = None,
    extra_key: str | None = None,
) -> Req:
    return Req(rid, list(input_ids), list(output_ids or []), extra_key=extra_key)


def slots(*pages: int, ps: int) -> list[int]:
    """The slot ids of ``pages`` in order: page p holds ``[p*ps, (p+1)*ps)``."""
    return [p * ps + i for p in pages for i in range(ps)]


@dataclass(eq=False)
class Stack:
    """Allocator + request rows + prefix cache, and the scheduler steps the tests need."""

    page_size: int
    allocator: PagedAllocator | SWAAllocator
    pool: ReqToTokenPool
    cache: Cache
    window: int | None = None
    live: list[Req] = field(default_factory=list)

    def prefill(self, req: Req, upto: int | None = None) -> np.ndarray:
        """Extend ``req`` to ``fill_ids = all_ids()[:upto]``; the first extend matches and locks
        (prefix <= len(fill) - 1), a continuing chunk extends from its ``prefix_indices``."""
        req.fill_ids = req.all_ids()[:upto]
        if req.req_pool_idx is None:
            row = self.pool.alloc()
            assert row is not None
            req.req_pool_idx = row
            match = self.cache.match_prefix(req.fill_ids[:-1], req.extra_key)
            req.prefix_indices, req.last_node = match.prefix_indices, match.last_node
            req.cache_protected_len = len(match.prefix_indices)
            req.swa_uuid_for_lock = self.cache.inc_lock_ref(req.last_node)
            self.live.append(req)
        pre, seq = len(req.prefix_indices), len(req.fill_ids)
        last = int(req.prefix_indices[-1]) if pre else -1
        out = self.allocator.alloc_extend([pre], [seq], [last])
        assert out is not None, f"out of KV for {req.rid}"
        self.pool.write(req.req_pool_idx, 0, req.prefix_indices)
        self.pool.write(req.req_pool_idx, pre, out)
        req.kv_committed_len = req.kv_allocated_len = seq
        return out

    def checkpoint(self, req: Req, chunked: bool = True) -> None:
        self.cache.cache_unfinished_req(req, chunked=chunked)

    def decode(self, req: Req, token: int) -> int:
        """Append ``token``: one new slot at position ``kv_committed_len``."""
        assert req.req_pool_idx is not None
        req.output_ids.append(token)
        pos = req.kv_committed_len
        last = int(self.pool.req_to_token[req.req_pool_idx, pos - 1])
        out = self.allocator.alloc_decode([pos + 1], [last])
        assert out is not None, f"out of KV for {req.rid}"
        self.pool.write(req.req_pool_idx, pos, out[:1])
        req.kv_committed_len = req.kv_allocated_len = pos + 1
        return int(out[0])

    def evict_swa(self, req: Req) -> None:
        """The scheduler's SWA eviction of a decoding request (``ScheduleBatch._evict_swa``)."""
        assert isinstance(self.allocator, SWAAllocator) and self.window is not None
        start = max(req.swa_evicted_seqlen, req.cache_protected_len)
        cursor = paging.swa_evict_cursor(
            req.swa_evicted_seqlen,
            req.cache_protected_len,
            req.kv_committed_len,
            self.window,
            self.page_size,
        )
        if cursor > start:
            self.allocator.free_swa(self.pool.read(req.req_pool_idx, start, cursor))
        req.swa_evicted_seqlen = cursor

    def finish(self, req: Req, is_insert: bool = True) -> None:
        """``release_kv_cache``: the cache takes the committed KV, the tail and row go back."""
        assert req.req_pool_idx is not None
        self.cache.cache_finished_req(req, is_insert=is_insert)
        committed, allocated = req.pop_overallocated_kv_cache()
        start, end = paging.tail_free_range(committed, allocated, self.page_size)
        if start < end:
            self.allocator.free(self.pool.read(req.req_pool_idx, start, end))
        self.pool.free(req.req_pool_idx)
        req.req_pool_idx = None
        self.live.remove(req)

    def row(self, req: Req) -> list[int]:
        assert req.req_pool_idx is not None
        return self.pool.read(req.req_pool_idx, 0, req.kv_committed_len).tolist()

    def full_available(self) -> int:
        alloc = self.allocator
        return (
            alloc.full_available_size()
            if isinstance(alloc, SWAAllocator)
            else alloc.available_size()
        )


def make_stack(
    page_size: int,
    size: int,
    cache: str = "radix",
    *,
    swa_size: int | None = None,
    window: int | None = None,
    rows: int = 8,
    context: int = 1024,
    strict: bool = True,
) -> Stack:
    """A memory stack of ``size`` full tokens; ``cache`` is chunk | radix | session_radix
    (radix with session tags) | swa_radix | swa_chunk."""
    pool = ReqToTokenPool(rows, context, strict=strict)
    allocator: PagedAllocator | SWAAllocator
    if cache.startswith("swa"):
        allocator = SWAAllocator(size, swa_size or size, page_size, strict=strict)
    elif page_size == 1:
        allocator = TokenAllocator(size, strict=strict)
    else:
        allocator = PagedAllocator(size, page_size, strict=strict)
    built: Cache
    if cache == "chunk":
        built = ChunkCache(pool, allocator, page_size)
    elif cache == "swa_chunk":
        built = ChunkCache(pool, allocator, page_size, sliding_window_size=window or page_size)
    elif cache in ("radix", "session_radix"):
        assert isinstance(allocator, PagedAllocator)
        built = RadixCache(pool, allocator, page_size, session_tags=cache == "session_radix")
    else:
        assert isinstance(allocator, SWAAllocator)
        built = SWARadixCache(pool, allocator, page_size, window or page_size)
    return Stack(
        page_size,
        allocator,
        pool,
        built,
        window or (page_size if cache.startswith("swa") else None),
    )


def assert_counters(cache: Cache) -> None:
    """The cache's counters equal the sums recomputed from its nodes (lock state, tombstones)."""
    view = cache.tree_view()
    nodes = [n for n in view.nodes if not n.is_root]
    assert view.evictable_size == sum(n.value_len for n in nodes if n.lock_ref == 0)
    assert view.protected_size == sum(n.value_len for n in nodes if n.lock_ref > 0)
    live = [n for n in nodes if not n.swa_tombstone]
    if view.kind == "swa_radix":
        assert view.swa_evictable_size == sum(n.value_len for n in live if n.swa_lock_ref == 0)
        assert view.swa_protected_size == sum(n.value_len for n in live if n.swa_lock_ref > 0)
        assert all(n.lock_ref >= n.swa_lock_ref >= 0 for n in nodes)
        assert all(n.swa_lock_ref == 0 for n in nodes if n.swa_tombstone)
    assert all(n.key_len == n.value_len and n.key_len % view.page_size == 0 for n in nodes)


def assert_ownership(stack: Stack) -> None:
    """Exact census: every page is free, in one tree node, or held by one live request
    (``[cache_protected_len, ceil(allocated))``), never two of these (both pools when SWA)."""
    ps, alloc = stack.page_size, stack.allocator
    full = alloc.full if isinstance(alloc, SWAAllocator) else alloc
    owners: Counter[int] = Counter(full.all_free_pages().tolist())
    tree = [o.slots for o in stack.cache.slot_owners()]
    rows = [_held(stack, r, r.cache_protected_len) for r in stack.live]
    for arr in tree + rows:
        owners.update(np.unique(np.asarray(arr) // ps).tolist())
    assert owners == Counter(range(1, full.num_pages + 1)), _diff(owners, full.num_pages)
    assert stack.cache.evictable_size() + stack.cache.protected_size() == sum(len(a) for a in tree)
    if isinstance(alloc, SWAAllocator):
        _assert_swa_ownership(stack, alloc)


def _assert_swa_ownership(stack: Stack, alloc: SWAAllocator) -> None:
    ps = stack.page_size
    owners: Counter[int] = Counter(alloc.swa.all_free_pages().tolist())
    for owner in stack.cache.slot_owners():
        swa = alloc.translate_to_swa(owner.slots)
        assert (swa > 0).all() if owner.holds_swa else (swa == 0).all(), owner.label
        owners.update(np.unique(swa[swa > 0] // ps).tolist())
    for req in stack.live:
        swa = alloc.translate_to_swa(
            _held(stack, req, max(req.cache_protected_len, req.swa_evicted_seqlen))
        )
        owners.update(np.unique(swa[swa > 0] // ps).tolist())
    assert owners == Counter(range(1, alloc.swa.num_pages + 1)), _diff(owners, alloc.swa.num_pages)


def _held(stack: Stack, req: Req, start: int) -> np.ndarray:
    """Slots of ``[start, allocated)``: their pages are the request's whole pages (the partial
    last page included, as ``ceil(allocated)`` counts it)."""
    assert req.req_pool_idx is not None
    return stack.pool.read(req.req_pool_idx, start, req.kv_allocated_len)


def _diff(owners: Counter[int], num_pages: int) -> str:
    twice = sorted(p for p, c in owners.items() if c > 1)
    missing = sorted(set(range(1, num_pages + 1)) - set(owners))
    return f"pages owned twice: {twice}, owned by nobody: {missing}"
