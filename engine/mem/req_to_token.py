"""The request → token table: one row per live request, position → KV slot id.

Keeps: every row in ``1..size`` is either in ``free_rows`` exactly once or owned; row 0 is
reserved (a padding row, never handed out). Free order: lowest rows first at start, freed
rows reused first-in first-out. The table is written only through ``write`` and
``write_points`` (``req_to_token`` is a read-only view: any other write raises), which
tell every ``WriteTracker`` the first position written per row — what lets a census
recount only what changed (``engine/observe/census_rows.py``); with no tracker, nothing is kept.
"""

from __future__ import annotations

import weakref
from collections import deque

import numpy as np

from engine.errors import KVAccountingError

NOT_DIRTY = np.iinfo(np.int64).max


class WriteTracker:
    """Per row of a table, the first position written since the last ``take``."""

    def __init__(self, rows: int) -> None:
        self.dirty_from = np.zeros(rows, dtype=np.int64)  # every row dirty at first

    def take(self) -> np.ndarray:
        """The positions since the last call (``NOT_DIRTY``: unwritten); then all clean."""
        dirty, self.dirty_from = self.dirty_from, np.full(len(self.dirty_from), NOT_DIRTY, np.int64)
        return dirty


class ReqToTokenPool:
    """``req_to_token[row, pos]`` = the KV slot of position ``pos`` of the row's request."""

    def __init__(self, size: int, max_context_len: int, *, strict: bool = True) -> None:
        self.size = size
        self.max_context_len = max_context_len
        self.strict = strict
        self._trackers: list[weakref.ref[WriteTracker]] = []
        # int32 because kernels read it directly as a tensor
        self._table = np.zeros((size + 1, max_context_len), dtype=np.int32)
        self.req_to_token = self._table.view()
        self.req_to_token.flags.writeable = False
        self.clear()

    def clear(self) -> None:
        self.free_rows: deque[int] = deque(range(1, self.size + 1))
        self._is_free = np.ones(self.size + 1, dtype=bool)
        self._is_free[0] = False

    def available_size(self) -> int:
        return len(self.free_rows)

    def alloc(self) -> int | None:
        """The next free row, or None when all rows are in use."""
        if not self.free_rows:
            return None
        row = self.free_rows.popleft()
        self._is_free[row] = False
        return row

    def free(self, row: int) -> None:
        """Return ``row``; freeing row 0, an unknown row or a free row is an error."""
        if self.strict:
            if not 1 <= row <= self.size:
                raise KVAccountingError(
                    f"free of out-of-range request row {row} (valid 1..{self.size})"
                )
            if self._is_free[row]:
                raise KVAccountingError(f"double free of request row {row}")
        self._is_free[row] = True
        self.free_rows.append(row)

    def write(self, row: int, start: int, slots: np.ndarray) -> None:
        """Write ``slots`` into positions ``[start, start + len(slots))`` of ``row``."""
        if start < 0:  # a slice would wrap around the row (and the trackers lose it)
            raise KVAccountingError(f"write at negative position {start} of request row {row}")
        self._table[row, start : start + len(slots)] = slots
        for ref in self._trackers:
            tracker = ref()
            if tracker is not None and start < tracker.dirty_from[row]:
                tracker.dirty_from[row] = start

    def write_points(self, rows: np.ndarray, positions: np.ndarray, slots: np.ndarray) -> None:
        """Write ``slots[i]`` at position ``positions[i]`` of ``rows[i]``."""
        if len(positions) and int(np.min(positions)) < 0:  # numpy would wrap it around the row
            raise KVAccountingError(
                f"write at negative position {int(np.min(positions))} of a request row"
            )
        self._table[rows, positions] = slots
        for ref in self._trackers:
            tracker = ref()
            if tracker is not None:
                np.minimum.at(tracker.dirty_from, rows, positions)

    def track_writes(self) -> WriteTracker:
        """A tracker of this table's writes from now on (kept while the caller keeps it)."""
        self._trackers = [ref for ref in self._trackers if ref() is not None]
        tracker = WriteTracker(self.size + 1)
        self._trackers.append(weakref.ref(tracker))
        return tracker

    def read(self, row: int, start: int, end: int) -> np.ndarray:
        """Slot ids of positions ``[start, end)`` of ``row`` as int64 (a copy)."""
        return self.req_to_token[row, start:end].astype(np.int64)
