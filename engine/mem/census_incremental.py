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

How the counts follow the state (each fallback below recounts from scratch, O(pool)):
- tree: the node registry's ``owner_log`` names every node whose owner was rebuilt or
  dropped since the last census; the old pages of each are subtracted, the new added (none
  of either when the owner holds the very frozen array counted: ``_distinct``).
- free list: ``free_pages`` only ever shrinks from the front by slicing (same buffer, same
  end; its arrays are read-only) and ``release_pages`` only grows by appending (the
  allocator never assigns into it); any other change seen — a merge, a clear, a replaced
  list, a different last entry — recounts the free list (the tree's counts are kept).
- rows (page size 1): ``RowCounts`` moves the rows' entries in the same ledger, so a page's
  flag always reflects the tree, the free list and the rows together.
- an id outside ``1..num_pages`` or a count below zero makes every census from scratch
  until the next recount finds the state in range.
tests/engine/mem/test_incremental_census.py checks ``take`` against ``take_census`` after
every operation of random runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from engine.cache.base import PrefixCache, SlotOwner
from engine.cache.tree_view_cache import NodeRegistry
from engine.mem.allocator import PagedAllocator
from engine.mem.census import PageRefs, holding_mask, take_census
from engine.mem.census_kernels import (
    BLOCKED,
    FREE,
    FREE_ENTRIES,
    OCCUPANCY,
    OK,
    OWNED_ENTRIES,
    TREE_ENTRIES,
    apply_pages,
    new_ledger,
    retally,
)
from engine.mem.census_rows import RowCounts, RowSpan
from engine.mem.req_to_token import ReqToTokenPool
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
        self.registry = self._registry()
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
        registry = self._registry()
        if registry is not self.registry:  # the cache was reset with a new tree
            self.registry, self._stale = registry, True
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
        """Apply the changes since the last census; what cannot be followed is recounted
        (the free list alone after a merge; everything when the tree cannot be followed)."""
        tree = self._tree_changes()
        if tree is None:
            self._stale = True
            return
        free = self._free_changes()
        for changes, is_free in ((tree, False), (free or [], True)):
            for pages, sign in changes:
                if apply_pages(pages, sign, is_free, self.ledger) != OK:
                    self._stale = True  # an id out of range, or a count below zero
                    return
        if free is None:
            self._recount_free()

    def _tree_changes(self) -> list[Signed] | None:
        """(pages, -1) for the old pages and (pages, +1) for the new of each changed node."""
        if self.registry is None:
            return None if self._tree_owners() else []
        self.registry.sync_owners()  # rebuild changed owners (into the log)
        log = self.registry.owner_log
        if log is not self._log or len(log) < self._log_at:
            return None
        ids, self._log_at = dict.fromkeys(log[self._log_at :]), len(log)
        changes: list[Signed] = []
        for node_id in ids:
            owner = self.registry.owner(node_id)
            if owner is not None and self._tree_pages.get(node_id) is owner.slots:
                continue  # rebuilt for its links or locks: the very (frozen) array counted
            old = self._tree_pages.pop(node_id, None)
            if old is not None:
                changes.append((old, -1))
            if owner is not None:
                self._tree_pages[node_id] = new = self._distinct(owner)
                changes.append((new, 1))
        return changes

    def _free_changes(self) -> list[Signed] | None:
        """(pages, -1) for the pages taken off the free list, (pages, +1) for those released."""
        alloc, old = self.alloc, self._free_head
        head, released = alloc.free_pages, alloc.release_pages
        if released is not self._released or len(released) < self._released_at:
            return None
        if self._released_at and released[self._released_at - 1] is not self._released_last:
            return None  # the list was rewritten in place
        taken = _taken_front(old, head)
        if taken is None:
            return None
        fresh = released[self._released_at :]
        self._free_head, self._released_at = head, len(released)
        self._released_last = released[-1] if released else None
        return [(taken, -1)] * bool(len(taken)) + [
            (pages.astype(np.int64, copy=False), 1) for pages in fresh
        ]

    def _recount(self) -> None:
        """Count the tree and the free list from scratch (the rows' counts kept); stale if an
        id is out of range."""
        n, self._stale = self.num_pages, False
        self._tree_pages: dict[int, np.ndarray] = {}
        owners = self._tree_owners()  # first: it may log (or replace the log)
        self._log = self.registry.owner_log if self.registry is not None else None
        self._log_at = len(self._log) if self._log is not None else 0
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
        free = self.alloc.all_free_pages().astype(np.int64, copy=False)
        self._free_head, self._released = self.alloc.free_pages, self.alloc.release_pages
        self._released_at = len(self._released)
        self._released_last = self._released[-1] if self._released else None
        if len(free) and (int(free.min()) < 1 or int(free.max()) > self.num_pages):
            self._stale = True
            return
        self.counts[OCCUPANCY] -= self.counts[FREE]
        self.counts[FREE] = np.bincount(free, minlength=self.num_pages + 1)
        self.counts[OCCUPANCY] += self.counts[FREE]
        self.totals[FREE_ENTRIES] = len(free)
        retally(self.ledger)

    def _registry(self) -> NodeRegistry | None:
        registry = getattr(self.cache, "node_registry", None)
        return registry() if registry is not None else None

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
        change it — and seeing it again, by identity, means the node's slots are unchanged."""
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


def _taken_front(old: np.ndarray, new: np.ndarray) -> np.ndarray | None:
    """The pages sliced off the front of ``old`` to leave ``new`` (same buffer, same end);
    None when ``new`` is not such a slice."""
    if new is old:
        return old[:0]
    if (old.base is None and new.base is not old) or (
        old.base is not None and new.base is not old.base
    ):
        return None
    if old.dtype != new.dtype or not (old.flags.c_contiguous and new.flags.c_contiguous):
        return None
    start_old, start_new = old.__array_interface__["data"][0], new.__array_interface__["data"][0]
    if start_new + new.nbytes != start_old + old.nbytes or start_new < start_old:
        return None
    return old[: (start_new - start_old) // old.itemsize]


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
