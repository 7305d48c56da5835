"""Chunk cache: the no-reuse prefix cache (SGLang ``mem_cache/chunk_cache.py``).

Keeps: the cache owns no KV slot — ``evictable_size() == protected_size() == 0`` and
``slot_owners()`` is empty; a request's KV lives and dies with the request, so
``cache_finished_req`` frees exactly ``req_to_token[row, :kv_committed_len]``.
With a sliding window (SGLang ``SWAChunkCache``) the SWA KV of ``[0, swa_evicted_seqlen)`` was
already freed by the scheduler, and ``free`` skips it because its ``full_to_swa`` mapping is 0.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from engine.cache.base import MatchResult, SlotOwner
from engine.cache.tree_util import request_row
from engine.errors import KVAccountingError
from engine.mem.allocator import PagedAllocator, SWAAllocator
from engine.mem.req_to_token import ReqToTokenPool
from engine.request import Req
from engine.view import TreeView


class ChunkCache:
    """A prefix cache that never matches: every request prefills from position 0. With
    ``sliding_window_size`` it is SGLang's ``SWAChunkCache`` (needs an ``SWAAllocator``)."""

    disable = True  # SGLang's "has no prefix matching" flag

    def __init__(
        self,
        req_to_token_pool: ReqToTokenPool,
        allocator: PagedAllocator | SWAAllocator,
        page_size: int,
        sliding_window_size: int | None = None,
    ) -> None:
        if sliding_window_size is not None and not isinstance(allocator, SWAAllocator):
            raise KVAccountingError(
                f"a windowed chunk cache needs an SWAAllocator, not {type(allocator).__name__}"
            )
        self.req_to_token_pool = req_to_token_pool
        self.allocator = allocator
        self.page_size = page_size
        self.sliding_window_size = sliding_window_size

    def supports_swa(self) -> bool:
        return self.sliding_window_size is not None

    def reset(self) -> None:
        """Nothing to drop: the cache holds no state."""

    def match_prefix(self, key: Sequence[int], extra_key: str | None = None) -> MatchResult:
        return MatchResult(np.empty(0, dtype=np.int64), None)

    def insert(self, key: Sequence[int], value: np.ndarray, extra_key: str | None = None) -> int:
        return 0

    def cache_finished_req(self, req: Req, is_insert: bool = True) -> None:
        """Free all committed KV of a finished request (``is_insert`` is moot: nothing is kept).

        [0, committed)               freed (SWA slots already evicted are skipped)
        [committed, allocated)       not touched here: release_kv_cache frees it
        """
        committed = req.pop_committed_kv_cache()
        self.allocator.free(self.req_to_token_pool.read(request_row(req), 0, committed))

    def cache_unfinished_req(self, req: Req, chunked: bool = False, reads_back: int = 0) -> None:
        """Keep the request's own KV as its prefix for the next chunk (nothing is shared)."""
        req.prefix_indices = self.req_to_token_pool.read(request_row(req), 0, len(req.fill_ids))

    def evict(self, num_tokens: int, swa_num_tokens: int = 0) -> int:
        return 0

    def inc_lock_ref(self, node: Any) -> None:
        return None

    def dec_lock_ref(self, node: Any, swa_uuid_for_lock: int | None = None) -> None:
        return None

    def evictable_size(self) -> int:
        return 0

    def protected_size(self) -> int:
        return 0

    # the SWA counters a hybrid scheduler reads: the chunk cache holds nothing in either pool
    full_evictable_size = swa_evictable_size = evictable_size
    full_protected_size = swa_protected_size = protected_size

    def total_size(self) -> int:
        return 0

    def tree_view(self) -> TreeView:
        return TreeView(kind="chunk", page_size=self.page_size)

    def slot_owners(self) -> Iterator[SlotOwner]:
        return iter(())


class SWAChunkCache(ChunkCache):
    """SGLang's ``SWAChunkCache`` spelled as its own class: the window is required."""

    def __init__(
        self,
        req_to_token_pool: ReqToTokenPool,
        allocator: SWAAllocator,
        page_size: int,
        sliding_window_size: int,
    ) -> None:
        super().__init__(req_to_token_pool, allocator, page_size, sliding_window_size)
