"""The real SGLang 0.5.23 memory stack for one configuration: KV pool(s), allocator,
request-row pool, tree cache, session controller — and the fake ScheduleBatch the real
allocation functions read.

Keeps: every object is SGLang's own class, built as its scheduler builds it. Plain pools:
``MHATokenToKVPool`` + (Paged)``TokenToKVPoolAllocator`` + ``UnifiedRadixCache(FULL)``.
SWA hybrid: ``SWAKVPool`` + ``SWATokenToKVPoolAllocator`` + ``UnifiedRadixCache(FULL, SWA)``
with the window (0.5.23 has no ``SWARadixCache``: the unified tree with an SWA component
replaced it). The tree runs on SGLang's Python TreeCore: the default Rust core gives the
same counts but its nodes cannot be listed for the census. The fake batch binds
``ScheduleBatch.maybe_evict_swa`` itself, so window release is SGLang's code, cadence
(``SGLANG_SWA_EVICTION_INTERVAL``) included. Imports nothing of kvspec.
"""

from __future__ import annotations

from types import MethodType, SimpleNamespace

import torch
from sglang.srt.managers.schedule_batch import ScheduleBatch
from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool
from sglang.srt.mem_cache.unified_cache.components import ComponentType
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.session.session_controller import SessionController

KV = dict(dtype=torch.float16, head_num=1, head_dim=4, device="cpu")


def _plain_allocator(page_size: int, tokens: int):
    kv = MHATokenToKVPool(
        size=tokens, page_size=page_size, layer_num=1, enable_memory_saver=False, **KV
    )
    if page_size == 1:
        return TokenToKVPoolAllocator(
            size=tokens, dtype=KV["dtype"], device="cpu", kvcache=kv, need_sort=False
        )
    return PagedTokenToKVPoolAllocator(
        size=tokens,
        page_size=page_size,
        dtype=KV["dtype"],
        device="cpu",
        kvcache=kv,
        need_sort=False,
    )


def _swa_allocator(page_size: int, tokens: int, swa_tokens: int) -> SWATokenToKVPoolAllocator:
    kv = SWAKVPool(
        size=tokens,
        size_swa=swa_tokens,
        page_size=page_size,
        swa_attention_layer_ids=[0],
        full_attention_layer_ids=[1],
        **KV,
    )
    return SWATokenToKVPoolAllocator(
        size=tokens,
        size_swa=swa_tokens,
        page_size=page_size,
        dtype=KV["dtype"],
        device="cpu",
        kvcache=kv,
        need_sort=False,
    )


def _tree_cache(rpool, alloc, page_size: int, window: int | None) -> UnifiedRadixCache:
    """SGLang's unified radix tree over ``alloc``: FULL, plus SWA with ``window`` (hybrid
    pools); on the Python TreeCore, whose nodes can be listed for the census."""
    params = CacheInitParams(
        disable=False,
        req_to_token_pool=rpool,
        token_to_kv_pool_allocator=alloc,
        page_size=page_size,
        sliding_window_size=window,
    )
    params.tree_components = (
        (ComponentType.FULL, ComponentType.SWA) if window is not None else (ComponentType.FULL,)
    )
    params.tree_core_backend = "python"
    return UnifiedRadixCache(params)


class Stack:
    """The real pool, allocator, request-row pool and tree cache for one configuration."""

    def __init__(
        self,
        page_size: int,
        pool_tokens: int,
        max_reqs: int,
        max_context: int,
        swa_tokens: int | None = None,
        sliding_window: int | None = None,
    ) -> None:
        self.page_size, self.pool_tokens = page_size, pool_tokens
        self.hybrid = swa_tokens is not None
        if self.hybrid and not sliding_window:
            raise ValueError("swa_tokens needs a positive sliding_window")
        self.alloc = (
            _swa_allocator(page_size, pool_tokens, swa_tokens)
            if self.hybrid
            else _plain_allocator(page_size, pool_tokens)
        )
        self.rpool = ReqToTokenPool(
            size=max_reqs, max_context_len=max_context, device="cpu", enable_memory_saver=False
        )
        self.cache = _tree_cache(
            self.rpool, self.alloc, page_size, sliding_window if self.hybrid else None
        )
        self.sessions = SessionController(self.cache)
        self.evicted_tokens = 0
        self._count_evictions()

    def _count_evictions(self) -> None:
        """``evicted_tokens`` counts what the tree's ``evict_for_alloc`` evicts."""
        evict = self.cache.evict_for_alloc

        def counting_evict(*args, **kwargs):  # the entry the allocation path calls when short
            result = evict(*args, **kwargs)
            self.evicted_tokens += getattr(result, "num_tokens_evicted", 0) or 0
            return result

        self.cache.evict_for_alloc = counting_evict

    # ---- SGLang's counters, per pool (the hybrid pool splits full and SWA) ----
    def full_free(self) -> int:
        return self.alloc.full_available_size() if self.hybrid else self.alloc.available_size()

    def full_evictable(self) -> int:
        return self.cache.full_evictable_size() if self.hybrid else self.cache.evictable_size()

    def full_protected(self) -> int:
        return self.cache.full_protected_size() if self.hybrid else self.cache.protected_size()

    def room(self) -> tuple[int, int]:
        """Tokens allocatable after evicting everything evictable: (full, swa); swa is
        the full figure when there is no SWA pool."""
        full = self.full_free() + self.full_evictable()
        if not self.hybrid:
            return full, full
        return full, self.alloc.swa_available_size() + self.cache.swa_evictable_size()

    def batch(self, reqs: list, mode: ForwardMode, **fields) -> SimpleNamespace:
        """The ScheduleBatch fields ``alloc_for_extend`` / ``alloc_for_decode`` and the real
        ``ScheduleBatch.maybe_evict_swa`` read (overlap off: the scheduler this glue follows)."""
        batch = SimpleNamespace(
            reqs=reqs,
            tree_cache=self.cache,
            req_to_token_pool=self.rpool,
            token_to_kv_pool_allocator=self.alloc,
            device="cpu",
            hisparse_coordinator=None,
            is_dllm=lambda: False,
            forward_mode=mode,
            enable_overlap=False,
            forward_iter=0,
            model_config=SimpleNamespace(is_encoder_decoder=False),
            **fields,
        )
        for name in ("maybe_evict_swa", "_swa_eviction_trigger", "_evict_swa"):
            setattr(batch, name, MethodType(getattr(ScheduleBatch, name), batch))
        return batch
