"""The vectorised census equals the simple per-owner reference census on every state —
clean ones and ones with double ownership (by two owners, or by one owner twice: two runs
of one page, a run longer than a page), leaks, dangling reads, double frees and out-of-
range ids (a diffbehavior-style refactor guard) — at page sizes 1 to 4."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from engine.observe.census import take_census
from engine.view import Census, PageOwners
from tests.engine.observe.census_reference import reference_census


@st.composite
def pool_states(draw: st.DrawFn) -> tuple:
    num_pages = draw(st.integers(1, 40))
    ps = draw(st.integers(1, 4))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    perm = rng.permutation(np.arange(1, num_pages + 1))
    cut = int(rng.integers(0, num_pages + 1))
    free, rest = perm[:cut], perm[cut:]
    owned = []
    for i, chunk in enumerate(np.array_split(rest, int(rng.integers(1, 5)))):
        pages = np.repeat(
            np.sort(chunk) if rng.random() < 0.5 else chunk, int(rng.integers(1, ps + 1))
        )
        owned.append((f"o{i}", pages.astype(np.int64)))
    referenced = [
        (f"r{i}", rng.integers(0, num_pages + 2, int(rng.integers(0, 4))).astype(np.int64))
        for i in range(int(rng.integers(0, 3)))
    ]
    if draw(st.booleans()) and owned[0][1].size:
        owned.append(("twice", owned[0][1][:2]))  # the same page owned twice
    if draw(st.booleans()):
        free = np.concatenate(
            [free, rng.integers(1, num_pages + 3, 2)]
        )  # double free / out of range
    if draw(st.booleans()) and owned[0][1].size:
        owned[0] = (
            "o0",
            np.concatenate([owned[0][1], owned[0][1][:1]]),
        )  # one owner, non-adjacent repeat
    if (
        draw(st.booleans()) and owned[-1][1].size
    ):  # one owner, its last page's run grows (past a page?)
        owned[-1] = (
            owned[-1][0],
            np.concatenate([owned[-1][1], owned[-1][1][-1:].repeat(draw(st.integers(1, 5)))]),
        )
    if draw(st.booleans()) and len(rest):
        owned = owned[1:]  # a leak: the first owner's pages belong to nobody
    return num_pages, free.astype(np.int64), owned, referenced, ps


@given(pool_states())
def test_vectorised_census_equals_reference(state: tuple) -> None:
    """Same duplicates, dangling, orphans and free-list repeats, with the same witnesses."""
    *pool, ps = state
    assert take_census(*pool, slots_per_page=ps) == reference_census(*pool, slots_per_page=ps)


def test_clean_pool_has_empty_census() -> None:
    """Every page either free or owned once: nothing to report."""
    owned = [("a", np.array([1, 1, 2])), ("b", np.array([3]))]
    census = take_census(4, np.array([4]), owned, owned, slots_per_page=2)
    assert (census.duplicates, census.dangling, census.orphans, census.free_repeats) == (
        (),
        (),
        (),
        (),
    )


def test_a_slot_listed_twice_by_one_row_is_a_duplicate() -> None:
    """At page size 1 a row holding slot 5 twice in a row holds it twice: a duplicate naming
    the row, though no other owner holds the slot (a double-freed slot handed twice)."""
    row = ("req:r3@row0", np.array([4, 5, 5, 6]))
    census = take_census(8, np.array([1, 2, 3, 7, 8]), [row], [row], slots_per_page=1)
    assert census == Census(num_pages=8, duplicates=(PageOwners(5, ("req:r3@row0 (twice)",)),))


def test_a_page_in_two_runs_of_one_row_is_a_duplicate() -> None:
    """At page size 4 a row whose pages run [2, 3, 2] holds page 2 twice."""
    row = ("req:r3@row0", np.array([2] * 4 + [3] * 4 + [2] * 2))
    census = take_census(4, np.array([1, 4]), [row], [row], slots_per_page=4)
    assert census.duplicates == (PageOwners(2, ("req:r3@row0 (twice)",)),)


def test_a_run_longer_than_a_page_is_a_duplicate() -> None:
    """At page size 4 eight slots of page 2 in a row are page 2 handed out twice (a page
    freed twice and allocated twice, back to back, to one request)."""
    row = ("req:r3@row0", np.array([2] * 8 + [3] * 2))
    census = take_census(4, np.array([1, 4]), [row], [row], slots_per_page=4)
    assert census.duplicates == (PageOwners(2, ("req:r3@row0 (twice)",)),)


def test_a_correct_paged_row_is_clean() -> None:
    """At page size 4 a row of whole page 2 then a partial page 3 holds each page once;
    a tree node and a row holding page 3 twice are named with how often each holds it."""
    row = ("req:r3@row0", np.array([2, 2, 2, 2, 3, 3]))
    assert take_census(3, np.array([1]), [row], [row], slots_per_page=4) == Census(num_pages=3)
    node = ("tree:n1", np.array([3] * 4 + [1] * 4 + [3] * 4))
    census = take_census(3, np.array([], np.int64), [row, node], [row], slots_per_page=4)
    assert census.duplicates == (PageOwners(3, ("req:r3@row0", "tree:n1 (twice)")),)
