"""The rows' page counts kept across censuses (engine/observe/census_rows.py) are the counts of
the live rows' current contents — after any writes, span changes, rows dropped and rows
handed out again — and the pages flagged are those the counts block."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from engine.errors import KVAccountingError
from engine.mem.req_to_token import ReqToTokenPool
from engine.observe.census_kernels import BLOCKED, FREE, OCCUPANCY
from engine.observe.census_rows import RowCounts

ROWS, WIDTH, PAGES = 6, 12, 40


def _expected(
    pool: ReqToTokenPool, spans: dict[int, tuple[int, int]]
) -> tuple[np.ndarray, np.ndarray]:
    own, read = (
        np.zeros(PAGES + 2, np.int64),
        np.zeros(PAGES + 2, np.int64),
    )  # 0 and PAGES+1: out of range
    for row, (start, end) in spans.items():
        np.add.at(own, pool.req_to_token[row, start:end].astype(np.int64), 1)
        np.add.at(read, pool.req_to_token[row, :end].astype(np.int64), 1)
    return own, read


def _spans_array(spans: dict[int, tuple[int, int]]) -> np.ndarray:
    return np.array([(row, s, e) for row, (s, e) in spans.items()], dtype=np.int64).reshape(-1, 3)


WRITE = st.tuples(
    st.just("write"),
    st.integers(1, ROWS),
    st.integers(0, WIDTH - 1),
    st.lists(st.integers(1, PAGES), min_size=1, max_size=4),
)
POINTS = st.tuples(
    st.just("points"),
    st.lists(st.integers(1, ROWS), min_size=1, max_size=3, unique=True),
    st.integers(0, WIDTH - 1),
    st.integers(1, PAGES),
)
SPAN = st.tuples(
    st.just("span"), st.integers(1, ROWS), st.integers(0, WIDTH), st.integers(0, WIDTH)
)
BAD = st.tuples(
    st.just("write"),
    st.integers(1, ROWS),
    st.integers(0, WIDTH - 1),
    st.lists(st.sampled_from([0, PAGES + 1]), min_size=1, max_size=1),
)
DROP = st.tuples(st.just("drop"), st.integers(1, ROWS))
DECODE = st.tuples(st.just("decode"), st.integers(1, PAGES))  # every live row grows by one
PUBLISH = st.tuples(st.just("publish"), st.integers(1, ROWS))  # a row's KV all goes to the tree
LOOK = st.tuples(st.just("look"))
OPS = st.lists(
    st.one_of(WRITE, POINTS, SPAN, SPAN, DROP, LOOK, LOOK, BAD, DECODE, DECODE, PUBLISH),
    min_size=1,
    max_size=40,
)


def _apply(pool: ReqToTokenPool, spans: dict[int, tuple[int, int]], op: tuple) -> None:
    if op[0] == "write":
        _, row, start, slots = op
        pool.write(row, start, np.array(slots[: WIDTH - start], dtype=np.int64))
    elif op[0] == "points":
        _, rows, pos, slot = op
        pool.write_points(np.array(rows), np.full(len(rows), pos), np.full(len(rows), slot))
    elif op[0] == "span":
        _, row, a, b = op
        spans[row] = (min(a, b), max(a, b))
    elif op[0] == "drop":
        spans.pop(op[1], None)
    elif op[0] == "publish" and op[1] in spans:
        spans[op[1]] = (spans[op[1]][1], spans[op[1]][1])
    elif op[0] == "decode":
        grown = [(row, end) for row, (_, end) in spans.items() if end < WIDTH]
        if grown:
            rows, ends = (np.array(x) for x in zip(*grown))
            pool.write_points(rows, ends, (rows * op[1] + ends) % PAGES + 1)
            spans.update({row: (spans[row][0], end + 1) for row, end in grown})


@settings(max_examples=300, deadline=None)
@given(OPS)
@example([("look",), ("decode", 3), ("publish", 1), ("look",)])  # grown, owned by the tree
@example([("look",), ("span", 3, 1, 1), ("look",)])  # new: one slot, owned by the tree
def test_counts_equal_a_recount(ops: list[tuple]) -> None:
    """After every look, own/read counts equal counting the live rows' contents from
    scratch, and the pages flagged are those the counts block (here: owned twice); a row
    reading a page outside 1..num_pages makes the rows uncountable."""
    pool = ReqToTokenPool(ROWS, WIDTH)
    for row in range(1, ROWS + 1):  # every position valid at first (an unwritten one reads 0)
        pool.write(row, 0, (np.arange(WIDTH) * row) % PAGES + 1)
    counts, spans = RowCounts(pool, PAGES), {1: (0, 3), 2: (2, 5)}
    for op in [*ops, ("look",)]:
        _apply(pool, spans, op)
        if op[0] != "look":
            continue
        countable = counts.update(_spans_array(spans))
        own, read = _expected(pool, spans)
        if read[0] or read[PAGES + 1]:
            assert not countable
            continue
        assert countable
        own, read = own[: PAGES + 1], read[: PAGES + 1]
        assert np.array_equal(counts.own_count, own) and np.array_equal(counts.read_count, read)
        assert counts.own_entries == int(own.sum())
        ledger, blocked, totals = counts.ledger
        assert (
            not ledger[OCCUPANCY].any() and not ledger[FREE].any()
        )  # a ledger of its own: rows only
        assert np.array_equal(blocked, own >= 2) and totals[BLOCKED] == int((own >= 2).sum())


def test_a_row_listed_twice_or_out_of_the_table_is_not_countable() -> None:
    """Counts are kept by row: two owners on one row, or a span past the row's width,
    are not countable: False (the census then goes from scratch)."""
    pool = ReqToTokenPool(ROWS, WIDTH)
    pool.write(1, 0, np.arange(1, 5))
    counts = RowCounts(pool, PAGES)
    assert counts.update(np.array([[1, 0, 4], [1, 2, 4]])) is False
    assert counts.update(np.array([[1, 0, WIDTH + 1]])) is False
    assert counts.update(np.array([[1, 0, 4]])) is True
    assert counts.read_count[1:5].tolist() == [1, 1, 1, 1]


def test_the_table_is_written_only_through_the_pool() -> None:
    """``req_to_token`` is read-only: a write that bypasses ``write`` (which the census
    could not follow) raises instead of going unseen."""
    pool = ReqToTokenPool(ROWS, WIDTH)
    with pytest.raises(ValueError, match="read-only"):
        pool.req_to_token[1, 0] = 3


def test_a_write_at_a_negative_position_is_refused() -> None:
    """Position -1 would wrap to the row's last entry while the tracker recorded -1: both
    writes refuse it (KVAccountingError) and the table is unchanged."""
    pool = ReqToTokenPool(ROWS, WIDTH)
    with pytest.raises(KVAccountingError, match="negative position -1"):
        pool.write(1, -1, np.array([3]))
    with pytest.raises(KVAccountingError, match="negative position -1"):
        pool.write_points(np.array([1]), np.array([-1]), np.array([3]))
    assert not pool.req_to_token.any()
