"""Sessions as tags over the radix tree (SGLang ``--enable-session-radix-cache``, #27058 and
#29173, as 0.5.23 has them: ``unified_cache/session_ref_tracker.py``, ``components/base.py``
and ``components/full.py``).

Keeps: a session is a tag, never a lock — its KV stays ordinary evictable tree KV, so sessions
cannot wedge the pool. Each open session has frontier nodes (where a finished turn's insert
ended); a node's ``session_ref`` is the number of (session, frontier) pairs in its subtree,
so every change — a new frontier, a close, an evicted frontier, a split — moves counts along
one path. Eviction takes untagged leaves first, then the fewest refs, then LRU
(``eviction_priority``). A close drops the session's frontiers and remembers its id, so a
turn finishing after the close tags nothing; a turn created before a close and reopen holds
a stale generation and tags nothing either.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable, Iterable

from engine.cache.tree_util import TreeNode

CLOSED_SESSION_TOMBSTONE_LIMIT = 8192  # SGLang's bound on remembered closes


def eviction_priority(node: TreeNode) -> tuple[bool, int, int, int]:
    """Heap order of an evictable leaf: untagged first, fewest refs, least recently used."""
    return node.session_ref > 0, node.session_ref, node.last_access, node.id


class SessionRefs:
    """The frontier index of every open tagged session, and the generations that guard it."""

    def __init__(self, root: TreeNode, relock: Callable[[Iterable[TreeNode]], None]) -> None:
        self.root = root
        self._relock = relock  # a node's view shows its refs: rebuild it when they change
        self.frontiers: dict[str, dict[int, TreeNode]] = {}  # by node id: deterministic order
        self.generations: dict[str, int] = {}
        self.closed: OrderedDict[str, None] = OrderedDict()
        self._incarnations = itertools.count(1)

    # ---- open / close ----

    def open(self, session_id: str) -> int:
        """A new incarnation of ``session_id`` (an explicit open, or the first tagged turn)."""
        self.closed.pop(session_id, None)
        self.generations[session_id] = generation = next(self._incarnations)
        return generation

    def generation(self, session_id: str) -> int:
        """The current incarnation, opening one implicitly (a top-level ``session_id``)."""
        generation = self.generations.get(session_id)
        return self.open(session_id) if generation is None else generation

    def release(self, session_id: str) -> int:
        """Close: every frontier's pair leaves its path; returns how many frontiers it had."""
        if session_id in self.closed:
            return 0
        self.closed[session_id] = None
        while len(self.closed) > CLOSED_SESSION_TOMBSTONE_LIMIT:
            self.closed.popitem(last=False)
        self.generations.pop(session_id, None)
        leaves = list(self.frontiers.get(session_id, {}).values())
        for leaf in leaves:
            self._add_path(leaf, None, -1)
            self._unmark(session_id, leaf)
        return len(leaves)

    # ---- tree events ----

    def register(self, session_id: str, generation: int, leaf: TreeNode) -> None:
        """A finished turn's insert ended on ``leaf``: it becomes a frontier of the session,
        replacing the nearest frontier above it (the session moved on down that path)."""
        if session_id in self.closed or self.generations.get(session_id) != generation:
            return  # a turn that finished after its session closed (or was reopened)
        self._advance(session_id, leaf)

    def _advance(self, session_id: str, leaf: TreeNode) -> None:
        """``leaf`` becomes a frontier of the session (nothing if it is one, or the root)."""
        if leaf is self.root or leaf.id in self.frontiers.get(session_id, {}):
            return
        above = self._nearest_frontier_above(session_id, leaf)
        self._add_path(leaf, above, +1)
        self._mark(session_id, leaf)
        if above is not None:
            self._unmark(session_id, above)

    def discard(self, node: TreeNode) -> None:
        """``node`` is evicted: each session's pair on it moves up to its parent (or, when the
        parent is the root or already that session's frontier, leaves the tree)."""
        for session_id in sorted(node.session_ids or ()):
            fallback = node.parent if node.parent is not self.root else None
            if fallback is not None and fallback.id in self.frontiers[session_id]:
                fallback = None
            self._add_path(node, fallback, -1)
            self._unmark(session_id, node)
            if fallback is not None:
                self._mark(session_id, fallback)

    @staticmethod
    def split(upper: TreeNode, lower: TreeNode) -> None:
        """``upper`` was cut off the top of ``lower``: same subtree, so the same refs (the
        frontier marks stay on ``lower``, where the turns ended)."""
        upper.session_ref = lower.session_ref

    # ---- helpers ----

    def _nearest_frontier_above(self, session_id: str, leaf: TreeNode) -> TreeNode | None:
        mine, node = self.frontiers.get(session_id, {}), leaf.parent
        while node is not None and node is not self.root:
            if node.id in mine:
                return node
            node = node.parent
        return None

    def _add_path(self, node: TreeNode, stop: TreeNode | None, delta: int) -> None:
        """``delta`` on ``node`` and its ancestors, up to ``stop`` (or the root), exclusive;
        the views of the path and of the node above it (its children's sum) are rebuilt."""
        path = []
        while node is not self.root and node is not stop:
            node.session_ref += delta
            path.append(node)
            assert node.parent is not None
            node = node.parent
        self._relock([*path, node])

    def _mark(self, session_id: str, node: TreeNode) -> None:
        self.frontiers.setdefault(session_id, {})[node.id] = node
        node.session_ids = (node.session_ids or frozenset()) | {session_id}
        self._relock((node,))

    def _unmark(self, session_id: str, node: TreeNode) -> None:
        mine = self.frontiers[session_id]
        del mine[node.id]
        if not mine:
            del self.frontiers[session_id]
        node.session_ids = (node.session_ids or frozenset()) - {session_id} or None
        self._relock((node,))
