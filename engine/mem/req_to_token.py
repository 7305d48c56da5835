"""The request → token table: one row per live request, position → KV slot id.

Keeps: every row in ``1..size`` is either in ``free_rows`` exactly once or owned; row 0 is
reserved (a padding row, never handed out). Free order: lowest rows first at start, freed
rows reused first-in first-out.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from engine.errors import KVAccountingError


class ReqToTokenPool:
    """``req_to_token[row, pos]`` = the KV slot of position ``pos`` of the row's request."""

    def __init__(self, size: int, max_context_len: int, *, strict: bool = True) -> None:
        self.size = size
        self.max_context_len = max_context_len
        self.strict = strict
        # int32 because kernels read it directly as a tensor
        self.req_to_token = np.zeros((size + 1, max_context_len), dtype=np.int32)
        self.clear()

    def clear(self) -> None:
        self.free_rows: deque[int] = deque(range(1, self.size + 1))
        self._is_free = np.ones(self.size + 1, dtype=bool)
        self._is_free[0] = False

    def widen(self, max_context_len: int) -> None:
        """Make every row at least ``max_context_len`` positions long (EAGLE reserves
        positions past the context: its verify window); only while no row is in use."""
        if max_context_len <= self.max_context_len:
            return
        if len(self.free_rows) != self.size:
            raise KVAccountingError("widen of a request-row table with rows in use")
        self.max_context_len = max_context_len
        self.req_to_token = np.zeros((self.size + 1, max_context_len), dtype=np.int32)

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
                raise KVAccountingError(f"free of out-of-range request row {row} (valid 1..{self.size})")
            if self._is_free[row]:
                raise KVAccountingError(f"double free of request row {row}")
        self._is_free[row] = True
        self.free_rows.append(row)

    def write(self, row: int, start: int, slots: np.ndarray) -> None:
        """Write ``slots`` into positions ``[start, start + len(slots))`` of ``row``."""
        self.req_to_token[row, start : start + len(slots)] = slots

    def read(self, row: int, start: int, end: int) -> np.ndarray:
        """Slot ids of positions ``[start, end)`` of ``row`` as int64 (a copy)."""
        return self.req_to_token[row, start:end].astype(np.int64)
