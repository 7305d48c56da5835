"""The vectorised census equals the simple per-owner reference census on every state —
clean ones and ones with double ownership, leaks, dangling reads, double frees and
out-of-range ids (a diffbehavior-style refactor guard)."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from engine.mem.census import take_census
from tests.engine.mem.census_reference import reference_census


@st.composite
def pool_states(draw: st.DrawFn) -> tuple:
    num_pages = draw(st.integers(1, 40))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    perm = rng.permutation(np.arange(1, num_pages + 1))
    cut = int(rng.integers(0, num_pages + 1))
    free, rest = perm[:cut], perm[cut:]
    owned = []
    for i, chunk in enumerate(np.array_split(rest, int(rng.integers(1, 5)))):
        pages = np.repeat(np.sort(chunk) if rng.random() < 0.5 else chunk, int(rng.integers(1, 4)))
        owned.append((f"o{i}", pages.astype(np.int64)))
    referenced = [(f"r{i}", rng.integers(0, num_pages + 2, int(rng.integers(0, 4))).astype(np.int64))
                  for i in range(int(rng.integers(0, 3)))]
    if draw(st.booleans()) and owned[0][1].size:
        owned.append(("twice", owned[0][1][:2]))  # the same page owned twice
    if draw(st.booleans()):
        free = np.concatenate([free, rng.integers(1, num_pages + 3, 2)])  # double free / out of range
    if draw(st.booleans()) and owned[0][1].size:
        owned[0] = ("o0", np.concatenate([owned[0][1], owned[0][1][:1]]))  # one owner, non-adjacent repeat
    if draw(st.booleans()) and len(rest):
        owned = owned[1:]  # a leak: the first owner's pages belong to nobody
    return num_pages, free.astype(np.int64), owned, referenced


@given(pool_states())
def test_vectorised_census_equals_reference(state: tuple) -> None:
    """Same duplicates, dangling, orphans and free-list repeats, with the same witnesses."""
    assert take_census(*state) == reference_census(*state)


def test_clean_pool_has_empty_census() -> None:
    """Every page either free or owned once: nothing to report."""
    owned = [("a", np.array([1, 1, 2])), ("b", np.array([3]))]
    census = take_census(4, np.array([4]), owned, owned)
    assert (census.duplicates, census.dangling, census.orphans, census.free_repeats) == ((), (), (), ())
