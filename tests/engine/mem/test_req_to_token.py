"""ReqToTokenPool: row 0 reserved, row order, write/read, and strict-mode errors."""

from __future__ import annotations

import numpy as np
import pytest

from engine.errors import KVAccountingError
from engine.mem.req_to_token import ReqToTokenPool


def test_rows_start_at_one_and_run_out() -> None:
    """Row 0 is the padding row: alloc hands out 1..size in order, then None."""
    pool = ReqToTokenPool(3, 8)
    assert [pool.alloc() for _ in range(3)] == [1, 2, 3]
    assert pool.alloc() is None and pool.available_size() == 0


def test_freed_rows_are_reused_first_in_first_out_after_fresh_rows() -> None:
    """A freed row goes to the back of the queue: fresh rows first, then freed rows in order."""
    pool = ReqToTokenPool(4, 8)
    a, b = pool.alloc(), pool.alloc()
    pool.free(b)
    pool.free(a)
    assert [pool.alloc() for _ in range(4)] == [3, 4, 2, 1]


def test_write_then_read_returns_an_int64_copy() -> None:
    """read() copies positions [start, end) as int64; mutating the copy leaves the table alone."""
    pool = ReqToTokenPool(2, 8)
    row = pool.alloc()
    pool.write(row, 2, np.array([7, 8, 9]))
    got = pool.read(row, 1, 5)
    assert got.tolist() == [0, 7, 8, 9] and got.dtype == np.int64
    got[:] = 0
    assert pool.read(row, 2, 5).tolist() == [7, 8, 9]
    assert pool.req_to_token.dtype == np.int32


def test_double_free_of_a_row_raises() -> None:
    """Strict mode: freeing a row that is already free is an error naming the row."""
    pool = ReqToTokenPool(2, 8)
    row = pool.alloc()
    pool.free(row)
    with pytest.raises(KVAccountingError, match="double free of request row 1"):
        pool.free(row)


@pytest.mark.parametrize("row", [0, 3, -1])
def test_out_of_range_free_raises(row: int) -> None:
    """Strict mode: row 0 (reserved) and rows past the pool cannot be freed."""
    pool = ReqToTokenPool(2, 8)
    with pytest.raises(KVAccountingError, match=f"out-of-range request row {row}"):
        pool.free(row)


def test_non_strict_double_free_is_silent() -> None:
    """Non-strict mode: a double free duplicates the row in the free queue (SGLang U9)."""
    pool = ReqToTokenPool(2, 8, strict=False)
    row = pool.alloc()
    pool.free(row)
    pool.free(row)
    assert list(pool.free_rows) == [2, 1, 1]
