"""The census input sent as deltas (driverlib/census_deltas.py) and rebuilt on kvspec's side
(census_mirror.py): whatever the driver read, kvspec takes the census of exactly that.

The driver module runs in SGLang's venv and imports nothing of kvspec; it is loaded here from
its file (plain Python, no SGLang needed)."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.observe.crosscheck import CrossCheckMismatch
from invariants.targets.census_mirror import CensusMirror
from invariants.targets.views import to_state_view

DRIVER = Path(__file__).parents[3] / "invariants/targets/driverlib/census_deltas.py"
_spec = importlib.util.spec_from_file_location("kvspec_driver_deltas", DRIVER)
assert _spec is not None and _spec.loader is not None
deltas = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(deltas)

pages = st.lists(st.integers(1, 12), max_size=12)
owners = st.lists(st.tuples(st.sampled_from("abcde"), pages), max_size=4)


def census(free: list[int], owned: list, referenced: list) -> dict[str, Any]:
    return {"num_pages": 12, "free_pages": free, "owned": owned, "referenced": referenced}


def view(step: int, inputs: dict[str, Any]) -> dict[str, Any]:
    return {"event": "step", "step": step, "page_size": 1, "pools": [{"name": "full", **inputs}]}


def as_lists(pairs: list[tuple[str, list[int]]]) -> list[list[Any]]:
    return [[label, list(p)] for label, p in pairs]


@given(pages, pages)
def test_a_list_delta_rebuilds_the_new_list(old: list[int], new: list[int]) -> None:
    """``[s, k, tail]``: ``old[s:s + k] + tail`` is the new list, for any two lists."""
    start, kept, tail = deltas.list_delta(old, new)
    assert old[start : start + kept] + tail == new


def test_an_append_and_a_front_take_ship_only_the_change() -> None:
    """A row that grew by one page sends that page; a free list that lost its first pages and
    gained one at the back sends the offset, the run kept and the new page."""
    assert deltas.list_delta([4, 5, 6], [4, 5, 6, 9]) == [0, 3, [9]]
    assert deltas.list_delta([1, 2, 3, 4, 5], [3, 4, 5, 8]) == [2, 3, [8]]
    assert deltas.list_delta([7, 7, 3], [7, 7, 3]) == [0, 3, []]  # unchanged: nothing sent


@given(st.lists(st.tuples(pages, owners, owners), min_size=1, max_size=6))
def test_the_mirror_rebuilds_every_input_the_driver_read(
    reads: list[tuple[list[int], list, list]],
) -> None:
    """Each view's census, taken by kvspec from the rebuilt input, is the census of the input
    the driver read — through label changes, repeated labels (sent whole) and empty lists."""
    encoder, mirror = deltas.CensusEncoder(), CensusMirror()
    for step, (free, owned, referenced) in enumerate(reads):
        full = census(free, as_lists(owned), as_lists(referenced))
        expected = to_state_view(view(step, {"census_input": copy.deepcopy(full)}))
        sent = encoder.encode(view(step, {"census_input": full}))
        assert "census_input" not in sent["pools"][0]
        assert mirror.view(sent).pools[0].census == expected.pools[0].census


def _encoded(*reads: list[int]) -> list[dict[str, Any]]:
    encoder = deltas.CensusEncoder()
    return [
        encoder.encode(view(i, {"census_input": census(free, [], [])}))
        for i, free in enumerate(reads)
    ]


def test_a_view_copied_into_another_applies_its_delta_once() -> None:
    """The session view of a step is the step view copied: the same delta number rebuilds
    the same input, not the delta applied twice."""
    first, second = _encoded([1, 2, 3], [2, 3])
    mirror = CensusMirror()
    mirror.view(first)
    once = mirror.view(second).pools[0].census
    assert mirror.view(dict(second, event="session")).pools[0].census == once


def test_a_lost_delta_is_a_harness_error_naming_the_pool() -> None:
    """A view whose delta does not follow the last one applied cannot be rebuilt: the mirror
    refuses it by pool and numbers, never guesses."""
    first, _, third = _encoded([1, 2, 3], [2, 3], [3])
    mirror = CensusMirror()
    mirror.view(first)
    with pytest.raises(ValueError, match="pool full: census delta 3 after 1"):
        mirror.view(third)


def test_under_crosscheck_a_wrong_rebuild_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the whole input riding along (KVSPEC_CROSSCHECK in the driver), a delta that does
    not rebuild it stops the run naming both."""
    monkeypatch.setattr(deltas, "CROSSCHECK", True)
    first, second = _encoded([1, 2, 3], [2, 3])
    second["pools"][0]["census_delta"]["free_pages"] = [0, 3, []]  # claims [1, 2, 3] again
    mirror = CensusMirror()
    mirror.view(first)
    with pytest.raises(CrossCheckMismatch, match="census input of pool full"):
        mirror.view(second)


def test_a_block_twice_in_a_row_in_one_table_is_held_twice_where_blocks_are_listed_once() -> None:
    """A driver that lists each block once per holding (vLLM's: ``slots_per_page`` 1 in its
    input, through the deltas and the mirror) has a block listed twice in a row in one table
    counted as two holdings — a duplicate naming the block and its holder — where an input
    listing one id per slot (pages of 16 slots) reads the same list as one holding."""
    table = [["req:a", [5, 5, 6]]]
    per_slot = census([1, 2, 3, 4, 7, 8, 9, 10, 11, 12], table, [])
    per_block = dict(per_slot, slots_per_page=1)
    sixteen = view(0, {"census_input": per_slot, "page_size": 16})
    assert to_state_view(sixteen).pools[0].census.duplicates == ()
    encoder, mirror = deltas.CensusEncoder(), CensusMirror()
    for step in (0, 1):  # the first view sent whole, the second as a delta
        full = copy.deepcopy(per_block)
        sent = encoder.encode(view(step, {"census_input": full, "page_size": 16}))
        (duplicate,) = mirror.view(sent).pools[0].census.duplicates
        assert (duplicate.page, duplicate.owners) == (5, ("req:a (twice)",))
