"""Session-radix slips (SGLang --enable-session-radix-cache, #27058/#29173; issue 18 item 3a):
each the fixed body of one ``SessionRefs`` method with one guard or one line taken out, the
ways the 0.5.23 tracker could go wrong (its ``validate_session_state`` names each symptom).

Keeps: each buggy body below is the fixed method with exactly one change (the comment on
each says which); nothing else differs.
"""

from __future__ import annotations

from engine.cache.session_refs import SessionRefs
from engine.cache.tree_util import TreeNode
from invariants.mutants.base import Mutant, ids, swap


def split_drops_refs(upper: TreeNode, lower: TreeNode) -> None:
    """The node cut off the top of a tagged node starts uncounted, though its subtree (the
    lower node and its frontiers) is the same: the path above counts pairs it no longer sees."""
    upper.session_ref = 0  # fix: = lower.session_ref


def evicted_frontier_forgotten(self: SessionRefs, node: TreeNode) -> None:
    """An evicted frontier leaves with its tags, but its pairs stay counted on every ancestor
    (SGLang's tracker would index an unreachable leaf)."""
    for session_id in sorted(node.session_ids or ()):
        self._unmark(session_id, node)  # fix: recede the path, re-mark the fallback


def late_turn_tags(self: SessionRefs, session_id: str, generation: int, leaf: TreeNode) -> None:
    """A turn that finishes after its session closed tags the tree again: the closed id is
    not remembered, so nothing ever releases the new tag."""
    # fix: if session_id in self.closed or self.generations.get(session_id) != generation: return
    self._advance(session_id, leaf)


def root_becomes_frontier(self: SessionRefs, session_id: str, leaf: TreeNode) -> None:
    """A turn whose insert cached nothing (shorter than a page: it ends at the root) makes the
    root a frontier of its session: the root is tagged and counts a pair no eviction can
    ever release."""
    if leaf.id in self.frontiers.get(session_id, {}):  # fix: leaf is self.root or ...
        return
    above = self._nearest_frontier_above(session_id, leaf)
    self._add_path(leaf, above, +1)
    self._mark(session_id, leaf)
    if above is not None:
        self._unmark(session_id, above)


MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "session-radix-split-drops-refs",
        "issue 18 item 3a (sglang#27058 split)",
        "a split's new upper node starts with session_ref 0 instead of its child's count",
        lambda: swap(SessionRefs, "split", staticmethod(split_drops_refs)),
        "session-radix-tags.yaml",
        ids("tree.session_ref_counts_frontiers"),
    ),
    Mutant(
        "session-radix-evicted-frontier-kept",
        "issue 18 item 3a (sglang#29173 discard_deleted_session_leaf)",
        "an evicted frontier's pairs stay counted on its ancestors",
        lambda: swap(SessionRefs, "discard", evicted_frontier_forgotten),
        "session-radix-tags.yaml",
        ids("tree.session_ref_counts_frontiers"),
    ),
    Mutant(
        "session-radix-late-turn-tags",
        "issue 18 item 3a (sglang#29173 closed-session tombstones)",
        "a turn finishing after its session closed tags the tree, and nothing releases it",
        lambda: swap(SessionRefs, "register", late_turn_tags),
        "session-radix-tags.yaml",
        ids("session.closed_tags_nothing"),
    ),
    Mutant(
        "session-radix-root-frontier",
        "issue 32 item 1 (a turn shorter than a page inserts nothing)",
        "a turn whose insert ends at the root makes the root its session's frontier",
        lambda: swap(SessionRefs, "_advance", root_becomes_frontier),
        "session-radix-root-frontier.yaml",
        ids("tree.session_tags_on_cached_nodes"),
    ),
)
