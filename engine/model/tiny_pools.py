"""The tiny model's KV buffers, shaped like the memory layer's pools: one MHA/GQA or MLA pool
for every layer, or (a hybrid memory) the full and sliding-window pools of SWA layers.

Keeps: a buffer row per allocator slot of the pool it mirrors (engine/mem/kv_pool.py), in
the model's dtype and on its device.
"""

from __future__ import annotations

from engine.config.model import TinyConfig
from engine.mem.allocator import PagedAllocator, SWAAllocator
from engine.mem.kv_pool import KVPool, KVShape, MHAKVPool, MLAKVPool, SWAKVPool
from engine.model.tiny_layers import DTYPES


def make_kv_pool(cfg: TinyConfig, allocator: PagedAllocator | SWAAllocator) -> KVPool:
    """The KV buffers for ``cfg`` shaped like ``allocator``'s pools (SWA layers: SWA pool)."""
    if isinstance(allocator, SWAAllocator) and cfg.attention == "gqa":
        return SWAKVPool(
            allocator.size, allocator.size_swa, allocator.page_size, _shape(cfg), cfg.window_layers
        )
    return plain_kv_pool(cfg, allocator.size, allocator.page_size)


def plain_kv_pool(cfg: TinyConfig, num_tokens: int, page_size: int) -> MHAKVPool | MLAKVPool:
    """One pool for every layer (window layers then mask the full pool to their window)."""
    if cfg.attention == "mla":
        return MLAKVPool(
            num_tokens,
            page_size,
            cfg.num_layers,
            cfg.kv_lora_rank,
            cfg.qk_rope_head_dim,
            DTYPES[cfg.dtype],
            cfg.device,
        )
    return MHAKVPool(num_tokens, page_size, _shape(cfg))


def _shape(cfg: TinyConfig) -> KVShape:
    return KVShape(
        cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, None, DTYPES[cfg.dtype], cfg.device
    )
