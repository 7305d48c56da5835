"""The census ledger (engine/observe/census_kernels.py) blocks exactly the pages a census from
scratch names — held twice, referenced while free, listed twice in the free list — and a
ledger with no page blocked whose entries add up to the pool's pages is a clean census."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.mem.req_to_token import ReqToTokenPool
from engine.observe.census import take_census
from engine.observe.census_kernels import (
    BLOCKED,
    FREE_ENTRIES,
    OK,
    OWNED_ENTRIES,
    TREE_ENTRIES,
    apply_pages,
    new_ledger,
)
from engine.observe.census_rows import RowCounts
from engine.view import Census

PAGES, ROWS, WIDTH = 8, 3, 5  # at most 8 pages: a census names every witness (MAX_WITNESSES)
PAGE = st.integers(1, PAGES)
ROW = st.tuples(st.lists(PAGE, max_size=WIDTH), st.integers(0, WIDTH))  # contents, owned from


@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.lists(PAGE, min_size=1, max_size=3), max_size=4),
    st.lists(PAGE, max_size=PAGES),
    st.lists(ROW, max_size=ROWS),
)
def test_blocked_pages_are_those_a_census_names(
    nodes: list[list[int]], free: list[int], rows: list[tuple[list[int], int]]
) -> None:
    """Tree nodes, a free list and request rows (page size 1), moved into a ledger by the
    kernels: the blocked pages are the census's duplicates, dangling pages and free repeats,
    and the ledger is clean exactly when the census is."""
    ledger = new_ledger(PAGES)
    for node in nodes:
        assert apply_pages(np.array(node, np.int64), 1, False, ledger) == OK
    assert apply_pages(np.array(free, np.int64), 1, True, ledger) == OK
    pool = ReqToTokenPool(ROWS, WIDTH)
    spans = []
    for row, (contents, start) in enumerate(rows, start=1):
        pool.write(row, 0, np.array(contents, np.int64))
        spans.append((row, min(start, len(contents)), len(contents)))
    assert RowCounts(pool, PAGES, ledger).update(spans)
    owned = [(f"node{i}", np.array(n, np.int64)) for i, n in enumerate(nodes)]
    owned += [(f"row{r}", pool.read(r, s, e)) for r, s, e in spans]
    read = [(f"row{r}", pool.read(r, 0, e)) for r, _, e in spans]
    census = take_census(PAGES, np.array(free, np.int64), owned, read, slots_per_page=1)
    named = {w.page for w in (*census.duplicates, *census.dangling)} | set(census.free_repeats)
    _, blocked, totals = ledger
    assert set(np.flatnonzero(blocked).tolist()) == named and totals[BLOCKED] == len(named)
    entries = totals[TREE_ENTRIES] + totals[FREE_ENTRIES] + totals[OWNED_ENTRIES]
    assert (not totals[BLOCKED] and entries == PAGES) == (census == Census(num_pages=PAGES))


def test_moving_entries_back_unblocks() -> None:
    """A page blocked by two holders is unblocked when one lets go (flags follow the counts
    both ways), and a count below zero stops the kernel."""
    ledger = new_ledger(PAGES)
    pages = np.array([3], np.int64)
    assert apply_pages(pages, 1, False, ledger) == OK and apply_pages(pages, 1, True, ledger) == OK
    assert ledger[1][3] == 1 and ledger[2][BLOCKED] == 1
    assert apply_pages(pages, -1, False, ledger) == OK
    assert ledger[1][3] == 0 and ledger[2][BLOCKED] == 0
    assert apply_pages(pages, -1, False, ledger) != OK
    assert apply_pages(np.array([PAGES + 1], np.int64), 1, True, ledger) != OK
