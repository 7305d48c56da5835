"""kvspec's side takes in only the hash-map keys vLLM wrote (invariants/targets/vllm/records.py
``_remap``), each as its number in the run (``shorts``: each number's short hex). Two keys
can print the same short hex — one block hash in two KV groups (the group id is the key's
last 4 bytes) — and a block moved from one to the other within a step must stay listed
whichever key is taken in first. (vLLM 0.33.0's seed 6 broke this under some
PYTHONHASHSEEDs, which order a set of keys: a harness error the cross-check named, reported as
a finding.) Plain Python: runs without vLLM."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from invariants.targets.vllm import records
from invariants.targets.vllm.records import Records


@pytest.mark.parametrize("order", [0, 1])
def test_a_block_moved_between_same_hex_keys_stays_listed(order: int) -> None:
    block_hash = bytes(range(32))
    whole = {g: (block_hash + g.to_bytes(4, "big")).hex() for g in (0, 1)}  # the two keys
    short = whole[0][:24]
    assert short == whole[1][:24] and whole[0] != whole[1]
    in_group = {0: 1, 1: 2}  # their numbers
    rec = Records()
    rec.shorts += [short, short]
    rec.keys, rec.under = records.read_map([[in_group[1], [2]]])
    # evicted from group 1, cached again in group 0: both keys written, in either order
    keys = [[in_group[1], []], [in_group[0], [2]]][:: 1 if order else -1]
    assert rec._remap(keys) == {2}
    assert rec.mapped[2] == (short,)
    assert rec.keys[2] == (in_group[0],)
    assert rec.under == {in_group[0]: [2]}


def test_a_block_under_two_keys_keeps_the_one_not_written() -> None:
    """Taking in keys at C speed assumes one key a block; a block listed under a written key
    and a kept one (one hash in two KV groups, say) keeps the kept key and its short hex."""
    first, second = 1, 2
    rec = Records()
    rec.shorts += ["aa" * 12, "bb" * 12]
    rec.keys, rec.under = records.read_map([[first, [2]], [second, [2, 3]]])
    rec.mapped = {b: records.mapped_as(keys, rec.shorts) for b, keys in rec.keys.items()}
    assert rec._remap([[first, []]]) == {2}
    assert rec.keys == {2: (second,), 3: (second,)}
    assert rec.mapped[2] == ("bb" * 12,)


def test_a_window_dropping_its_first_blocks_moves_only_those() -> None:
    """A sliding window's table drops blocks at its front and grows at its end: only the
    blocks that left or came are counted again, not the table."""
    assert records.table_change([4, 5, 6, 7], [6, 7, 8]) == ([8], [4, 5])
    assert records.table_change([4, 5, 6], [4, 5, 6, 9]) == ([9], [])
    assert records.table_change([4, 5, 6], [5, 4]) == ([5, 4], [4, 5, 6])  # counted whole


@given(st.lists(st.integers(0, 6), max_size=8), st.lists(st.integers(0, 6), max_size=8))
def test_a_table_change_always_moves_the_counts_to_the_new_table(old, new) -> None:
    """Whatever the two tables, old - dropped + added == new as multisets (the holder counts
    kept from the changes equal a recount)."""
    added, dropped = records.table_change(old, new)
    assert Counter(old) - Counter(dropped) + Counter(added) == Counter(new)
    assert not Counter(dropped) - Counter(old)


# seven keys by number (0: no hash); the short hexes of keys 1, 6 and 7 are one
SHORTS = ["", *(f"{i:02x}" * 12 for i in range(5)), "00" * 12, "00" * 12]
KEYS = list(range(1, len(SHORTS)))
WRITES = st.lists(
    st.dictionaries(st.sampled_from(KEYS), st.lists(st.integers(0, 5), max_size=2, unique=True)),
    max_size=6,
)


@given(WRITES)
def test_the_kept_keys_are_the_whole_maps_whatever_was_written(steps) -> None:
    """Whatever keys a view writes — a key moved, dropped, listing two blocks, two keys with
    one short hex — each block's kept keys and ``mapped_as`` are those the whole map lists
    (what the cross-check compares on every view of a real run)."""
    rec, whole = Records(), {}
    rec.shorts = SHORTS
    rec.keys, rec.under = records.read_map([])
    for written in steps:
        whole.update(written)
        rec._remap([[key, ids] for key, ids in written.items()])
        keys = records.read_map([[k, ids] for k, ids in whole.items() if ids])[0]
        assert {b: set(ks) for b, ks in rec.keys.items()} == {b: set(ks) for b, ks in keys.items()}
        assert rec.mapped == {b: records.mapped_as(ks, SHORTS) for b, ks in keys.items()}
