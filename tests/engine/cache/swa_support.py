"""Shared builders of the SWA tree and cache tests: the stack's tree and allocator, node views
by id, the four counters, and a three-node chain."""

from __future__ import annotations

import numpy as np

from engine.cache.swa_radix_cache import SWARadixCache
from engine.cache.tree_util import SWATreeNode
from engine.mem.allocator import SWAAllocator
from engine.view import NodeView
from tests.engine.conftest import Stack

PAGE_SIZES = [1, 4, 16, 64]


def swa(st: Stack) -> SWARadixCache:
    assert isinstance(st.cache, SWARadixCache)
    return st.cache


def alloc(st: Stack) -> SWAAllocator:
    assert isinstance(st.allocator, SWAAllocator)
    return st.allocator


def nodes(cache: SWARadixCache) -> dict[int, NodeView]:
    return {n.id: n for n in cache.tree_view().nodes}


def counters(cache: SWARadixCache) -> tuple[int, int, int, int]:
    """(full evictable, full protected, SWA evictable, SWA protected)."""
    return (
        cache.full_evictable_size(),
        cache.full_protected_size(),
        cache.swa_evictable_size(),
        cache.swa_protected_size(),
    )


def three_nodes(st: Stack) -> tuple[SWATreeNode, SWATreeNode, SWATreeNode]:
    """Root → n3 [0, ps) → n2 [ps, 3ps) → n1 [3ps, 4ps), holding pages 1..4."""
    ps, cache = st.page_size, swa(st)
    cache.insert(list(range(4 * ps)), alloc(st).alloc(4 * ps))
    cache.match_prefix(list(range(3 * ps)) + [-1] * ps)
    cache.match_prefix(list(range(ps)) + [-1] * ps)
    n1 = cache.match_prefix(list(range(4 * ps))).last_node
    assert n1.parent is not None and n1.parent.parent is not None
    return n1, n1.parent, n1.parent.parent


def tombstoned(st: Stack) -> np.ndarray:
    """Tree: n1 [0, 2ps) tombstone → n2 [2ps, 3ps) live; returns the full slots stored."""
    ps = st.page_size
    vals = alloc(st).alloc(3 * ps)
    alloc(st).free_swa(vals[: 2 * ps])
    swa(st).insert(list(range(3 * ps)), vals, 0, 2 * ps)
    return vals
