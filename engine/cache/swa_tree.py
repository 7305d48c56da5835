"""The SWA radix tree of a hybrid model: its nodes, locks, LRU eviction and counters, owning
full and sliding-window KV (SGLang 0.5.11 ``mem_cache/swa_radix_cache.py``, the tree half;
matching, inserting and the request lifecycle are ``SWARadixCache``'s, swa_radix_cache.py).

Keeps: per node ``full_lock_ref >= swa_lock_ref >= 0``; a ``swa_tombstone`` node holds full KV
only (its SWA slots went back through ``allocator.free_swa``) and is never SWA-locked; the
full counters split every non-root node's tokens by ``full_lock_ref``, the SWA counters every
non-tombstone node's tokens by ``swa_lock_ref``; SGLang's asserts raise ``KVAccountingError``.
SGLang's two LRU lists are logical-clock ticks (``full_tick``, ``swa_tick``): moving to the
MRU end = a new tick.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator

import numpy as np

from engine.cache.base import SlotOwner
from engine.cache.tree_util import SWATreeNode, child_key, path_to_root
from engine.cache.tree_view_cache import NodeRegistry
from engine.errors import KVAccountingError
from engine.mem.allocator import SWAAllocator
from engine.mem.req_to_token import ReqToTokenPool
from engine.view import TreeView


class SWATree:
    """The tree half of SGLang's ``SWARadixCache``; see the module docstring."""

    disable = False

    def __init__(
        self,
        req_to_token_pool: ReqToTokenPool,
        allocator: SWAAllocator,
        page_size: int,
        sliding_window_size: int,
    ) -> None:
        ok = isinstance(allocator, SWAAllocator) and allocator.page_size == page_size
        if not ok or sliding_window_size < 1:
            raise KVAccountingError(
                f"SWARadixCache needs an SWAAllocator of page size {page_size}, window >= 1"
            )
        self.req_to_token_pool, self.allocator = req_to_token_pool, allocator
        self.page_size, self.sliding_window_size = page_size, sliding_window_size
        self.reset()

    def reset(self) -> None:
        """Drop every node (their slots are not freed: the caller clears the allocator too)."""
        self._ids, self._clock, self._uuids = (
            itertools.count(),
            itertools.count(),
            itertools.count(1),
        )
        self.root_node = SWATreeNode(next(self._ids), (), np.empty(0, dtype=np.int64))
        self._registry: NodeRegistry[SWATreeNode] = NodeRegistry("full_lock_ref", swa=True)
        self._registry.add(self.root_node)
        self.root_node.full_lock_ref = self.root_node.swa_lock_ref = 1
        self.full_evictable_size_ = self.swa_evictable_size_ = self.full_protected_size_ = (
            self.swa_protected_size_
        ) = 0

    def supports_swa(self) -> bool:
        return True

    def inc_lock_ref(self, node: SWATreeNode | None, reads_back: int = 0) -> int | None:
        """Full-lock ``node`` up to the root, SWA-lock it until ``sliding_window_size`` tokens
        (plus ``reads_back``: a chunk still in flight reads its window from further back) are
        covered; returns the uuid of the node the SWA chain stops at (None: path too short)."""
        path = path_to_root(self.root_node, node, "inc_lock_ref")
        swa_path, covered, window = [], 0, self.sliding_window_size + reads_back
        for n in path:
            if covered >= window:
                break
            swa_path.append(n)
            covered += len(n.value)
        self._move_locks("inc_lock_ref", path, swa_path, +1)
        if covered < window:
            return None
        if swa_path[-1].swa_uuid is None:
            swa_path[-1].swa_uuid = next(self._uuids)
        return swa_path[-1].swa_uuid

    def dec_lock_ref(self, node: SWATreeNode | None, swa_uuid_for_lock: int | None = None) -> None:
        """Undo ``inc_lock_ref``: full locks up to the root, SWA locks up to and including the
        node whose ``swa_uuid`` is ``swa_uuid_for_lock`` (to the root when None)."""
        path = path_to_root(self.root_node, node, "dec_lock_ref")
        swa_path: list[SWATreeNode] = []
        for n in path:
            swa_path.append(n)
            if swa_uuid_for_lock is not None and n.swa_uuid == swa_uuid_for_lock:
                break
        self._move_locks("dec_lock_ref", path, swa_path, -1)

    def _move_locks(
        self, op: str, path: list[SWATreeNode], swa_path: list[SWATreeNode], delta: int
    ) -> None:
        """Add ``delta`` to the locks — after checking, changing nothing on failure, that none goes
        below 0 and no SWA lock touches a tombstone; a 0↔1 transition moves a size across sides."""
        low, edge = min(delta, 0), (0 if delta > 0 else 1)
        if bad := next((n for n in path if n.full_lock_ref + low < 0), None):
            raise KVAccountingError(
                f"{op} on node n{bad.id} with full_lock_ref={bad.full_lock_ref}"
            )
        if bad := next((n for n in swa_path if n.swa_tombstone or n.swa_lock_ref + low < 0), None):
            raise KVAccountingError(
                f"{op}: SWA lock of n{bad.id} with {bad.swa_tombstone=}, {bad.swa_lock_ref=}"
            )
        self._registry.relock(path)  # swa_path is a prefix of path
        for n in path:
            if n.full_lock_ref == edge:
                self.full_evictable_size_ -= delta * len(n.value)
                self.full_protected_size_ += delta * len(n.value)
            n.full_lock_ref += delta
        for n in swa_path:
            if n.swa_lock_ref == edge:
                self.swa_evictable_size_ -= delta * len(n.value)
                self.swa_protected_size_ += delta * len(n.value)
            n.swa_lock_ref += delta

    def evict(self, full_num_tokens: int, swa_num_tokens: int = 0) -> int:
        """Free full KV (LRU leaves), then SWA KV (LRU nodes: tombstone or delete), to the
        targets."""
        full, swa = self._evict_full(full_num_tokens) if full_num_tokens > 0 else (0, 0)
        if swa < swa_num_tokens:
            more_full, swa = self._evict_swa(swa_num_tokens, swa)
            full += more_full
        return full

    def _evict_full(self, num_tokens: int) -> tuple[int, int]:
        nodes = self._registry.all()[1:]
        heap = [(n.full_tick, n.id, n) for n in nodes if not n.children and n.full_lock_ref == 0]
        heapq.heapify(heap)
        full = swa = 0
        while full < num_tokens and heap:
            f, s, parent = self._evict_leaf(heapq.heappop(heap)[2])
            full, swa = full + f, swa + s
            if parent is not self.root_node and not parent.children and parent.full_lock_ref == 0:
                heapq.heappush(heap, (parent.full_tick, parent.id, parent))
        return full, swa

    def _evict_swa(self, num_tokens: int, swa: int) -> tuple[int, int]:
        nodes = [n for n in self._registry.all()[1:] if not n.swa_tombstone and n.swa_lock_ref == 0]
        full = 0
        for x in sorted(nodes, key=lambda n: (n.swa_tick, n.id)):
            if swa >= num_tokens:
                break
            if x.children:  # internal: free its SWA KV only, keep the full KV as a tombstone
                self.allocator.free_swa(x.value)
                swa += len(x.value)
                x.swa_tombstone = True
                self._registry.touch(x)
                self.swa_evictable_size_ -= len(x.value)
            elif x.full_lock_ref > 0:
                raise KVAccountingError(f"leaf n{x.id} is full-locked but not SWA-locked")
            else:
                f, s, _ = self._evict_leaf(x)
                full, swa = full + f, swa + s
        return full, swa

    def _evict_leaf(self, x: SWATreeNode) -> tuple[int, int, SWATreeNode]:
        """Delete leaf ``x`` and the unlocked tombstones it leaves childless; returns (full,
        SWA, survivor)."""
        full, swa, parent = self._delete_leaf(x)
        while parent is not self.root_node and parent.swa_tombstone and not parent.children:
            if parent.full_lock_ref > 0:
                break
            more_full, _, parent = self._delete_leaf(parent)
            full += more_full
        return full, swa, parent

    def _delete_leaf(self, node: SWATreeNode) -> tuple[int, int, SWATreeNode]:
        """Free unlocked leaf ``node``'s KV and unlink it: (full freed, SWA freed, its parent)."""
        parent = node.parent
        assert parent is not None and not node.children
        self.allocator.free(node.value)  # a tombstone's SWA mapping is 0: full slots only
        parent.children.pop(child_key(node.key, 0, self.page_size, node.extra_key))
        self._registry.unlink(node)
        full, swa = len(node.value), 0 if node.swa_tombstone else len(node.value)
        self.full_evictable_size_ -= full
        self.swa_evictable_size_ -= swa
        return full, swa, parent

    def _mru(self, node: SWATreeNode) -> None:
        """Move ``node`` to the MRU end of the full list, and of the SWA list if it is in it."""
        node.full_tick = next(self._clock)
        if not node.swa_tombstone:
            node.swa_tick = next(self._clock)

    def full_evictable_size(self) -> int:
        return self.full_evictable_size_

    def swa_evictable_size(self) -> int:
        return self.swa_evictable_size_

    def full_protected_size(self) -> int:
        return self.full_protected_size_

    def swa_protected_size(self) -> int:
        return self.swa_protected_size_

    evictable_size = full_evictable_size  # the scheduler's single-pool view is the full pool
    protected_size = full_protected_size

    def tree_view(self) -> TreeView:
        nodes = self._registry.all()
        return TreeView(
            kind="swa_radix",
            page_size=self.page_size,
            evictable_size=self.full_evictable_size_,
            protected_size=self.full_protected_size_,
            swa_evictable_size=self.swa_evictable_size_,
            swa_protected_size=self.swa_protected_size_,
            num_evictable_leaves=sum(
                1 for n in nodes[1:] if not n.children and n.full_lock_ref == 0
            ),
            nodes=self._registry.views(),
        )

    def slot_owners(self) -> Iterator[SlotOwner]:
        return iter(self._registry.slot_owners())

    def node_registry(self) -> NodeRegistry[SWATreeNode]:
        """The live nodes, their views and census owners (cross-check mode rebuilds them)."""
        return self._registry
