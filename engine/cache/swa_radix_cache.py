"""SWA radix cache: the prefix tree of a hybrid model, owning full and sliding-window KV.

Keeps: per node ``full_lock_ref >= swa_lock_ref >= 0``; a ``swa_tombstone`` node holds full KV
only (its SWA slots went back through ``allocator.free_swa``) and is never SWA-locked; the
full counters split every non-root node's tokens by ``full_lock_ref``, the SWA counters every
non-tombstone node's tokens by ``swa_lock_ref``; a match never ends where its last
``sliding_window_size`` tokens cross a tombstone. Mirrors SGLang 0.5.11
``mem_cache/swa_radix_cache.py``; its asserts raise ``KVAccountingError``. SGLang's two LRU
lists are logical-clock ticks (``full_tick``, ``swa_tick``): moving to the MRU end = a new tick.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Iterator, Sequence

import numpy as np

from engine.cache.base import MatchResult, SlotOwner
from engine.cache.tree_util import (
    Key,
    SWATreeNode,
    child_key,
    committed_kv,
    concat,
    fill_kv,
    match_len,
    page_key,
    path_to_root,
)
from engine.cache.tree_view_cache import NodeRegistry
from engine.errors import KVAccountingError
from engine.mem.allocator import SWAAllocator
from engine.mem.req_to_token import ReqToTokenPool
from engine.request import Req
from engine.view import TreeView


class SWARadixCache:
    """SGLang's ``SWARadixCache``; see the module docstring."""

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

    def match_prefix(self, key: Sequence[int], extra_key: str | None = None) -> MatchResult:
        """The longest cached prefix that ends in a window of live SWA KV (or has no tombstone)."""
        pkey = page_key(key, self.page_size)
        if not pkey:
            return MatchResult(np.empty(0, dtype=np.int64), self.root_node)
        values, node = self._match_helper(pkey, extra_key)
        for n in reversed(path_to_root(self.root_node, node, "match_prefix")):
            self._mru(n)  # ancestors older than children: SWA eviction tombstones rootward first
        return MatchResult(concat(values), node)

    def _match_helper(
        self, key: Key, extra_key: str | None
    ) -> tuple[list[np.ndarray], SWATreeNode]:
        node, pos, values = self.root_node, 0, list[np.ndarray]()
        since_tombstone: float = math.inf  # a tombstone-free path back to the root always counts
        best_len, best_node = 0, node
        while pos < len(key):
            child = node.children.get(child_key(key, pos, self.page_size, extra_key))
            if child is None:
                break
            if child.swa_tombstone:
                if since_tombstone >= self.sliding_window_size:
                    best_len, best_node = len(values), node
                since_tombstone = 0
            n = match_len(child.key, key, pos, self.page_size)
            split = n < len(child.key)
            if split:
                child = self._split_node(child, n)
            values.append(child.value)
            if not child.swa_tombstone:
                since_tombstone += n
            node, pos = child, pos + n
            if split:
                break
        if since_tombstone >= self.sliding_window_size:
            best_len, best_node = len(values), node
        return values[:best_len], best_node

    def insert(
        self,
        key: Sequence[int],
        value: np.ndarray,
        prev_prefix_len: int = 0,
        swa_evicted_seqlen: int = 0,
        extra_key: str | None = None,
    ) -> int:
        """Store the page-aligned head of ``key`` → ``value``; returns the length already cached.
        Unlike ``RadixCache.insert`` it settles the caller's slots itself:

            [0, prev_prefix_len)             the caller's locked prefix: untouched
            [prev_prefix_len, prefix_len)    duplicates: freed, or adopted by a tombstone
            [prefix_len, swa_evicted_seqlen) new tombstone node (its SWA is already freed)
            [max(prefix_len, swa_evicted_seqlen), len)   new live leaf
        """
        pkey = page_key(key, self.page_size)
        if len(value) < len(pkey):
            raise KVAccountingError(f"insert of {len(pkey)} tokens with only {len(value)} slots")
        val = np.asarray(value[: len(pkey)], dtype=np.int64)
        node, pos = self.root_node, 0
        while pos < len(pkey):
            child = node.children.get(child_key(pkey, pos, self.page_size, extra_key))
            if child is None:
                break
            self._mru(child)
            n = match_len(child.key, pkey, pos, self.page_size)
            split = n < len(child.key)
            if split:
                child = self._split_node(child, n)
            node = self._absorb(child, val[pos : pos + n], pos, prev_prefix_len, swa_evicted_seqlen)
            pos += n
            if split:
                break  # the split-off remainder diverges from key: the rest is a new leaf
        if pos < len(pkey):
            self._insert_tail(node, pkey[pos:], val[pos:], pos, swa_evicted_seqlen, extra_key)
        return pos

    def _absorb(
        self, node: SWATreeNode, incoming: np.ndarray, start: int, prev: int, swa_evicted: int
    ) -> SWATreeNode:
        """Settle the caller's slots for ``[start, end)``, a span ``node`` holds (see ``insert``);
        a tombstone revives where the caller's SWA KV is live. Returns where the walk goes on."""
        end = start + len(incoming)
        if prev >= end:
            return node
        if not node.swa_tombstone:
            self.allocator.free(incoming[max(0, prev - start) :])
            return node
        if node.swa_lock_ref != 0:
            raise KVAccountingError(
                f"tombstone n{node.id} has swa_lock_ref={node.swa_lock_ref} (must be 0)"
            )
        if swa_evicted % self.page_size:
            raise KVAccountingError(f"swa_evicted_seqlen {swa_evicted} is not a page multiple")
        if swa_evicted <= start:
            self._revive(node, incoming)
        elif swa_evicted < end:
            cut = swa_evicted - start
            self._split_node(node, cut)  # node keeps the tail [swa_evicted, end)
            self._revive(node, incoming[cut:])
            self.allocator.free(incoming[:cut])
        else:
            self.allocator.free(incoming)
        return node

    def _revive(self, node: SWATreeNode, incoming: np.ndarray) -> None:
        """Un-tombstone ``node`` with the caller's live KV for its span."""
        alloc = self.allocator
        if node.full_lock_ref > 0:
            # A running request reads node.value: keep those full slots and move the caller's
            # SWA slots under them (SGLang's later _recover_tombstone_keeping_locked_full).
            alloc.full_to_swa[node.value] = alloc.full_to_swa[incoming]
            alloc.full_to_swa[incoming] = 0
            alloc.full.free(incoming)
        else:
            alloc.free(node.value)  # full slots only: a tombstone's SWA mapping is zero
            node.value = incoming.copy()
        node.swa_tombstone = False
        self._registry.touch(node)
        node.swa_tick = next(self._clock)
        self.swa_evictable_size_ += len(node.value)

    def _insert_tail(
        self,
        node: SWATreeNode,
        key: Key,
        value: np.ndarray,
        start: int,
        swa_evicted: int,
        extra_key: str | None,
    ) -> None:
        """Add ``[start, end)`` below ``node``: ``[start, swa_evicted)`` as a tombstone (SWA already
        freed), ``[swa_evicted, end)`` as a live leaf — or freed if empty (no tombstone leaves)."""
        if swa_evicted == start + len(key):
            self.allocator.free(value)
            return
        cut = swa_evicted - start if start < swa_evicted < start + len(key) else 0
        self._registry.touch(node)  # gains a child
        for lo, hi, tombstone in ((0, cut, True), (cut, len(key), False)):
            if lo == hi:
                continue
            child = SWATreeNode(next(self._ids), key[lo:hi], value[lo:hi].copy(), extra_key, node)
            child.swa_tombstone = tombstone
            self._registry.add(child)
            node.children[child_key(child.key, 0, self.page_size, extra_key)] = child
            self.full_evictable_size_ += hi - lo
            self.swa_evictable_size_ += 0 if tombstone else hi - lo
            self._mru(child)
            node = child

    def _split_node(self, child: SWATreeNode, split_len: int) -> SWATreeNode:
        """Cut ``child`` after ``split_len`` tokens; the new upper node copies its locks and
        tombstone and takes over its ``swa_uuid`` (a lock chain stopping there covers both)."""
        parent = child.parent
        assert parent is not None
        new = SWATreeNode(
            next(self._ids),
            child.key[:split_len],
            child.value[:split_len].copy(),
            child.extra_key,
            parent,
            full_lock_ref=child.full_lock_ref,
            swa_lock_ref=child.swa_lock_ref,
            swa_tombstone=child.swa_tombstone,
            swa_uuid=child.swa_uuid,
        )
        self._registry.add(new)
        self._registry.touch(child)
        child.swa_uuid = None
        child.key, child.value = child.key[split_len:], child.value[split_len:].copy()
        child.parent = new
        new.children[child_key(child.key, 0, self.page_size, child.extra_key)] = child
        parent.children[child_key(new.key, 0, self.page_size, new.extra_key)] = new
        self._mru(new)  # upper part first: the child stays more recent
        self._mru(child)
        return new

    def cache_finished_req(self, req: Req, is_insert: bool = True) -> None:
        """Hand a finished request's committed KV to the tree and drop its locks.

            [0, cpl)                already the tree's (locked by this req): kept
            [cpl, key_len)          inserted: ``insert`` frees the duplicates and stores
                                    [.., swa_evicted_seqlen) as tombstone
            [key_len, committed)    unaligned tail (partial page): freed
        (``cpl`` = cache_protected_len; ``is_insert=False`` frees all of ``[cpl, committed)``.)
        """
        token_ids, kv, key_len = committed_kv(self.req_to_token_pool, req, self.page_size)
        cpl = req.cache_protected_len
        if is_insert:
            self.insert(
                token_ids[:key_len], kv[:key_len], cpl, req.swa_evicted_seqlen, req.extra_key
            )
        else:
            self.allocator.free(kv[cpl:key_len])
        self.allocator.free(kv[key_len:])
        if req.last_node is not None:
            self.dec_lock_ref(req.last_node, req.swa_uuid_for_lock)

    def cache_unfinished_req(self, req: Req, chunked: bool = False) -> None:
        """Insert a running request's page-aligned KV and re-point its row at the tree's copy.

            [0, cpl)                      already the tree's: row unchanged
            [cpl, swa_evicted)            SWA already freed: stored as a tombstone
            [.., len(new_indices))        row → the tree's slots (insert freed duplicates)
            [len(new_indices), len(fill)) stays request-owned (partial page)
        Needs >= a window of live SWA KV after ``swa_evicted_seqlen`` (prefill always has it).
        """
        row, kv, key_len = fill_kv(self.req_to_token_pool, req, self.page_size)
        cpl, token_ids, evicted = req.cache_protected_len, req.fill_ids, req.swa_evicted_seqlen
        if evicted > cpl and key_len - evicted < self.sliding_window_size:
            raise KVAccountingError(
                f"req {req.rid}: publishing {key_len=} needs a live window after {evicted=}"
            )
        new_prefix_len = self.insert(token_ids[:key_len], kv[:key_len], cpl, evicted, req.extra_key)
        new_indices, new_last_node, _ = self.match_prefix(token_ids[:key_len], req.extra_key)
        if cpl > len(new_indices) or new_prefix_len > len(new_indices):
            raise KVAccountingError(
                f"req {req.rid}: {len(new_indices)=} < {cpl=} or {new_prefix_len=}"
            )
        self.req_to_token_pool.write(row, cpl, new_indices[cpl:])
        req.cache_protected_len = len(new_indices)
        self.dec_lock_ref(req.last_node, req.swa_uuid_for_lock)
        swa_uuid_for_lock = self.inc_lock_ref(new_last_node)
        req.prefix_indices = np.concatenate([new_indices, kv[len(new_indices) :]])
        req.last_node = new_last_node
        req.swa_uuid_for_lock = swa_uuid_for_lock

    def inc_lock_ref(self, node: SWATreeNode | None) -> int | None:
        """Full-lock ``node`` up to the root, SWA-lock it until ``sliding_window_size`` tokens are
        covered; returns the uuid of the node the SWA chain stops at (None: path < window)."""
        path = path_to_root(self.root_node, node, "inc_lock_ref")
        swa_path, covered = [], 0
        for n in path:
            if covered >= self.sliding_window_size:
                break
            swa_path.append(n)
            covered += len(n.value)
        self._move_locks("inc_lock_ref", path, swa_path, +1)
        if covered < self.sliding_window_size:
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
