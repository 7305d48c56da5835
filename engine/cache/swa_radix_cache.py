"""SWA radix cache: the prefix cache of a hybrid model, owning full and sliding-window KV —
match, insert and the request lifecycle (SGLang 0.5.11 ``mem_cache/swa_radix_cache.py``) over
the tree of swa_tree.py (nodes, locks, eviction, counters).

Keeps: a match never ends where its last ``sliding_window_size`` tokens cross a tombstone;
an insert over a tombstone revives it with the incoming SWA KV; the tree's invariants
(swa_tree.py) across every operation; SGLang's asserts raise ``KVAccountingError``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from engine.cache.base import MatchResult
from engine.cache.swa_tree import SWATree
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
from engine.errors import KVAccountingError
from engine.request import Req


class SWARadixCache(SWATree):
    """SGLang's ``SWARadixCache``: match, insert and the request lifecycle over the tree
    (swa_tree.py: nodes, locks, eviction, counters); see the module docstring."""

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

    def cache_unfinished_req(self, req: Req, chunked: bool = False, reads_back: int = 0) -> None:
        """Insert a running request's page-aligned KV and re-point its row at the tree's copy.

            [0, cpl)                      already the tree's: row unchanged
            [cpl, swa_evicted)            SWA already freed: stored as a tombstone
            [.., len(new_indices))        row → the tree's slots (insert freed duplicates)
            [len(new_indices), len(fill)) stays request-owned (partial page)
        Needs >= a window of live SWA KV after ``swa_evicted_seqlen`` (prefill always has it).
        The new lock's SWA part also covers ``reads_back`` tokens: the chunk just published,
        still in flight under overlap, reads its window from before the new lock's (kvspec's
        guard; SGLang 0.5.11 moves the lock at once, and tree eviction may then free what the
        launched batch reads: sched.inflight_reads_held).
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
        swa_uuid_for_lock = self.inc_lock_ref(new_last_node, reads_back)
        req.prefix_indices = np.concatenate([new_indices, kv[len(new_indices) :]])
        req.last_node = new_last_node
        req.swa_uuid_for_lock = swa_uuid_for_lock
