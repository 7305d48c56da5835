"""KVMemory: the wired memory stack (allocator, request rows, prefix cache, the streaming
session cache when sessions keep KV) and the KV lifecycle operations on it: match, lock,
allocate, checkpoint, SWA eviction, release, the reset after a retract.

Keeps: ``kv_committed_len <= kv_allocated_len`` and the ownership law across every
operation; ``release_kv_cache`` is the single release entry point of a request's KV
(docs/sglang.md §2.4: finished — inserted; retracted — freed). A live request gives back
part of its KV only at four named places: a checkpoint (``cache_unfinished_req``: the slots
the tree already held, replaced by the tree's), the SWA window slide (``evict_swa``), EAGLE's
trim of a reservation (speculative/accounting.py), and a streaming turn's stale tail and
overshoot (cache/streaming_session.py) — tails freed page-aligned from ``ceil``; a session's
slot is released with its session (``StreamingSession.release_session``). The scheduler
decides *when*; these methods decide *which slots*.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from engine.cache.base import PrefixCache
from engine.cache.chunk_cache import ChunkCache
from engine.cache.radix_cache import RadixCache
from engine.cache.session_refs import SessionRefs
from engine.cache.streaming_session import SessionLookup, StreamingSession
from engine.cache.swa_radix_cache import SWARadixCache
from engine.config import MemoryConfig
from engine.errors import KVAccountingError, KVOutOfMemory
from engine.mem import paging
from engine.mem.allocator import PagedAllocator, SWAAllocator, TokenAllocator
from engine.mem.req_to_token import ReqToTokenPool
from engine.request import EMPTY_INDICES, Req


@dataclass(slots=True, eq=False)
class KVMemory:
    """The memory layer the scheduler drives; built by ``from_config``. ``streaming`` is the
    streaming-session cache when sessions keep KV between turns (then also ``tree_cache``)."""

    config: MemoryConfig
    allocator: PagedAllocator | SWAAllocator
    req_to_token_pool: ReqToTokenPool
    tree_cache: PrefixCache
    streaming: StreamingSession | None = None
    evicted_tokens: int = 0  # tokens freed by cache eviction (proves eviction ran)

    @classmethod
    def from_config(
        cls, config: MemoryConfig, *, row_reserve: int = 0, sessions: SessionLookup | None = None
    ) -> KVMemory:
        """The one place a memory stack is built: the allocator, the request rows (each
        ``row_reserve`` positions past the context: EAGLE's verify windows), the prefix cache
        — wrapped in the streaming-session cache when ``sessions`` (the controller) is given."""
        ps, strict = config.page_size, config.strict
        width = config.context_len + 8 + row_reserve
        pool = ReqToTokenPool(config.max_num_reqs, width, strict=strict)
        allocator: PagedAllocator | SWAAllocator
        if config.swa_tokens is not None:
            allocator = SWAAllocator(config.max_total_tokens, config.swa_tokens, ps, strict=strict)
        elif ps == 1:
            allocator = TokenAllocator(config.max_total_tokens, strict=strict)
        else:
            allocator = PagedAllocator(config.max_total_tokens, ps, strict=strict)
        cache = _make_cache(config, pool, allocator)
        if sessions is None:
            return cls(config, allocator, pool, cache)
        streaming = StreamingSession(cache, pool, allocator, sessions)
        return cls(config, allocator, pool, streaming, streaming)

    @property
    def page_size(self) -> int:
        return self.config.page_size

    @property
    def session_refs(self) -> SessionRefs | None:
        """The radix tree's session tags (--enable-session-radix-cache), else None; read it
        afresh each time (a flush rebuilds it with the tree)."""
        cache = self.streaming.inner if self.streaming is not None else self.tree_cache
        return getattr(cache, "session_refs", None)

    def taken_tokens(self) -> tuple[int, ...]:
        """Per pool (full, then SWA), every page its allocator ever handed out, in tokens."""
        alloc = self.allocator
        if isinstance(alloc, SWAAllocator):
            return alloc.full.taken_tokens, alloc.swa.taken_tokens
        return (alloc.taken_tokens,)

    def admittable_size(self) -> int:
        """Tokens an admission may count on: free plus evictable, in the tighter pool."""
        cache, alloc = self.tree_cache, self.allocator
        full = (
            alloc.full_available_size()
            if isinstance(alloc, SWAAllocator)
            else alloc.available_size()
        )
        room = full + cache.evictable_size()
        if isinstance(alloc, SWAAllocator):
            room = min(room, alloc.swa_available_size() + cache.swa_evictable_size())
        return room

    def match_prefix(self, req: Req) -> None:
        """Match ``req.fill_ids`` against the cache, keeping the one-token logit reserve
        (the last input token is always recomputed: prefix <= len(fill_ids) - 1)."""
        key = req.fill_ids[: len(req.fill_ids) - 1]
        streaming = self.streaming  # a streaming turn continues its session slot's row
        match = streaming.match_request(req, key) if streaming is not None else None
        if match is None and req.return_logprob:  # SGLang: the logprob span is recomputed
            key = key[: max(req.logprob_start_len, 0)]
        match = match if match is not None else self.tree_cache.match_prefix(key, req.extra_key)
        req.prefix_indices = match.prefix_indices
        req.last_node = match.last_node
        protected = match.cache_protected_len
        req.cache_protected_len = len(match.prefix_indices) if protected is None else protected

    def lock(self, req: Req) -> None:
        """Pin the matched prefix (what PrefillAdder does on admission)."""
        req.swa_uuid_for_lock = self.tree_cache.inc_lock_ref(req.last_node)

    def evict_for(self, num_tokens: int) -> None:
        """Evict from the cache until ``num_tokens`` are available in every pool (if it can)."""
        alloc = self.allocator
        if isinstance(alloc, SWAAllocator):
            full_short = num_tokens - alloc.full_available_size()
            swa_short = num_tokens - alloc.swa_available_size()
            if full_short > 0 or swa_short > 0:
                self.evicted_tokens += self.tree_cache.evict(max(0, full_short), max(0, swa_short))
        elif alloc.available_size() < num_tokens:
            self.evicted_tokens += self.tree_cache.evict(num_tokens)

    def alloc_for_extend(self, reqs: Sequence[Req]) -> np.ndarray:
        """Rows and KV slots for an extend batch; returns ``out_cache_loc``.

            [0, prefix_len)        the matched prefix: written from req.prefix_indices
            [prefix_len, seq_len)  fresh slots (the prefix's partial last page first)
        Afterwards ``committed == allocated == seq_len`` (``prepare_for_extend``).
        """
        ps, pool = self.config.page_size, self.req_to_token_pool
        for req in reqs:
            if req.req_pool_idx is None:
                req.req_pool_idx = _take_row(pool, req)
        prefix_lens = [len(r.prefix_indices) for r in reqs]
        seq_lens = [len(r.fill_ids) for r in reqs]
        last_locs = [int(r.prefix_indices[-1]) if len(r.prefix_indices) else -1 for r in reqs]
        extend = sum(seq_lens) - sum(prefix_lens)
        # SGLang 0.5.11: a page of slack per request only when paged (alloc_token_slots at ps 1)
        self.evict_for(extend + (len(reqs) * ps if ps > 1 else 0))
        out = self.allocator.alloc_extend(prefix_lens, seq_lens, last_locs)
        if out is None:
            raise KVOutOfMemory(f"extend of {extend} tokens for {len(reqs)} requests does not fit")
        cursor = 0
        for req, prefix, seq in zip(reqs, prefix_lens, seq_lens):
            row = req.req_pool_idx
            assert row is not None  # every request got a row above
            pool.write(row, 0, req.prefix_indices)
            pool.write(row, prefix, out[cursor : cursor + seq - prefix])
            cursor += seq - prefix
            req.kv_committed_len = req.kv_allocated_len = seq
        return out

    def alloc_for_decode(self, reqs: Sequence[Req]) -> np.ndarray:
        """One slot per request at position ``kv_committed_len``; then committed and
        allocated both advance by one (``prepare_for_decode``, no speculation)."""
        ps, pool = self.config.page_size, self.req_to_token_pool
        seq_lens = [r.kv_allocated_len + 1 for r in reqs]
        last_locs = [int(pool.req_to_token[r.req_pool_idx, r.kv_allocated_len - 1]) for r in reqs]
        self.evict_for(len(reqs) * ps)
        out = self.allocator.alloc_decode(seq_lens, last_locs)
        if out is None:
            raise KVOutOfMemory(f"decode of {len(reqs)} requests does not fit")
        pool.write_points(
            np.array([r.req_pool_idx for r in reqs], dtype=np.int64),
            np.array(seq_lens, dtype=np.int64) - 1,
            out,
        )
        for req in reqs:
            req.kv_committed_len += 1
            req.kv_allocated_len += 1
        return out

    def checkpoint(self, req: Req, chunked: bool = False, reads_back: int = 0) -> None:
        """Publish the request's computed prefix to the cache (``cache_unfinished_req``).
        ``reads_back``: the tokens of its chunk still in flight (overlap); an SWA tree keeps
        their window in the request's SWA lock too."""
        self.tree_cache.cache_unfinished_req(req, chunked=chunked, reads_back=reads_back)

    def maybe_evict_swa(self, reqs: Sequence[Req]) -> None:
        """SGLang's ``maybe_evict_swa``, before a decode step allocates: every
        ``sliding_window`` decode steps a request frees the SWA KV that slid out of its window
        (the cursor from the committed length before this step's slot); then its decode
        count advances (``prepare_for_decode``), so a first decode never evicts."""
        window = self.config.sliding_window if self.config.is_hybrid else None
        for req in reqs:
            if window is not None and req.decode_batch_idx % window == 1:
                self.evict_swa(req)
            req.decode_batch_idx += 1

    def evict_swa(self, req: Req) -> None:
        """Free the SWA KV that slid out of the request's window (``_evict_swa``).

        [0, protected)           tree-owned: the tree frees it
        [protected, evicted)     already freed
        [evicted, new_cursor)    freed now
        [new_cursor, committed)  inside the window (plus a page of slack): kept
        """
        window = self.config.sliding_window
        if not isinstance(self.allocator, SWAAllocator) or window is None:
            return
        ps = self.config.page_size
        start = max(req.swa_evicted_seqlen, req.cache_protected_len)
        cursor = paging.swa_evict_cursor(
            req.swa_evicted_seqlen, req.cache_protected_len, req.kv_committed_len, window, ps
        )
        if cursor > start and req.req_pool_idx is not None:
            self.allocator.free_swa(self.req_to_token_pool.read(req.req_pool_idx, start, cursor))
        req.swa_evicted_seqlen = cursor

    def release_kv_cache(self, req: Req, is_insert: bool = True) -> None:
        """The single release entry point: committed KV to the cache (inserted, or freed
        when ``is_insert`` is False), the over-allocated tail freed page-aligned, row returned.

            [0, committed)              cache_finished_req (insert or free)
            [ceil(committed), allocated) freed here (never the page holding committed KV)
        """
        if req.req_pool_idx is None:
            raise KVAccountingError(f"req {req.rid}: release without a request row")
        self.tree_cache.cache_finished_req(req, is_insert=is_insert)
        if req.req_pool_idx is None:  # a streaming session took ownership of the row
            return
        committed, allocated = req.pop_overallocated_kv_cache()
        start, end = paging.tail_free_range(committed, allocated, self.config.page_size)
        if start < end:
            self.allocator.free(self.req_to_token_pool.read(req.req_pool_idx, start, end))
        self.req_to_token_pool.free(req.req_pool_idx)
        req.req_pool_idx = None

    def reset_retracted(self, req: Req) -> None:
        """Forget every KV field of a retracted request (its KV was released with
        ``is_insert=False``), then its scheduling fields: the next prefill starts afresh."""
        if req.req_pool_idx is not None:
            raise KVAccountingError(f"req {req.rid}: reset_for_retract before its KV was released")
        req.prefix_indices = EMPTY_INDICES
        req.last_node = None
        req.swa_uuid_for_lock = None
        req.kv_committed_len = req.kv_allocated_len = 0
        req.kv_committed_freed = req.kv_overallocated_freed = False
        req.cache_protected_len = 0
        req.swa_evicted_seqlen = 0
        req.decode_batch_idx = 0
        req.reset_for_retract()


def _take_row(pool: ReqToTokenPool, req: Req) -> int:
    row = pool.alloc()
    if row is None:
        raise KVOutOfMemory(f"req {req.rid}: no free request row ({pool.size} rows in use)")
    return row


def _make_cache(
    config: MemoryConfig, pool: ReqToTokenPool, allocator: PagedAllocator | SWAAllocator
) -> PrefixCache:
    if config.cache == "chunk":  # a window without its own pool masks reads, frees nothing
        window = config.sliding_window if config.is_hybrid else None
        return ChunkCache(pool, allocator, config.page_size, sliding_window_size=window)
    if isinstance(allocator, SWAAllocator):
        assert config.sliding_window is not None
        return SWARadixCache(pool, allocator, config.page_size, config.sliding_window)
    return RadixCache(pool, allocator, config.page_size, session_tags=config.session_radix_cache)
