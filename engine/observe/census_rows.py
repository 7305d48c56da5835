"""The request rows' part of a page-size-1 census, kept across censuses: per page, how many
row entries own it and how many rows read it, recounted only where rows changed.

Keeps, for the live rows of the last ``update`` (each ``(row, owned from, allocated)``), in
the census's ledger (census_kernels.py): ``OWNED[p]`` = the entries of
``table[row, start:end]`` equal to ``p`` over the rows, ``READ[p]`` = those of
``table[row, :end]``, their total ``OWNED_ENTRIES``, and each page's flag — exactly what
counting every row from scratch gives. ``shadow`` holds each counted row's contents as they
were counted (what is subtracted when they change).

Why recounting only part of each row is exact: the table is written only through
``ReqToTokenPool.write``/``write_points`` (``req_to_token`` is read-only), which publish to
the table's change feed the rows written and the first position written in each. For a row
counted as ``[s0, e0)`` and now ``[s1, e1)``, first written at ``d`` since, positions below
``P = min(d, e0, e1)`` hold what was counted and are read both times; owned positions in
``[max(s0, s1), P)`` are owned both times. So the old counts lose ``[P, e0)`` (reads) and
``[s0, e0)`` minus the stable owned range, and gain ``[P, e1)`` and ``[s1, e1)`` minus it —
read from the table and copied into ``shadow``. A row no longer live loses all it counted; a
new row (or one freed and handed out again: its writes start at 0) gains all. The loops are
``census_kernels.follow_rows``.

``update`` answers False — the caller then takes the census from scratch — when the rows
cannot be kept by row (a row listed twice, a span outside the table) or a value is outside
``1..num_pages``; the counts then recount from scratch at the next update.
tests/engine/observe/test_census_rows.py checks the counts against a recount after random
writes and span changes; tests/engine/observe/test_incremental_census.py the whole census.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain

import numpy as np

from engine.mem.req_to_token import ReqToTokenPool, RowWrite
from engine.observe.census_kernels import (
    END,
    OK,
    OWNED,
    OWNED_ENTRIES,
    READ,
    Ledger,
    follow_rows,
    new_ledger,
    retally,
)

NOT_DIRTY = np.iinfo(np.int64).max  # a row not written since the last update
RowSpan = tuple[int, int, int]  # (row, owned from, allocated): the row reads [0, allocated)


class RowCounts:
    """The row entries per page of a page-size-1 pool of ``num_pages`` pages, in ``ledger``
    (a census's, shared with its tree and free-list counts; by default one of its own)."""

    def __init__(self, pool: ReqToTokenPool, num_pages: int, ledger: Ledger | None = None) -> None:
        self.pool = pool
        self.ledger = ledger if ledger is not None else new_ledger(num_pages)
        self.writes = pool.changes.subscribe()  # the rows written, from which position
        self._counted = False  # False: recount every row at the next update
        # per row, the first position the last update saw written
        self.dirty = np.zeros(0, np.int64)
        self._stamp = 0  # marks the rows listed by one update
        self._writes_seen = 0  # writes taken by no update yet, known to lie past the counted ends

    @property
    def own_count(self) -> np.ndarray:
        return self.ledger[0][OWNED]

    @property
    def read_count(self) -> np.ndarray:
        return self.ledger[0][READ]

    @property
    def own_entries(self) -> int:
        return int(self.ledger[2][OWNED_ENTRIES])

    def written_where_counted(self) -> bool:
        """Whether a row write not yet counted may lie below a counted end (True when
        unsure); one that does not changes no count (the next update still takes it)."""
        log, seen = self.writes, self._writes_seen
        if log.lost or not self._counted:
            return True
        ends, self._writes_seen = self.counted[END], len(log.changes)
        return any(np.any(positions < ends[rows]) for rows, positions in log.changes[seen:])

    def update(self, rows: Sequence[RowSpan] | np.ndarray) -> bool:
        """Bring the counts to these rows (each (row, owned from, allocated)); False when the
        rows cannot be counted (census from scratch; recounted at the next update)."""
        writes, lost = self.writes.take()
        self._writes_seen = 0
        table = self.pool.req_to_token
        recount = lost or not self._counted
        dirty = self.dirty = self._first_writes(writes, len(table))
        if recount:
            self._reset(table)
        self._stamp += 1
        status = follow_rows(
            table, self.shadow, _as_spans(rows), dirty, self.counted, self._stamp, self.ledger
        )
        if recount:
            retally(self.ledger)  # the reset zeroed counts without moving their pages' flags
        self._counted = status == OK
        return status == OK

    @staticmethod
    def _first_writes(writes: list[RowWrite], height: int) -> np.ndarray:
        """Per table row, the first position written since the last update (``NOT_DIRTY``:
        none)."""
        dirty = np.full(height, NOT_DIRTY, np.int64)
        for rows, positions in writes:
            if isinstance(rows, np.ndarray):
                np.minimum.at(dirty, rows, positions)
            elif positions < dirty[rows]:
                dirty[rows] = positions
        return dirty

    def _reset(self, table: np.ndarray) -> None:
        """Count nothing, over ``table``."""
        counts, _, totals = self.ledger
        self.shadow = np.zeros_like(table)
        self.counted = np.zeros((3, len(table)), dtype=np.int64)  # per row: start, end, stamp
        counts[OWNED] = counts[READ] = 0
        totals[OWNED_ENTRIES] = 0
        self._stamp = 0


def _as_spans(rows: Sequence[RowSpan] | np.ndarray) -> np.ndarray:
    """The rows as an int64 [rows, 3] array (one pass over the tuples, no per-row array)."""
    if isinstance(rows, np.ndarray):
        return rows.astype(np.int64, copy=False).reshape(-1, 3)
    return np.fromiter(chain.from_iterable(rows), np.int64, 3 * len(rows)).reshape(-1, 3)
