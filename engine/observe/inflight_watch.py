"""When a launched batch's read may have lost its slot: the exact check (inflight.py) runs only
then, so a view where nothing an in-flight read names was freed or re-pointed costs a few
array lookups, not a walk over every read.

The full pool: the entries the in-flight reads name through the rows as they are now — per
row ``[0, E)``, ``E`` the furthest end of a kept read of it — are counted per slot as the
census counts rows (census_rows.py: only what was written or re-spanned since is recounted),
in a ledger that also counts the free list's slots (followed by the allocator's change feed).
A slot both read and free flags itself (census_kernels.py), so no flag is exactly "no counted
entry names a free slot", and a flag is confirmed by the exact check. Counting more than the
kept reads is only slower: a launch adds its reads, a row given back (its results are dropped)
leaves, and only a flag recounts the rows from the batches still in flight — so a batch
processed, or a request finished, costs nothing until then. The SWA pool (reads go through the
full-to-SWA map, which the table's feed does not follow): each kept read's SWA slots are
counted (swa_watch.py); a release of a counted slot, or a write below a counted row's end,
may have lost one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
from numba import njit

from engine.mem.allocator import PagedAllocator, SWAAllocator
from engine.memory import KVMemory
from engine.observe.census_kernels import BLOCKED, OK, apply_pages, recount_free
from engine.observe.census_rows import RowCounts
from engine.observe.swa_watch import SWAWatch, WatchedBatch, slots_of
from engine.request import Req

NO_SPANS = np.zeros((0, 3), np.int64)
NONE = np.zeros(0, np.int64)


def is_kept(req: Req, row: int) -> bool:
    """Whether a launched batch's result for ``req`` will be used: still live on ``row``."""
    return req.finished_reason is None and not req.is_retracted and req.req_pool_idx == row


class ReadWatch:
    """Follows one memory's changes on behalf of the launched batches' reads."""

    def __init__(self, mem: KVMemory) -> None:
        alloc = mem.allocator
        self.full: PagedAllocator = alloc.full if isinstance(alloc, SWAAllocator) else alloc
        self.table = mem.req_to_token_pool.req_to_token
        self.ps = self.full.page_size
        self.rows = RowCounts(mem.req_to_token_pool, self.full.size + self.ps - 1)
        self.free_log = self.full.changes.subscribe()
        self.row_frees = mem.req_to_token_pool.freed.subscribe()
        self.row_frees.take()  # (a row freed before now has no read here)
        self.swa = SWAWatch(alloc, self.table) if isinstance(alloc, SWAAllocator) else None
        self.furthest = np.zeros(len(self.table), np.int64)  # per row, the end counted
        self.spans = self._counted_spans = NO_SPANS
        self.dirty = NONE  # per row, the first position written before the last follow

    def may_have_lost(self, batches: Sequence[WatchedBatch], launched: WatchedBatch | None) -> bool:
        """Whether a kept read of ``batches`` (``launched``: the one followed since the last
        call) may name a gone slot now; True when unsure."""
        old_spans = self.spans
        self._follow_batches(batches, launched)
        swa_released = None if self.swa is None else self.swa.released()
        if not self._follow():
            return True
        if self.swa is not None and _written_below(self.dirty, old_spans):
            self.swa.recount_written(self.dirty)  # re-pointed under an SWA read: the map moved
            return True
        if not self._flagged(swa_released):
            return False
        for batch in batches:  # re-read which reads are kept, count only those, ask again
            self._drop(batch, _dropped(batch))
        self.furthest[:] = 0
        self._add(batches)
        return not self._follow() or self._flagged(swa_released)

    def _follow_batches(
        self, batches: Sequence[WatchedBatch], launched: WatchedBatch | None
    ) -> None:
        """Count the launched batch's reads; uncount the rows given back (and their reads)."""
        freed, lost = self.row_frees.take()
        if lost:  # (unbounded in practice: then recount from the batches)
            self.furthest[:] = 0
            freed, launched = [], None
            self._add(batches)
        if freed:  # given back before ``launched`` was: its reads are another request's
            rows = np.zeros(len(self.table), bool)
            rows[freed] = True
            for batch in [b for b in batches if b is not launched]:
                self._drop(batch, np.flatnonzero(batch.kept & rows[batch.rows]).tolist())
            self.furthest[rows] = 0
        if freed or launched is not None:
            self._add([] if launched is None else [launched])
        if self.swa is not None:
            self.swa.follow(batches)

    def _add(self, batches: Iterable[WatchedBatch]) -> None:
        for batch in batches:
            _raise_to(self.furthest, batch.rows, batch.ends, batch.kept)
        self.spans = _spans(self.furthest)

    def _drop(self, batch: WatchedBatch, reads: list[int]) -> None:
        """No longer count these reads of ``batch``: their results are dropped."""
        if reads:
            if self.swa is not None:
                self.swa.drop(batch, reads)
            batch.kept[reads] = False

    def _flagged(self, swa_released: np.ndarray | None) -> bool:
        if self.rows.ledger[2][BLOCKED]:
            return True
        return self.swa is not None and self.swa.hit(swa_released)

    def _follow(self) -> bool:
        """Bring the free slots' and the rows' counts up to now (False: they cannot be)."""
        changes, lost = self.free_log.take()
        if lost and not self._recount_free():
            return False
        for pages, sign in [] if lost else changes:
            if apply_pages(slots_of(pages, self.ps), sign, True, self.rows.ledger) != OK:
                self.free_log.lost = True  # recounted at the next call
                return False
        if self.spans is self._counted_spans and not self.rows.written_where_counted():
            self.dirty = NONE
            return True  # the same rows, none written where counted: the counts stand
        self._counted_spans = self.spans
        counted = self.rows.update(self.spans)
        self.dirty = self.rows.dirty
        return counted

    def _recount_free(self) -> bool:
        free = slots_of(self.full.all_free_pages().astype(np.int64, copy=False), self.ps)
        return recount_free(self.rows.ledger, free)


@njit(cache=True)
def _raise_to(furthest: np.ndarray, rows: np.ndarray, ends: np.ndarray, kept: np.ndarray) -> None:
    for i in range(len(rows)):
        if kept[i]:
            furthest[rows[i]] = max(furthest[rows[i]], ends[i])


@njit(cache=True)
def _spans(furthest: np.ndarray) -> np.ndarray:
    """``(row, E, E)`` for each row with ``E = furthest[row] > 0``: ``[0, E)`` read, none owned."""
    listed = np.flatnonzero(furthest)
    out = np.empty((len(listed), 3), np.int64)
    for j in range(len(listed)):
        out[j, 0], out[j, 1], out[j, 2] = listed[j], furthest[listed[j]], furthest[listed[j]]
    return out


def _dropped(batch: WatchedBatch) -> list[int]:
    """The reads of ``batch`` counted as kept whose result is dropped now (``is_kept``)."""
    rows, reqs = batch.rows.tolist(), batch.reqs
    return [i for i in np.flatnonzero(batch.kept).tolist() if not is_kept(reqs[i], rows[i])]


def _written_below(dirty: np.ndarray, spans: np.ndarray) -> bool:
    """Whether a counted row was written below its counted end since the last update."""
    return bool(len(spans) and len(dirty) and np.any(dirty[spans[:, 0]] < spans[:, 2]))


__all__ = ["ReadWatch", "is_kept"]
