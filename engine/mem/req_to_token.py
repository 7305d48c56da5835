"""The request → token table: one row per live request, position → KV slot id.

Keeps: every row in ``1..size`` is either in ``free_rows`` exactly once or owned; row 0 is
reserved (a padding row, never handed out). Free order: lowest rows first at start, freed
rows reused first-in first-out. The table is written only through ``write`` and
``write_points`` (``req_to_token`` is a read-only view: any other write raises), which
publish on the change feed ``changes`` (engine/mem/feed.py) the rows written and the first
position written in each — what lets a census recount only what changed
(``engine/observe/census_rows.py``).
"""

from __future__ import annotations

from collections import deque

import numpy as np

from engine.errors import KVAccountingError
from engine.mem.feed import ChangeFeed

RowWrite = tuple[int | np.ndarray, int | np.ndarray]  # (row, start) or (rows, positions)


class ReqToTokenPool:
    """``req_to_token[row, pos]`` = the KV slot of position ``pos`` of the row's request."""

    def __init__(self, size: int, max_context_len: int, *, strict: bool = True) -> None:
        self.size = size
        self.max_context_len = max_context_len
        self.strict = strict
        self.changes: ChangeFeed[RowWrite] = ChangeFeed()
        self.freed: ChangeFeed[int] = ChangeFeed()  # each row given back
        # int32 because kernels read it directly as a tensor
        self._table = np.zeros((size + 1, max_context_len), dtype=np.int32)
        self.req_to_token = self._table.view()
        self.req_to_token.flags.writeable = False
        self.clear()

    def clear(self) -> None:
        self.freed.reset()
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
        self.freed.publish(row)

    def write(self, row: int, start: int, slots: np.ndarray) -> None:
        """Write ``slots`` into positions ``[start, start + len(slots))`` of ``row``."""
        if start < 0:  # a slice would wrap around the row (and the feed would misreport it)
            raise KVAccountingError(f"write at negative position {start} of request row {row}")
        self._table[row, start : start + len(slots)] = slots
        self.changes.publish((row, start))

    def write_points(self, rows: np.ndarray, positions: np.ndarray, slots: np.ndarray) -> None:
        """Write ``slots[i]`` at position ``positions[i]`` of ``rows[i]``."""
        if len(positions) and int(np.min(positions)) < 0:  # numpy would wrap it around the row
            raise KVAccountingError(
                f"write at negative position {int(np.min(positions))} of a request row"
            )
        self._table[rows, positions] = slots
        if self.changes.followed:  # copies: the caller's arrays are its own
            self.changes.publish((np.array(rows, np.int64), np.array(positions, np.int64)))

    def read(self, row: int, start: int, end: int) -> np.ndarray:
        """Slot ids of positions ``[start, end)`` of ``row`` as int64 (a copy)."""
        return self.req_to_token[row, start:end].astype(np.int64)
