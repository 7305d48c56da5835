"""The census of one KV pool kept across views: the tree's ownership and the free list are
followed by their changes; so are the request rows at page size 1 (``census_rows.py``:
only the positions written or re-spanned since are recounted), else they are recounted
every time.

Keeps, in the ledger of ``census_kernels.py``, for pages ``0..num_pages``, exactly as a
from-scratch count would give them: per page the tree + free-list entries (``occupancy``:
a tree entry is one holding of a page by a node — ``census.holding_mask``'s entries, so a
node holding a page twice, in two runs or in a run longer than a page, gives it two
entries; at page size 1 every slot is an entry), the free-list entries (``free_count``),
at page size 1 the row-owned and row-read entries, their totals, and which pages are
blocked (named by a census from scratch: see census_kernels.py). ``take`` answers a census:

    clean fast path   no page blocked, and tree + free + row-owned entries = num_pages (page
                      size 1; above it the rows are checked from scratch against the kept
                      counts: their owned entries distinct, in range and unoccupied, no page
                      they read free). Then every census set is empty: no duplicate (every
                      page held at most once), no dangling page (owned or read pages are not
                      free), no free repeat, and no orphan (three disjoint sets of pages in
                      1..num_pages whose sizes add up to num_pages cover it).
    anything else     the from-scratch ``take_census`` (the oracle) over the same owners,
                      so a broken state gets exactly its witnesses.

How the counts follow the state — each component publishes what it changed (a change feed,
engine/mem/feed.py), and a lost log recounts from scratch, O(pool):
- tree: the node registry publishes the ids of nodes whose owner changed (added, removed,
  other slots); the pages counted for each are subtracted, its owner's pages added. A lost
  log (it overflowed) recounts everything.
- free list: the allocator publishes every page taken and every page returned, in order
  (a merge publishes nothing: the free set is unchanged); a lost log (a ``clear``, an
  overflow) recounts the free list, the tree's counts kept.
- rows (page size 1): ``RowCounts`` moves the rows' entries in the same ledger, from the
  request table's published writes, so a page's flag always reflects the tree, the free
  list and the rows together.
- an id outside ``1..num_pages`` or a count below zero makes every census from scratch
  until the next recount finds the state in range.
tests/engine/observe/test_incremental_census.py checks ``take`` against ``take_census`` after
every operation of random runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from engine.cache.base import PrefixCache, SlotOwner
from engine.cache.tree_view_cache import NodeRegistry
from engine.mem.allocator import PagedAllocator
from engine.mem.feed import ChangeLog
from engine.mem.req_to_token import ReqToTokenPool
from engine.observe.census import PageRefs, holding_mask, take_census
from engine.observe.census_kernels import (
    BLOCKED,
    FREE,
    FREE_ENTRIES,
    OCCUPANCY,
    OK,
    OWNED_ENTRIES,
    TREE_ENTRIES,
    apply_pages,
    new_ledger,
    recount_free,
)
from engine.observe.census_rows import RowCounts, RowSpan
from engine.view import Census

SMALL = 16  # fewer rows than this are sliced one by one (page size above 1: fewer numpy calls)
Signed = tuple[np.ndarray, int]  # pages, and +1 (now counted) or -1 (no longer)


class IncrementalCensus:
    """Census of a non-SWA pool; the cache's tree owners are followed through its node
    registry (a cache without one must have no owners, else every census is from scratch)."""

    def __init__(
        self, allocator: PagedAllocator, cache: PrefixCache, pool: ReqToTokenPool | None = None
    ) -> None:
        self.alloc, self.cache = allocator, cache
        self.registry, self._tree_log = self._subscribe_tree()
        self._free_log = allocator.changes.subscribe()
        self.ps, self.num_pages = allocator.page_size, allocator.num_pages
        self.ledger = self.counts, self.blocked, self.totals = new_ledger(self.num_pages)
        # page size 1 with the rows' table: the rows' counts are kept too (census_rows.py)
        self.rows = (
            RowCounts(pool, self.num_pages, self.ledger)
            if pool is not None and self.ps == 1
            else None
        )
        self._stale = True  # recount everything at the next census
        self._clean_census = Census(num_pages=self.num_pages)  # frozen: one serves every clean view
        self._scratch = np.zeros(self.num_pages + 1, dtype=np.int64)

    @property
    def occupancy(self) -> np.ndarray:
        return self.counts[OCCUPANCY]

    @property
    def free_count(self) -> np.ndarray:
        return self.counts[FREE]

    @property
    def tree_entries(self) -> int:
        return int(self.totals[TREE_ENTRIES])

    @property
    def free_entries(self) -> int:
        return int(self.totals[FREE_ENTRIES])

    def take(
        self, table: np.ndarray, rows: Sequence[RowSpan], labels: Callable[[], list[str]]
    ) -> Census:
        """The census of the pool with these live rows (``table``: request → token);
        ``labels`` names the rows (called only to name the owners of a broken state)."""
        if self._registry() is not self.registry:  # the cache was reset with a new tree
            self.registry, self._tree_log = self._subscribe_tree()
            self._stale = True
        if not self._stale:
            self._follow()
        if self._stale:
            self._recount()
        if self.rows is not None:
            clean = self.rows.update(rows) and self._balanced()
        else:
            clean = self._clean(*self._row_pages(table, rows))
        return self._clean_census if clean else self._from_scratch(table, rows, labels())

    # ---- the fast path's test ----

    def _balanced(self) -> bool:
        """No page blocked, and every page counted once (the rows' entries kept too)."""
        totals = self.totals
        return (
            not self._stale
            and not totals[BLOCKED]
            and int(totals[TREE_ENTRIES] + totals[FREE_ENTRIES] + totals[OWNED_ENTRIES])
            == self.num_pages
        )

    def _clean(self, own: np.ndarray, ref: np.ndarray) -> bool:
        if self._stale or self.totals[BLOCKED]:
            return False
        n = self.num_pages
        # a row's owned pages are a part of the pages it reads: one range test covers both
        if len(ref) and (int(ref.min()) < 1 or int(ref.max()) > n):
            return False
        marks, order = self._scratch, np.arange(len(own))
        marks[own] = order  # a page listed twice keeps only its last position
        if (marks[own] != order).any() or self.occupancy[own].any() or self.free_count[ref].any():
            return False
        return self.tree_entries + self.free_entries + len(own) == n

    def _row_pages(
        self, table: np.ndarray, rows: Sequence[RowSpan]
    ) -> tuple[np.ndarray, np.ndarray]:
        """Every row's owned pages (one entry per holding, ``holding_mask``) and read pages."""
        spans = _row_block(table, rows) if len(rows) >= SMALL else None
        if spans is None:
            owned = [table[row, start:end] for row, start, end in rows]
            read = [table[row, :end] for row, _, end in rows]
            own = np.concatenate(owned).astype(np.int64) if owned else np.empty(0, np.int64)
            ref = np.concatenate(read).astype(np.int64) if read else np.empty(0, np.int64)
            lengths = [len(part) for part in owned]
        else:
            own, ref, lengths = spans
        if self.ps > 1:
            own, ref = own // self.ps, ref // self.ps
            own = own[holding_mask(own, self.ps, np.cumsum([0, *lengths[:-1]]))]
        return own, ref

    def _from_scratch(
        self, table: np.ndarray, rows: Sequence[RowSpan], labels: list[str]
    ) -> Census:
        ps = self.ps
        owned: list[PageRefs] = [
            (label, table[row, start:end].astype(np.int64) // ps)
            for label, (row, start, end) in zip(labels, rows)
        ]
        referenced: list[PageRefs] = [
            (label, table[row, :end].astype(np.int64) // ps)
            for label, (row, _, end) in zip(labels, rows)
        ]
        owned += [(o.label, o.slots // ps) for o in self._tree_owners()]
        return take_census(
            self.num_pages, self.alloc.all_free_pages(), owned, referenced, slots_per_page=ps
        )

    # ---- following the tree and the free list ----

    def _follow(self) -> None:
        """Apply the changes the tree and the free list published since the last census;
        what cannot be followed is recounted (the free list alone when its log was lost;
        everything when the tree's was)."""
        tree = self._tree_changes()
        if tree is None:
            self._stale = True
            return
        free, free_lost = self._free_log.take()
        for changes, is_free in ((tree, False), ([] if free_lost else free, True)):
            for pages, sign in changes:
                if apply_pages(pages, sign, is_free, self.ledger) != OK:
                    self._stale = True  # an id out of range, or a count below zero
                    return
        if free_lost:
            self._recount_free()

    def _tree_changes(self) -> list[Signed] | None:
        """(pages, -1) for the old pages and (pages, +1) for the new of each node whose owner
        the registry published; None when they cannot be followed."""
        if self.registry is None or self._tree_log is None:
            return None if self._tree_owners() else []
        self.registry.sync_owners()  # rebuild changed owners (publishing them)
        published, lost = self._tree_log.take()
        if lost:
            return None
        changes: list[Signed] = []
        for node_id in dict.fromkeys(i for ids in published for i in ids):
            old = self._tree_pages.pop(node_id, None)
            if old is not None:
                changes.append((old, -1))
            owner = self.registry.owner(node_id)
            if owner is not None:
                self._tree_pages[node_id] = new = self._distinct(owner)
                changes.append((new, 1))
        return changes

    def _recount(self) -> None:
        """Count the tree and the free list from scratch (the rows' counts kept); stale if an
        id is out of range."""
        n, self._stale = self.num_pages, False
        self._tree_pages: dict[int, np.ndarray] = {}
        owners = self._tree_owners()  # first: it may publish owner changes
        if self._tree_log is not None:
            self._tree_log.take()  # what it holds is counted now
        if self.registry is not None:
            for node_id in self.registry.nodes:
                owner = self.registry.owner(node_id)
                if owner is not None:
                    self._tree_pages[node_id] = self._distinct(owner)
        pages = (
            [*self._tree_pages.values()]
            if self.registry is not None
            else [self._distinct(o) for o in owners]
        )
        tree = np.concatenate(pages) if pages else np.empty(0, np.int64)
        if len(tree) and (int(tree.min()) < 1 or int(tree.max()) > n):
            self._stale = True  # page 0 is reserved; ids past the pool are out of range
            return
        self._stale = self.registry is None and bool(owners)  # tree owners it cannot follow
        self.counts[OCCUPANCY] = np.bincount(tree, minlength=n + 1)
        self.counts[FREE] = 0
        self.totals[TREE_ENTRIES], self.totals[FREE_ENTRIES] = len(tree), 0
        self._recount_free()

    def _recount_free(self) -> None:
        """Count the free list from scratch (the tree's and rows' counts kept); stale if an
        id is out of range."""
        self._free_log.take()  # what it holds is counted now
        free = self.alloc.all_free_pages().astype(np.int64, copy=False)
        if not recount_free(self.ledger, free):
            self._stale = True

    def _registry(self) -> NodeRegistry | None:
        registry = getattr(self.cache, "node_registry", None)
        return registry() if registry is not None else None

    def _subscribe_tree(self) -> tuple[NodeRegistry | None, ChangeLog[list[int]] | None]:
        registry = self._registry()
        return registry, None if registry is None else registry.changes.subscribe()

    def _tree_owners(self) -> list[SlotOwner]:
        return (
            self.registry.slot_owners()
            if self.registry is not None
            else list(self.cache.slot_owners())
        )

    def _distinct(self, owner: SlotOwner) -> np.ndarray:
        """An owner's entries (``holding_mask``): each page it holds once in a clean state, a
        page it holds twice twice — which blocks it (a census from scratch). A copy, or at
        page size 1 the owner's own array when it is frozen: read-only and owning its data
        (tree_view_cache.py freezes node values when it builds their owners), so nothing can
        change what was counted."""
        if self.ps == 1:
            slots = owner.slots
            frozen = (
                isinstance(slots, np.ndarray) and slots.base is None and not slots.flags.writeable
            )
            return (
                slots
                if frozen and slots.dtype == np.int64 and slots.ndim == 1
                else np.array(slots, dtype=np.int64)
            )
        pages = np.asarray(owner.slots, dtype=np.int64) // self.ps
        return pages[holding_mask(pages, self.ps, np.zeros(1, np.int64))]


def _row_block(
    table: np.ndarray, rows: Sequence[RowSpan]
) -> tuple[np.ndarray, np.ndarray, list[int]] | None:
    """``table[row, start:end]`` and ``table[row, :end]`` of every row, concatenated in row
    order, from one gather and two masks (and the owned lengths); None where the slices
    would not be these masks (a negative bound) or the block would be mostly padding."""
    spans = np.array(rows, dtype=np.int64).reshape(-1, 3)
    rows_at, start, end = spans.T
    if int(spans.min()) < 0 or int(end.max()) * len(rows) > 4 * int(end.sum()) + 4096:
        return None
    cols = np.arange(min(int(end.max()), table.shape[1]))
    block = table[rows_at, : len(cols)]
    read = cols < end[:, None]
    owned = read & (cols >= start[:, None])
    return block[owned].astype(np.int64), block[read].astype(np.int64), owned.sum(axis=1).tolist()
