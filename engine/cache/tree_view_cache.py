"""The node registry of a radix tree: its live nodes in id order, with incrementally rebuilt
node views and census owners.

Keeps: ``nodes`` holds exactly the nodes reachable from the root, in id (= creation) order —
what ``tree_util.all_nodes`` returns, without a walk or a sort. A cached ``NodeView`` or
``SlotOwner`` is rebuilt only for a node marked since the last call: the caches call ``touch``
when a node's own viewed fields change (key/value, parent, leaf state, tombstone), ``relock``
when its locks change (its children's ``parent_*lock_ref`` change with them), ``add`` and
``remove`` when it joins or leaves the tree. An unchanged tree returns the previous tuple.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Generic

from engine.cache.base import SlotOwner
from engine.cache.tree_util import N, node_view
from engine.view import NodeView


class NodeRegistry(Generic[N]):
    """Live nodes by id, plus their cached views; ``lock_attr`` names the full lock."""

    def __init__(self, lock_attr: str, swa: bool) -> None:
        self.lock_attr, self.swa = lock_attr, swa
        self.root: N | None = None  # the first node added
        self.nodes: dict[int, N] = {}
        self._views: dict[int, NodeView | None] = {}
        self._owners: dict[int, SlotOwner | None] = {}
        self._dirty: set[N] = set()  # views to rebuild
        self._relocked: set[N] = set()  # nodes whose children's views read a changed lock
        self._owner_dirty: set[N] = set()
        self._tuple: tuple[NodeView, ...] | None = None

    def add(self, node: N) -> None:
        if self.root is None:
            self.root = node
        self.nodes[node.id] = node
        self._views[node.id] = None
        self._dirty.add(node)
        if node is not self.root:
            self._owners[node.id] = None
            self._owner_dirty.add(node)

    def unlink(self, node: N) -> None:
        """``node`` left the tree; its parent (still linked) may have become a leaf."""
        assert node.parent is not None
        self.remove(node)
        self.touch(node.parent)

    def remove(self, node: N) -> None:
        del self.nodes[node.id], self._views[node.id]
        self._owners.pop(node.id, None)
        self._dirty.discard(node)
        self._relocked.discard(node)
        self._owner_dirty.discard(node)
        self._tuple = None

    def touch(self, node: N) -> None:
        self._dirty.add(node)
        if node is not self.root:
            self._owner_dirty.add(node)

    def relock(self, nodes: Iterable[N]) -> None:
        self._dirty.update(nodes)
        self._relocked.update(nodes)

    def all(self) -> list[N]:
        """Every live node, root first, in id order (= ``all_nodes(root)``)."""
        return list(self.nodes.values())

    def views(self) -> tuple[NodeView, ...]:
        """``node_view`` of every live node, in id order."""
        if self._relocked:
            for node in self._relocked:
                self._dirty.update(node.children.values())
            self._relocked.clear()
        if self._dirty:
            views, root, attr = self._views, self.root, self.lock_attr
            for node in self._dirty:
                views[node.id] = node_view(node, node is root, attr)
            self._dirty.clear()
            self._tuple = None
        if self._tuple is None:
            self._tuple = tuple(self._views.values())  # type: ignore[arg-type]
        return self._tuple

    def slot_owners(self) -> list[SlotOwner]:
        """One owner per non-root node, in id order (SWA: ``holds_swa`` = not a tombstone)."""
        if self._owner_dirty:
            owners = self._owners
            for node in self._owner_dirty:
                if self.swa:
                    owners[node.id] = SlotOwner(f"tree:n{node.id}", node.value, not node.swa_tombstone)
                else:
                    owners[node.id] = SlotOwner(f"tree:n{node.id}", node.value)
            self._owner_dirty.clear()
        return list(self._owners.values())  # type: ignore[arg-type]
