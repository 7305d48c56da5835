"""The request rows' part of a page-size-1 census, kept across censuses: per page, how many
row entries own it and how many rows read it, recounted only where rows changed.

Keeps, for the live rows of the last ``update`` (each ``(row, owned from, allocated)``):
``own_count[p]`` = the entries of ``table[row, start:end]`` equal to ``p`` over the rows,
``read_count[p]`` = those of ``table[row, :end]``, ``own_entries`` = Σ own_count — exactly
what counting every row from scratch gives. ``shadow`` holds each counted row's contents
as they were counted (what is subtracted when they change).

Why recounting only part of each row is exact: the table is written only through
``ReqToTokenPool.write``/``write_points`` (``req_to_token`` is read-only), which tell
this census's ``WriteTracker`` the first position written per row (a new table — ``widen``
— is recounted). For a row counted as ``[s0, e0)`` and now ``[s1, e1)``, first written at
``d`` since, positions below ``P = min(d, e0, e1)`` hold
what was counted and are read both times; owned positions in ``[max(s0, s1), P)`` are owned
both times. So the old counts lose ``[P, e0)`` (reads) and ``[s0, e0)`` minus the stable
owned range, and gain ``[P, e1)`` and ``[s1, e1)`` minus it — read from the table and
copied into ``shadow``. A row no longer live loses all it counted; a new row (or one freed
and handed out again: its writes start at 0) gains all. Up to ``SMALL_ROWS`` rows the same
arithmetic runs row by row for what a scheduler step does — rows new, gone, grown,
rewritten from ``P``, their start moved up (``s1 >= s0``, ``e1 >= e0``: then the stable
owned range is ``[s1, P)``) — with the rows a decode step grows by one slot counted in one
gather; anything else takes the array passes.

``update`` answers None — the caller then takes the census from scratch — when the rows
cannot be kept by row (a row listed twice, a span outside the table) or a value is outside
``1..num_pages``; the counts then recount from scratch at the next update.
tests/engine/mem/test_census_rows.py checks the counts against a recount after random
writes and span changes; tests/engine/mem/test_incremental_census.py the whole census.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain

import numpy as np

from engine.mem.req_to_token import ReqToTokenPool

RowSpan = tuple[int, int, int]  # (row, owned from, allocated): the row reads [0, allocated)
ALL_PAGES = np.empty(0, np.int64)  # ``update``'s answer after a recount: every page changed
# at most this many rows: a step's changes are counted row by row (measured: faster up to
# about 80 rows on the bench's workloads; the array passes' cost barely grows with the rows)
SMALL_ROWS = 64


class RowCounts:
    """The row entries per page of a page-size-1 pool of ``num_pages`` pages."""

    def __init__(self, pool: ReqToTokenPool, num_pages: int) -> None:
        self.pool, self.num_pages = pool, num_pages
        self.writes = pool.track_writes()
        self._table: np.ndarray | None = None  # the table counted (None: recount)
        # per table row, the span counted (plain lists: the row-by-row path reads them)
        self.start: list[int] = []
        self.end: list[int] = []
        self._listed: set[int] = set()  # the rows of the last update (every row counted)

    def update(self, rows: Sequence[RowSpan] | np.ndarray) -> np.ndarray | None:
        """Bring the counts to these rows (each (row, owned from, allocated)); the pages whose
        counts changed (``ALL_PAGES``, by identity, after a recount), or None when the rows
        cannot be counted (census from scratch)."""
        dirty, table = self.writes.take(), self.pool.req_to_token
        if self._table is table and len(rows) <= SMALL_ROWS:
            changed = self._follow_by_row(table, rows.tolist() if isinstance(rows, np.ndarray) else rows, dirty)
            if changed is not None:
                return changed
        spans = _as_spans(rows)
        live = _live_rows(spans, table.shape)
        if live is None:
            self._table = None
            return None
        recount = self._table is not table
        counted = (np.zeros(len(table), np.int64), np.zeros(len(table), np.int64)) if recount else (
            np.array(self.start, np.int64), np.array(self.end, np.int64))
        changed = (self._recount(table, spans, counted) if recount
                   else self._follow(table, spans, live, dirty, counted))
        self.start, self.end = counted[0].tolist(), counted[1].tolist()
        self._listed = set(spans[:, 0].tolist())
        if changed is None:
            self._table = None
        return changed

    def _follow_by_row(self, table: np.ndarray, spans: Sequence[RowSpan], dirty: np.ndarray) -> np.ndarray | None:
        """``_follow`` one row at a time for the changes a scheduler step makes — a row new,
        gone, or grown (its end not shrunk, its start moved up at most: a prefix published
        to the tree, rewritten from ``P`` = min(first position written, old end) on) — with
        the rows grown by one slot (a decode step's) counted in one gather. None, with
        nothing changed, otherwise."""
        plan = self._plan_by_row(table, spans, dirty.tolist())
        if plan is None:
            return None
        listed, grown, rows = plan
        changed = [self._drop(row) for row in self._listed - listed]
        for row, s0, e0, s1, e1, p, new in rows:
            if p < e0:  # rewritten from p: what was counted there goes
                changed.append(self._take(self.read_count, self.shadow[row, p:e0]))
                self._take(self.own_count, self.shadow[row, max(s0, p):e0])
            if s1 > s0:  # a prefix below p the row no longer owns: [s0, min(s1, p))
                changed.append(self._take(self.own_count, self.shadow[row, s0:min(s1, p)]))
            self.shadow[row, p:e1] = new
            np.add.at(self.read_count, new, 1)
            owned = new[max(s1 - p, 0):]
            np.add.at(self.own_count, owned, 1)
            self.own_entries += len(owned)
            changed.append(new)
            self.start[row], self.end[row] = s1, e1
        if grown is not None:
            changed.append(self._count_grown(*grown))
        self._listed = listed
        return np.concatenate(changed) if changed else _NONE

    def _plan_by_row(self, table: np.ndarray, spans: Sequence[RowSpan], dirty: list[int]) -> ByRowPlan | None:
        """The rows listed; the rows grown by one slot (rows, positions, their slots); and per
        other changed row (row, s0, e0, s1, e1, P, the reads from P on) — if
        ``_follow_by_row`` can count them. Reads only."""
        start, end, n = self.start, self.end, self.num_pages
        height, width = table.shape
        listed: set[int] = set()
        grow_rows: list[int] = []
        grow_at: list[int] = []
        rows: list[tuple[int, int, int, int, int, int, np.ndarray]] = []
        for row, s1, e1 in spans:
            if not (0 <= row < height and 0 <= s1 <= e1 <= width) or row in listed:
                return None  # a span outside the table, or a row listed twice
            listed.add(row)
            e0 = end[row]
            s0 = start[row] if e0 else s1  # nothing counted: as if counted from s1
            p = min(dirty[row], e0)
            if s1 < s0 or e1 < e0:
                return None
            if p == e0 and s1 == s0 and (e1 == e0 or e1 == e0 + 1 and e0):
                if e1 > e0:  # grown by one slot, which it owns (a counted row: s1 = s0 <= e0)
                    grow_rows.append(row)
                    grow_at.append(e0)
                continue
            new = table[row, p:e1].astype(np.int64)
            if len(new) and (int(new.min()) < 1 or int(new.max()) > n):
                return None
            rows.append((row, s0, e0, s1, e1, p, new))
        if not grow_rows:
            return listed, None, rows
        slots = table[grow_rows, grow_at].astype(np.int64)
        if int(slots.min()) < 1 or int(slots.max()) > n:
            return None
        return listed, (grow_rows, grow_at, slots), rows

    def _count_grown(self, rows: list[int], at: list[int], slots: np.ndarray) -> np.ndarray:
        """Count the one new (owned) slot of each of these rows; the slots."""
        self.shadow[rows, at] = slots
        np.add.at(self.read_count, slots, 1)
        np.add.at(self.own_count, slots, 1)
        self.own_entries += len(slots)
        end = self.end
        for row, pos in zip(rows, at):
            end[row] = pos + 1
        return slots

    def _drop(self, row: int) -> np.ndarray:
        """Take a row no longer live off the counts; its counted pages."""
        s0, e0 = self.start[row], self.end[row]
        pages = self._take(self.read_count, self.shadow[row, :e0])
        self._take(self.own_count, pages[s0:])
        self.start[row] = self.end[row] = 0
        return pages

    def _take(self, counts: np.ndarray, entries: np.ndarray) -> np.ndarray:
        """Subtract counted entries (own entries too when ``counts`` is own_count)."""
        pages = entries.astype(np.int64)
        np.subtract.at(counts, pages, 1)
        if counts is self.own_count:
            self.own_entries -= len(pages)
        return pages

    def _recount(self, table: np.ndarray, spans: np.ndarray, counted: Counted) -> np.ndarray | None:
        rows, start, end = spans.T
        self.shadow = np.zeros_like(table)
        self.own_count = np.zeros(self.num_pages + 1, dtype=np.int64)
        self.read_count = np.zeros(self.num_pages + 1, dtype=np.int64)
        self.own_entries, self._table = 0, table
        if self._add(table, rows, start, end, (rows, start, end), np.zeros_like(rows), counted) is None:
            return None
        return ALL_PAGES

    def _follow(self, table: np.ndarray, spans: np.ndarray, live: np.ndarray, dirty: np.ndarray,
                counted: Counted) -> np.ndarray | None:
        """Subtract what changed since the last update, add what is there now (``counted``:
        each table row's counted span, as arrays, brought to ``spans``)."""
        rows, s1, e1 = spans.T
        start, end = counted
        gone = np.flatnonzero(~live & (end > 0))
        removed = _NONE
        if len(gone):  # rows no longer live lose all they counted
            g1 = end[gone]
            removed = self._subtract((gone, start[gone], g1), (gone, np.zeros_like(gone), g1))
            start[gone] = end[gone] = 0
        s0, e0 = start[rows], end[rows]
        stable = np.minimum(np.minimum(dirty[rows], e0), e1)  # P: read, and unchanged, below it
        if (stable == e0).all() and ((s1 == s0) | (e0 == 0)).all():
            # only grown (decode) or new: reads [e0, e1) more, of which it owns those >= s1
            added = self._add(table, rows, s1, e1, None, e0, counted)
        else:
            both = np.maximum(s0, s1)  # owned both times: [both, stable)
            cut_lo, cut_hi = np.minimum(both, stable), stable  # the kept range (empty: lo == hi)
            # [s, e) without the kept range: [s, min(cut_lo, e)) and [max(cut_hi, s), e)
            removed = np.concatenate([removed, self._subtract(
                (np.concatenate([rows, rows]), np.concatenate([s0, np.maximum(cut_hi, s0)]),
                 np.concatenate([np.minimum(cut_lo, e0), e0])), (rows, stable, e0))])
            added = self._add(table, rows, s1, e1, (
                np.concatenate([rows, rows]), np.concatenate([s1, np.maximum(cut_hi, s1)]),
                np.concatenate([np.minimum(cut_lo, e1), e1])), stable, counted)
        return None if added is None else np.concatenate([removed, added])

    def _subtract(self, own: Ranges, reads: Ranges) -> np.ndarray:
        """Take the counted (``shadow``) entries of these ranges off the counts."""
        entries, split = _entries(self.shadow, own, reads)
        np.subtract.at(self.own_count, entries[:split], 1)
        np.subtract.at(self.read_count, entries[split:], 1)
        self.own_entries -= split
        return entries

    def _add(self, table: np.ndarray, rows: np.ndarray, start: np.ndarray, end: np.ndarray,
             own: Ranges | None, read_from: np.ndarray, counted: Counted) -> np.ndarray | None:
        """Count the table's entries of the owned ranges (None: the positions at or past
        each row's start among the reads) and of each row's ``[read_from, end)`` (None: a
        value out of range), copy those reads into ``shadow``, and record the new spans
        in ``counted``."""
        read_rows, read_pos = _positions(rows, read_from, end)
        read = table[read_rows, read_pos].astype(np.int64)
        if len(read) and (int(read.min()) < 1 or int(read.max()) > self.num_pages):
            return None  # owned entries are read ones: new here, or checked when first counted
        self.shadow[read_rows, read_pos] = read
        counted[0][rows], counted[1][rows] = start, end
        owned = read[read_pos >= counted[0][read_rows]] if own is None else _entries(table, own)[0]
        np.add.at(self.own_count, owned, 1)
        np.add.at(self.read_count, read, 1)
        self.own_entries += len(owned)
        return np.concatenate([owned, read])


Ranges = tuple[np.ndarray, np.ndarray, np.ndarray]  # rows, and [lo, hi) positions of each
Counted = tuple[np.ndarray, np.ndarray]  # per table row, the counted span's start and end
GrownRows = tuple[list[int], list[int], np.ndarray]  # rows, positions, their slots
ByRowPlan = tuple[set[int], "GrownRows | None", list[tuple[int, int, int, int, int, int, np.ndarray]]]


def _as_spans(rows: Sequence[RowSpan] | np.ndarray) -> np.ndarray:
    """The rows as an int64 [rows, 3] array (one pass over the tuples, no per-row array)."""
    if isinstance(rows, np.ndarray):
        return rows.astype(np.int64, copy=False).reshape(-1, 3)
    return np.fromiter(chain.from_iterable(rows), np.int64, 3 * len(rows)).reshape(-1, 3)


def _live_rows(spans: np.ndarray, shape: tuple[int, ...]) -> np.ndarray | None:
    """The mask of the rows listed — if each is in the table, listed once, with
    0 <= owned from <= allocated <= width; else None."""
    live = np.zeros(shape[0], dtype=bool)
    if not len(spans):
        return live
    rows, start, end = spans.T
    if int(spans.min()) < 0 or int(rows.max()) >= shape[0] or int(end.max()) > shape[1] or (start > end).any():
        return None
    live[rows] = True
    return live if np.count_nonzero(live) == len(rows) else None


def _positions(rows: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every (row, position) of the ranges ``[lo, hi)`` (empty where ``hi <= lo``), in order."""
    lengths = np.maximum(hi - lo, 0)
    ends = np.cumsum(lengths)
    if not len(ends) or ends[-1] == 0:
        return _NONE, _NONE
    return np.repeat(rows, lengths), np.arange(ends[-1]) + np.repeat(lo - ends + lengths, lengths)


def _entries(table: np.ndarray, first: Ranges, then: Ranges | None = None) -> tuple[np.ndarray, int]:
    """The table's entries over the ``first`` ranges and then the ``then`` ranges, as
    int64, and how many of them the ``first`` ranges gave."""
    rows, lo, hi = first if then is None else (np.concatenate(p) for p in zip(first, then))
    split = int(np.maximum(first[2] - first[1], 0).sum())
    at_rows, at_pos = _positions(rows, lo, hi)
    return (table[at_rows, at_pos].astype(np.int64) if len(at_rows) else _NONE), split


_NONE = np.empty(0, np.int64)
