"""The vllm driver re-reads only the hash-map keys vLLM wrote (driver/records.py ``_remap``), and
keeps its free set from what each walk of the free queue changed (``_refree``).
Two keys can print the same short hex — one block hash in two KV groups (the group id is the
key's last 4 bytes) — and a block moved from one to the other within a step must stay listed
whichever key is re-read first. (vLLM 0.33.0's seed 6 broke this under some PYTHONHASHSEEDs,
which order a set of keys: a driver error the cross-check named, reported as a finding.)
Plain Python: runs without vLLM."""

from __future__ import annotations

import importlib.util
from collections import Counter
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

DRIVER = Path(__file__).parents[4] / "invariants/targets/vllm/driver"
DRIVERLIB = DRIVER.parents[1] / "driverlib"


@pytest.fixture
def records(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The driver's own module, loaded from its file (SGLang's drivers have a records.py too),
    with the driver's library on the path as the driver puts it."""
    monkeypatch.syspath_prepend(str(DRIVERLIB))
    spec = importlib.util.spec_from_file_location("vllm_driver_records", DRIVER / "records.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("order", [0, 1])
def test_a_block_moved_between_same_hex_keys_stays_listed(records, order: int) -> None:
    block_hash = bytes(range(32))
    in_group = {g: block_hash + g.to_bytes(4, "big") for g in (0, 1)}
    assert records.hex_of(in_group[0]) == records.hex_of(in_group[1])
    block = SimpleNamespace(block_id=2)
    pool_map = SimpleNamespace(_cache={in_group[1]: block})
    rec = records.Records(None)
    rec.map = pool_map
    rec.keys, rec.under = records.read_map(pool_map)
    pool_map._cache = {in_group[0]: block}  # evicted from group 1, cached again in group 0
    keys = [in_group[1], in_group[0]][:: 1 if order else -1]
    assert rec._remap(keys) == {2}
    assert rec.mapped[2] == [records.hex_of(in_group[0])]
    assert rec.keys[2] == {in_group[0]}
    assert rec.under == {in_group[0]: (2,)}


def test_a_window_dropping_its_first_blocks_moves_only_those(records) -> None:
    """A sliding window's table drops blocks at its front and grows at its end: only the
    blocks that left or came are counted again, not the table."""
    assert records.table_change([4, 5, 6, 7], [6, 7, 8]) == ([8], [4, 5])
    assert records.table_change([4, 5, 6], [4, 5, 6, 9]) == ([9], [])
    assert records.table_change([4, 5, 6], [5, 4]) == ([5, 4], [4, 5, 6])  # counted whole


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.integers(0, 6), max_size=8), st.lists(st.integers(0, 6), max_size=8))
def test_a_table_change_always_moves_the_counts_to_the_new_table(records, old, new) -> None:
    """Whatever the two tables, old - dropped + added == new as multisets (the holder counts
    kept from the changes equal a recount)."""
    added, dropped = records.table_change(old, new)
    assert Counter(old) - Counter(dropped) + Counter(added) == Counter(new)
    assert not Counter(dropped) - Counter(old)


EDITS = st.tuples(st.integers(0, 4), st.integers(0, 10), st.lists(st.integers(0, 12), max_size=4))


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.integers(0, 9), max_size=10), st.lists(EDITS, max_size=6))
def test_the_free_set_kept_from_the_walks_is_the_last_walks(records, first, edits) -> None:
    """Whatever the walks — a block popped off the front, freed again at the end, listed
    twice by a double free — the kept set is the last walk's, and ``_refree`` names exactly
    the blocks whose membership changed. (Each walk after the first is the last one's
    ``[s:s + k]`` and a tail, as the queue moves, or anything else by a short k.)"""
    walks = [first]
    for start, kept, tail in edits:
        walks.append(walks[-1][start : start + kept] + tail)
    rec = records.Records(None)
    before: set[int] = set()
    for walk in walks:
        named = rec._refree(walk)
        assert rec.free == set(walk)
        assert named == before ^ set(walk)
        before = set(walk)
