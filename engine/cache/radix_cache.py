"""Radix prefix cache: page-aligned token keys → KV slot ids, shared by requests, evicted LRU.

Keeps: every node's key and value have the same page-multiple length; the tree owns exactly
the slots in its node values; ``evictable_size_`` is the token count of non-root nodes with
``lock_ref == 0`` and ``protected_size_`` of those with ``lock_ref > 0``, moved only on 0↔1
transitions; the root's ``lock_ref`` is always 1. Mirrors SGLang 0.5.11
``mem_cache/radix_cache.py`` (LRU policy). Deterministic: recency is a logical clock ticked on
every node a match or insert touches (ties broken by node id); no wall clock, and every
iteration is in insertion or id order, never hash order.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator, Sequence

import numpy as np

from engine.cache.base import MatchResult, SlotOwner
from engine.cache.session_refs import SessionRefs, eviction_priority
from engine.cache.tree_util import (
    Key,
    TreeNode,
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
from engine.mem.allocator import PagedAllocator
from engine.mem.req_to_token import ReqToTokenPool
from engine.request import Req
from engine.view import TreeView


class RadixCache:
    """SGLang's ``RadixCache``: match, insert, lock, LRU-evict; see the module docstring."""

    disable = False

    def __init__(
        self,
        req_to_token_pool: ReqToTokenPool,
        allocator: PagedAllocator,
        page_size: int,
        session_tags: bool = False,
    ) -> None:
        if page_size != allocator.page_size:
            raise KVAccountingError(
                f"cache page_size {page_size} != allocator's {allocator.page_size}"
            )
        self.req_to_token_pool = req_to_token_pool
        self.allocator = allocator
        self.page_size = page_size
        self.session_tags = session_tags
        self.reset()

    def reset(self) -> None:
        """Drop every node (their slots are not freed: the caller clears the allocator too)."""
        self._ids, self._clock = itertools.count(), itertools.count()
        self._registry: NodeRegistry[TreeNode] = NodeRegistry("lock_ref", swa=False)
        self.root_node = self._new_node((), np.empty(0, dtype=np.int64), None, None)
        self.root_node.lock_ref = 1
        self.evictable_size_ = 0
        self.protected_size_ = 0
        self.evictable_leaves: dict[int, TreeNode] = {}  # by node id: deterministic order
        # --enable-session-radix-cache: sessions tag nodes (a flush forgets every tag)
        self.session_refs = (
            SessionRefs(self.root_node, self._registry.relock) if self.session_tags else None
        )

    def supports_swa(self) -> bool:
        return False

    # ---- match / insert ----

    def match_prefix(self, key: Sequence[int], extra_key: str | None = None) -> MatchResult:
        """The longest cached page-aligned prefix of ``key``; splits the node it ends inside."""
        pkey = page_key(key, self.page_size)
        if not pkey:
            return MatchResult(np.empty(0, dtype=np.int64), self.root_node)
        values, node = self._match_helper(pkey, extra_key)
        return MatchResult(concat(values), node)

    def insert(self, key: Sequence[int], value: np.ndarray, extra_key: str | None = None) -> int:
        """Store the page-aligned head of ``key`` → ``value``; returns the length that was
        already cached (the caller's slots for that part are duplicates it must free)."""
        pkey = page_key(key, self.page_size)
        if len(value) < len(pkey):
            raise KVAccountingError(f"insert of {len(pkey)} tokens with only {len(value)} slots")
        value = np.asarray(value[: len(pkey)], dtype=np.int64)
        return self._insert_helper(pkey, value, extra_key)[0]

    def _match_helper(self, key: Key, extra_key: str | None) -> tuple[list[np.ndarray], TreeNode]:
        node, pos, values = self.root_node, 0, list[np.ndarray]()
        self._touch(node)
        while pos < len(key):
            child = node.children.get(child_key(key, pos, self.page_size, extra_key))
            if child is None:
                break
            self._touch(child)
            n = match_len(child.key, key, pos, self.page_size)
            if n < len(child.key):
                node = self._split_node(child, n)
                values.append(node.value)
                break
            values.append(child.value)
            node, pos = child, pos + n
        return values, node

    def _insert_helper(
        self, key: Key, value: np.ndarray, extra_key: str | None
    ) -> tuple[int, TreeNode]:
        """The length already cached, and the node the key ends on (SGLang's last node)."""
        node, pos = self.root_node, 0
        self._touch(node)
        while pos < len(key):
            child = node.children.get(child_key(key, pos, self.page_size, extra_key))
            if child is None:
                break
            self._touch(child)
            n = match_len(child.key, key, pos, self.page_size)
            pos += n
            if n < len(child.key):
                node = self._split_node(child, n)
                break  # the split-off remainder diverges from key: the rest is a new leaf
            node = child
        if pos < len(key):
            leaf = self._new_node(key[pos:], value[pos:].copy(), extra_key, node)
            node.children[child_key(key, pos, self.page_size, extra_key)] = leaf
            self._registry.touch(node)
            self.evictable_size_ += len(leaf.value)
            self._update_leaf_status(node)
            self._update_leaf_status(leaf)
            node = leaf
        return pos, node

    def _split_node(self, child: TreeNode, split_len: int) -> TreeNode:
        """Cut ``child`` after ``split_len`` tokens; returns the new upper node (same locks)."""
        parent = child.parent
        assert parent is not None
        new = self._new_node(
            child.key[:split_len], child.value[:split_len].copy(), child.extra_key, parent
        )
        new.lock_ref = child.lock_ref
        SessionRefs.split(new, child)
        child.key, child.value = child.key[split_len:], child.value[split_len:].copy()
        child.parent = new
        self._registry.touch(child)
        new.children[child_key(child.key, 0, self.page_size, child.extra_key)] = child
        # same dict key as before (first page unchanged), so the parent's child order holds
        parent.children[child_key(new.key, 0, self.page_size, new.extra_key)] = new
        return new

    def _new_node(
        self, key: Key, value: np.ndarray, extra_key: str | None, parent: TreeNode | None
    ) -> TreeNode:
        node = TreeNode(next(self._ids), key, value, extra_key, parent)
        self._registry.add(node)
        self._touch(node)
        return node

    def _touch(self, node: TreeNode) -> None:
        node.last_access = next(self._clock)

    # ---- request lifecycle ----

    def cache_finished_req(self, req: Req, is_insert: bool = True) -> None:
        """Hand a finished request's committed KV to the tree and drop its lock.

            [0, cpl)                    already the tree's (locked by this req): kept
            [cpl, new_prefix_len)       duplicates of KV the tree already had: freed
            [new_prefix_len, key_len)   inserted: now owned by the tree
            [key_len, committed)        unaligned tail (partial page): freed
        (``cpl`` = cache_protected_len, ``key_len`` = page-floor of committed;
        ``is_insert=False`` frees all of ``[cpl, committed)``.)
        """
        token_ids, kv, key_len = committed_kv(self.req_to_token_pool, req, self.page_size)
        cpl = req.cache_protected_len
        if is_insert:
            pkey = page_key(token_ids[:key_len], self.page_size)
            new_prefix_len, leaf = self._insert_helper(pkey, kv[:key_len], req.extra_key)
            self.allocator.free(kv[cpl:new_prefix_len])
            self._tag(req, leaf)
        else:
            self.allocator.free(kv[cpl:key_len])
        self.allocator.free(kv[key_len:])
        if req.last_node is not None:
            self.dec_lock_ref(req.last_node)

    def cache_unfinished_req(self, req: Req, chunked: bool = False, reads_back: int = 0) -> None:
        """Insert a running request's page-aligned KV and re-point its row at the tree's copy.

            [0, cpl)                    already the tree's: row unchanged
            [cpl, new_prefix_len)       the tree had it: req's slots freed, row rewritten
            [new_prefix_len, key_len)   inserted: row keeps its slots, now tree-owned
            [key_len, len(fill_ids))    partial last page: stays request-owned
        Afterwards ``cache_protected_len = key_len`` and the lock moves to the new last node.
        """
        row, kv, key_len = fill_kv(self.req_to_token_pool, req, self.page_size)
        cpl, token_ids = req.cache_protected_len, req.fill_ids
        new_prefix_len = self.insert(token_ids[:key_len], kv[:key_len], req.extra_key)
        self.allocator.free(kv[cpl:new_prefix_len])
        new_indices, new_last_node, _ = self.match_prefix(token_ids[:key_len], req.extra_key)
        if len(new_indices) != key_len:
            raise KVAccountingError(
                f"req {req.rid}: re-match found {len(new_indices)} of {key_len} tokens"
            )
        self.req_to_token_pool.write(row, cpl, new_indices[cpl:])
        req.cache_protected_len = len(new_indices)
        self.dec_lock_ref(req.last_node)
        self.inc_lock_ref(new_last_node)
        req.prefix_indices = np.concatenate([new_indices, kv[len(new_indices) :]])
        req.last_node = new_last_node

    def _tag(self, req: Req, leaf: TreeNode) -> None:
        """A finished, tagged turn (not an abort) makes its insert's last node a frontier of
        its session (SGLang ``register_session_ref``)."""
        tag, reason = req.session_tag, req.finished_reason
        if self.session_refs is None or tag is None or reason is None or reason.kind == "abort":
            return
        self.session_refs.register(tag[0], tag[1], leaf)

    # ---- locks and eviction ----

    def inc_lock_ref(self, node: TreeNode | None) -> None:
        """Pin ``node`` and its ancestors; a 0→1 transition moves its size evictable→protected.
        Returns None (no SWA lock handle in a full-attention tree). Raises, changing nothing,
        for None or a node of another tree."""
        path = path_to_root(self.root_node, node, "inc_lock_ref")
        self._registry.relock(path)
        for n in path:
            if n.lock_ref == 0:
                self.evictable_size_ -= len(n.key)
                self.protected_size_ += len(n.key)
            n.lock_ref += 1
            self._update_leaf_status(n)

    def dec_lock_ref(self, node: TreeNode | None, swa_uuid_for_lock: int | None = None) -> None:
        """Unpin ``node`` and its ancestors; a 1→0 transition moves its size protected→evictable.
        Like SGLang, a count may go negative (the view exposes it to the invariants)."""
        path = path_to_root(self.root_node, node, "dec_lock_ref")
        self._registry.relock(path)
        for n in path:
            if n.lock_ref == 1:
                self.evictable_size_ += len(n.key)
                self.protected_size_ -= len(n.key)
            n.lock_ref -= 1
            self._update_leaf_status(n)

    def evict(self, num_tokens: int, swa_num_tokens: int = 0) -> int:
        """Free least-recently-used unlocked leaves until ``num_tokens`` are freed (or none is
        left); a parent left childless and unlocked becomes a candidate. Returns tokens freed.
        Session-tagged leaves go last (``eviction_priority``: without tags, plain LRU)."""
        heap = [(eviction_priority(n), n) for n in self.evictable_leaves.values()]
        heapq.heapify(heap)
        num_evicted = 0
        while num_evicted < num_tokens and heap:
            x = heapq.heappop(heap)[1]
            self.allocator.free(x.value)
            num_evicted += len(x.value)
            self._delete_leaf(x)
            parent = x.parent
            assert parent is not None
            if not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (eviction_priority(parent), parent))
        return num_evicted

    def _delete_leaf(self, node: TreeNode) -> None:
        assert node.parent is not None
        if node.session_ids and self.session_refs is not None:
            self.session_refs.discard(node)  # its frontiers move up before it goes
        node.parent.children.pop(child_key(node.key, 0, self.page_size, node.extra_key))
        self.evictable_size_ -= len(node.key)
        self.evictable_leaves.pop(node.id, None)
        self._registry.unlink(node)
        self._update_leaf_status(node.parent)

    def _update_leaf_status(self, node: TreeNode) -> None:
        if node.lock_ref > 0 or node.children:  # the root is always locked
            self.evictable_leaves.pop(node.id, None)
        else:
            self.evictable_leaves[node.id] = node

    # ---- counters and views ----

    def evictable_size(self) -> int:
        return self.evictable_size_

    def protected_size(self) -> int:
        return self.protected_size_

    def swa_evictable_size(self) -> int:
        return 0  # a full-attention tree holds no SWA KV

    swa_protected_size = swa_evictable_size

    def total_size(self) -> int:
        return sum(len(n.value) for n in self._registry.all())

    def tree_view(self) -> TreeView:
        return TreeView(
            kind="radix",
            page_size=self.page_size,
            evictable_size=self.evictable_size_,
            protected_size=self.protected_size_,
            num_evictable_leaves=len(self.evictable_leaves),
            session_radix=self.session_refs is not None,
            closed_sessions=tuple(self.session_refs.closed) if self.session_refs else (),
            nodes=self._registry.views(),
        )

    def slot_owners(self) -> Iterator[SlotOwner]:
        return iter(self._registry.slot_owners())

    def node_registry(self) -> NodeRegistry[TreeNode]:
        """The live nodes and their census owners (what an incremental census follows)."""
        return self._registry
