"""The node registry of a radix tree: its live nodes in id order, with incrementally rebuilt
node views and census owners.

Keeps: ``nodes`` holds exactly the nodes reachable from the root, in id (= creation) order —
what ``tree_util.all_nodes`` returns, without a walk or a sort. A cached ``NodeView`` or
``SlotOwner`` is rebuilt only for a node marked since the last call: the caches call ``touch``
when a node's own viewed fields change (key/value, parent, leaf state, tombstone), ``relock``
when its locks change (a view holds its node's own locks only, so its children's views
stay), ``add`` and ``remove`` when it joins or leaves the tree. An unchanged tree returns
the previous tuple; a changed one is a ``ChangedTuple`` (feed.py) that also names the tuple handed
out before it (``prior``), the views built since (``fresh``) and the views of ``prior`` it
no longer holds (``gone``): it is ``prior`` - ``gone`` + ``fresh``, every kept view the very
object ``prior`` held (what lets a checker re-test only the fresh views and update sums).
The change feed ``changes`` (engine/mem/feed.py) publishes, in order, the ids of nodes whose
census owner changed — a node added, removed, or holding other slots (a new value array, a
tombstone set or cleared) — so that an incremental census (engine/observe/) follows the
tree's ownership without walking it; an owner rebuilt for a node's links or locks alone is
the same owner and is not published.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Generic, cast

from engine.cache.base import SlotOwner
from engine.cache.tree_util import N, SWATreeNode, all_nodes, node_view
from engine.mem.feed import ChangedTuple, ChangeFeed
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
        self._owner_dirty: set[N] = set()
        self._tuple: tuple[NodeView, ...] | None = None
        self._handed: tuple[NodeView, ...] | None = None  # the last tuple views() returned
        self._fresh: list[NodeView] = []  # views built since then
        self._gone: list[NodeView] = []  # views of that tuple replaced or dropped since
        self.changes: ChangeFeed[list[int]] = ChangeFeed()  # ids of nodes whose owner changed

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
        old = self._views.pop(node.id)
        if old is not None:
            self._gone.append(old)
        del self.nodes[node.id]
        if self._owners.pop(node.id, None) is not None:
            self.changes.publish([node.id])
        self._dirty.discard(node)
        self._owner_dirty.discard(node)
        self._tuple = None

    def touch(self, node: N) -> None:
        self._dirty.add(node)
        if node is not self.root:
            self._owner_dirty.add(node)

    def relock(self, nodes: Iterable[N]) -> None:
        self._dirty.update(nodes)

    def all(self) -> list[N]:
        """Every live node, root first, in id order (= ``all_nodes(root)``)."""
        return list(self.nodes.values())

    def views(self) -> tuple[NodeView, ...]:
        """``node_view`` of every live node, in id order."""
        if self._dirty:
            views, root, attr = self._views, self.root, self.lock_attr
            for node in self._dirty:
                old = views.get(node.id)
                if old is not None:
                    self._gone.append(old)
                views[node.id] = view = node_view(node, node is root, attr)
                self._fresh.append(view)
            self._dirty.clear()
            self._tuple = None
        if self._tuple is None:
            self._tuple = ChangedTuple.of(
                cast("Iterable[NodeView]", self._views.values()),  # every view is built here
                self._handed,
                tuple(self._fresh),
                tuple(self._gone),
            )
            self._fresh.clear()
            self._gone.clear()
        self._handed = self._tuple
        return self._tuple

    def slot_owners(self) -> list[SlotOwner]:
        """One owner per non-root node, in id order (SWA: ``holds_swa`` = not a tombstone)."""
        self.sync_owners()
        return cast("list[SlotOwner]", list(self._owners.values()))  # every one is built

    def sync_owners(self) -> None:
        """Rebuild the owners of changed nodes, publishing the ids of those that changed."""
        if self._owner_dirty:
            owners, changed = self._owners, []
            for node in self._owner_dirty:
                # counted by value from here on (the incremental census keeps what it counted):
                # a later in-place write would go unseen, so it raises instead
                node.value.flags.writeable = False
                holds_swa = not node.swa_tombstone if isinstance(node, SWATreeNode) else True
                old = owners.get(node.id)
                if old is None or old.slots is not node.value or old.holds_swa != holds_swa:
                    owners[node.id] = SlotOwner(f"tree:n{node.id}", node.value, holds_swa)
                    changed.append(node.id)
            self._owner_dirty.clear()
            if changed:
                self.changes.publish(changed)

    def owner(self, node_id: int) -> SlotOwner | None:
        """The census owner of a live node as last built by ``slot_owners`` (None: gone)."""
        return self._owners.get(node_id)

    def from_scratch(self) -> tuple[tuple[NodeView, ...], list[SlotOwner]]:
        """The node views and census owners rebuilt from a walk of the tree, not from the
        marks (cross-check mode's oracle for ``views`` and ``slot_owners``)."""
        root = self.root
        if root is None:
            return (), []
        nodes = all_nodes(root)
        views = tuple(node_view(n, n is root, self.lock_attr) for n in nodes)
        owners = [
            SlotOwner(
                f"tree:n{n.id}", n.value, not (isinstance(n, SWATreeNode) and n.swa_tombstone)
            )
            for n in nodes
            if n is not root
        ]
        return views, owners
