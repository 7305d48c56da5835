"""The radix trees' nodes and shared helpers: child keys, page-granular matching, walks, views.

Keeps: a node's ``key`` and ``value`` have the same page-multiple length; every match length
is a page multiple (a node never ends inside a page); keys of different ``extra_key``
namespaces never share a child key (SGLang ``RadixKey``); a lock walk only ever ends at its
own tree's root.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from engine.errors import KVAccountingError
from engine.mem import paging
from engine.mem.req_to_token import ReqToTokenPool
from engine.request import Req
from engine.view import NodeView

Key = tuple[int, ...]
ChildKey = Hashable


@dataclass(slots=True, eq=False)
class TreeNode:
    """One edge of the tree: ``key`` tokens whose KV lives in slots ``value``."""

    id: int
    key: Key
    value: np.ndarray
    extra_key: str | None = None
    parent: TreeNode | None = field(default=None, repr=False)
    children: dict[ChildKey, TreeNode] = field(default_factory=dict, repr=False)
    lock_ref: int = 0
    last_access: int = 0  # logical clock; larger = more recently used
    session_ref: int = 0  # (session, frontier) pairs in this subtree (engine/cache/session_refs.py)
    session_ids: frozenset[str] | None = None  # the sessions this node is a frontier of


@dataclass(slots=True, eq=False)
class SWATreeNode:
    """One edge: ``key`` tokens whose full-pool slots are ``value`` (SWA via the mapping)."""

    id: int
    key: Key
    value: np.ndarray
    extra_key: str | None = None
    parent: SWATreeNode | None = field(default=None, repr=False)
    children: dict[ChildKey, SWATreeNode] = field(default_factory=dict, repr=False)
    full_lock_ref: int = 0
    swa_lock_ref: int = 0
    swa_tombstone: bool = False
    swa_uuid: int | None = None  # set on the node where some SWA lock chain stops
    full_tick: int = 0  # position in the full LRU order (larger = more recent)
    swa_tick: int = 0  # position in the SWA LRU order (non-tombstone nodes only)


def page_key(key: Sequence[int], page_size: int) -> Key:
    """The page-aligned head of ``key`` as a tuple: what a radix tree may store or match."""
    return tuple(key[: paging.page_aligned_len(len(key), page_size)])


def child_key(key: Key, pos: int, page_size: int, extra_key: str | None) -> ChildKey:
    """Dict key of the child edge starting at ``key[pos]``: its first page, namespaced."""
    plain: ChildKey = key[pos] if page_size == 1 else key[pos : pos + page_size]
    return plain if extra_key is None else (extra_key, plain)


def match_len(node_key: Key, key: Key, pos: int, page_size: int) -> int:
    """Length of the common prefix of ``node_key`` and ``key[pos:]``, floored to a page
    (both are page-aligned, so a full match is already a page multiple)."""
    n = min(len(node_key), len(key) - pos)
    if node_key[:n] == key[pos : pos + n]:
        return n
    i = 0
    while node_key[i] == key[pos + i]:
        i += 1
    return paging.floor_align(i, page_size)


def concat(values: list[np.ndarray]) -> np.ndarray:
    """Slot ids of consecutive nodes as one int64 array (empty when nothing matched)."""
    return np.concatenate(values) if values else np.empty(0, dtype=np.int64)


def request_row(req: Req) -> int:
    """The request's ``req_to_token`` row; caching a request without one is a caller bug."""
    if req.req_pool_idx is None:
        raise KVAccountingError(
            f"req {req.rid}: cache operation on a request without a request row"
        )
    return req.req_pool_idx


N = TypeVar("N", TreeNode, SWATreeNode)


def path_to_root(root: N, node: N | None, op: str) -> list[N]:
    """``node`` and its ancestors below ``root``; raises (before any change is made) if the
    walk ends at another tree's root (SGLang: "This request holds the node from another tree")."""
    if node is None:
        raise KVAccountingError(f"{op}(None): the request holds no tree node")
    path: list[N] = []
    while node is not root:
        if node.parent is None:
            raise KVAccountingError(f"{op}: this request holds node n{node.id} of another tree")
        path.append(node)
        node = node.parent
    return path


def all_nodes(root: N) -> list[N]:
    """Every node of the tree under ``root``, root first, in id (= creation) order."""
    nodes, stack = [], [root]
    while stack:
        node = stack.pop()
        nodes.append(node)
        stack.extend(node.children.values())
    return sorted(nodes, key=lambda n: n.id)


def node_view(node: TreeNode | SWATreeNode, is_root: bool, lock_attr: str) -> NodeView:
    """The view of one node; ``lock_attr`` names its full lock (``lock_ref`` or
    ``full_lock_ref``), and SWA fields read 0/False on a full-attention tree's nodes."""
    parent = node.parent
    tags: tuple[str, ...]
    if isinstance(node, SWATreeNode):  # a full tree's node has no SWA fields, and no tags
        swa_lock, tombstone, refs, child_refs, tags = (
            node.swa_lock_ref,
            node.swa_tombstone,
            0,
            0,
            (),
        )
    else:
        swa_lock, tombstone, refs = 0, False, node.session_ref
        child_refs = sum(c.session_ref for c in node.children.values())
        tags = tuple(sorted(node.session_ids or ()))
    return NodeView(  # the parent's locks: in its own view; session locks: added by observe/
        id=node.id,
        parent=-1 if parent is None else parent.id,
        is_root=is_root,
        is_leaf=not node.children,
        key_len=len(node.key),
        value_len=len(node.value),
        lock_ref=getattr(node, lock_attr),
        swa_lock_ref=swa_lock,
        swa_tombstone=tombstone,
        session_ref=refs,
        session_ref_children=child_refs,
        session_tags=tags,
    )


def committed_kv(
    pool: ReqToTokenPool, req: Req, page_size: int
) -> tuple[list[int], np.ndarray, int]:
    """Release a finished request's committed range: its tokens, their slots (a copy) and the
    page-aligned length a tree may keep (SGLang ``cache_finished_req`` preamble)."""
    committed = req.pop_committed_kv_cache()
    token_ids = req.all_ids()[:committed]
    kv = pool.read(request_row(req), 0, len(token_ids))
    return token_ids, kv, paging.page_aligned_len(len(token_ids), page_size)


def fill_kv(pool: ReqToTokenPool, req: Req, page_size: int) -> tuple[int, np.ndarray, int]:
    """A running request's row, the slots of its ``fill_ids`` and their page-aligned length."""
    row = request_row(req)
    kv = pool.read(row, 0, len(req.fill_ids))
    return row, kv, paging.page_aligned_len(len(req.fill_ids), page_size)
