"""The vllm target's block records as the checker reads them (invariants/targets/vllm/pool.py,
records.py, blocks.py): a view brings only what the driver read again; every block's record is
handed on, each as last derived — the same views a full listing would give — and the tuple
names the records that changed."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.view import BlockTableView, BlockView, InFlightView
from invariants.targets.driverlib.free_links import TAIL, UNLINKED
from invariants.targets.views import to_state_view
from invariants.targets.vllm import pool as pool_module
from invariants.targets.vllm.blocks import state_view
from invariants.targets.vllm.pool import PoolMirror

FREE = [1, 2, 3]
NUMBERS: dict[str, int] = {}  # a run's hashes as the driver numbers them (a whole view: a run)


def view(blocks: list[list[Any]], free: list[int] = FREE, whole: bool = False) -> dict:
    """A driver view that read ``blocks`` (``[id, ref_cnt, hash, is_null]`` each) again, its
    free queue linked as ``free`` (every block's link read again) and no table; each hash
    sent as its number, a new one's short hex under ``hashes``."""
    if whole:
        NUMBERS.clear()
        NUMBERS[""] = 0
    new = list(dict.fromkeys(h for _, _, h, _ in blocks if h not in NUMBERS))
    NUMBERS.update(zip(new, range(len(NUMBERS), len(NUMBERS) + len(new))))
    blocks = [[i, ref_cnt, NUMBERS[h], null] for i, ref_cnt, h, null in blocks]
    nexts = dict.fromkeys(range(4), UNLINKED) | dict(zip(free, [*free[1:], TAIL]))
    pool = {
        "num_blocks": 4, "num_free_blocks": len(free), "whole": whole, "hashes": new,
        "blocks": [list(c) for c in zip(*blocks)] or [[], [], [], []], "keys": [],
        "links": [free[0] if free else TAIL, list(nexts), list(nexts.values())],
        "tables": [], "kinds": {}, "fenced": {},
    }  # fmt: skip
    return {"event": "step", "step": 1, "page_size": 1, "pool": pool}


FIRST = [[0, 0, "", True], [1, 0, "", False], [2, 0, "", False], [3, 0, "", False]]


def test_changed_blocks_replace_their_records_and_the_rest_stay() -> None:
    """The first view lists every block; the next changes block 2 only (taken off the free
    queue with ref_cnt 1): blocks 0, 1 and 3 are the same objects, block 2 the new record."""
    pool = PoolMirror()
    first = state_view(pool.view(view(FIRST, whole=True)))
    assert [b.id for b in first.blocks] == [0, 1, 2, 3] and first.blocks[0].is_null
    second = state_view(pool.view(view([[2, 1, "ab12", False]], free=[1, 3])))
    assert second.blocks[2] == BlockView(2, 1, False, "ab12", (), 0, False)
    assert all(second.blocks[i] is first.blocks[i] for i in (0, 1, 3))
    third = state_view(pool.view(view([], free=[1, 3])))
    assert third.blocks == second.blocks and third.blocks.fresh == ()  # nothing changed


def test_a_block_not_read_again_keeps_its_last_read_fields() -> None:
    """A block whose record changes without vLLM writing it (here: off the free queue, its
    neighbours' links rewritten) is rebuilt from its fields as last read."""
    pool = PoolMirror()
    state_view(pool.view(view(FIRST, whole=True)))
    state_view(pool.view(view([[3, 0, "cd34", False]])))
    third = state_view(pool.view(view([], free=[1])))
    assert third.blocks[3] == BlockView(3, 0, False, "cd34", (), 0, False)
    assert [b.id for b in third.blocks.fresh] == [2, 3]


def test_a_view_without_block_records_is_an_ordinary_view() -> None:
    """Other targets' views (no ``block_records``) decode as they are: no blocks."""
    pool = {
        "name": "full", "page_size": 1, "capacity": 3, "free": 3,
        "census_input": {"num_pages": 3, "free_pages": [1, 2, 3], "owned": [], "referenced": []},
    }  # fmt: skip
    assert state_view({"event": "step", "step": 1, "pools": [pool]}).blocks == ()


def test_each_tuple_names_what_changed_since_the_one_before() -> None:
    """``prior`` is the tuple handed out before, ``fresh`` the records built since, ``gone``
    those they replaced: the tuple is ``prior`` - ``gone`` + ``fresh``, what lets a block
    rule re-test only ``fresh``."""
    pool = PoolMirror()
    blocks = state_view(pool.view(view(FIRST, whole=True))).blocks
    assert [b.id for b in blocks.fresh] == [0, 1, 2, 3] and blocks.gone == ()
    second = state_view(pool.view(view([[2, 1, "", False]], free=[1, 3]))).blocks
    assert second.prior is blocks and second.gone == (blocks[2],)
    assert second.fresh == (second[2],)
    kept = [b for b in blocks if b not in second.gone] + list(second.fresh)
    assert sorted(map(id, kept)) == sorted(map(id, second))


def test_a_block_rule_over_the_fresh_records_answers_as_over_all() -> None:
    """A per-block rule is decided from the fresh records only when the last tuple passed,
    and says what a full evaluation says: a block breaking it later is found."""
    from invariants.checking.checker import Checker, Level
    from invariants.checking.loader import load_catalog

    rules = [r for r in load_catalog().rules if r.id == "vllm.ref_cnt_is_holders"]
    checker, pool = Checker(rules, Level.RECORD), PoolMirror()
    assert checker.check("step", state_view(pool.view(view(FIRST, whole=True)))) == ()
    assert checker.check("step", state_view(pool.view(view([[3, 0, "", False]])))) == ()
    (found,) = checker.check("step", state_view(pool.view(view([[1, 2, "", False]], [2, 3]))))
    assert found.invariant == "vllm.ref_cnt_is_holders" and "block 1" in found.message


TABLE_ROW = ["r1", "0:FullAttentionManager", 0, 0, 9, 4, 4, 3, [0], "attention", 0]


def test_tables_and_in_flight_reads_sent_as_rows_are_the_records_a_listing_gives() -> None:
    """Block tables and the step in flight's reads come as rows of their records' fields in
    order (``block_table_rows``, ``in_flight_rows``): the view gets the very records the
    same view listed field by field makes (lists become tuples), with or without block
    records."""
    fields, flight = list(BlockTableView._fields), ["r1", [5, 6], True, False, False]
    plain = PoolMirror().view(view(FIRST, whole=True))
    del plain["block_records"]
    listed = to_state_view(
        dict(
            plain,
            block_tables=[dict(zip(fields, TABLE_ROW))],
            in_flight_blocks=[dict(zip(InFlightView._fields, flight))],
        )
    )
    rows = {
        "block_table_rows": {"fields": fields, "rows": [TABLE_ROW]},
        "in_flight_rows": {"fields": InFlightView._fields, "rows": [flight]},
    }
    for raw in (PoolMirror().view(dict(view(FIRST, whole=True), **rows)), dict(plain, **rows)):
        got = state_view(raw)
        assert got.block_tables == listed.block_tables
        assert got.in_flight_blocks == listed.in_flight_blocks
        assert type(got.block_tables[0].null_blocks) is tuple


def test_rows_of_other_fields_or_lengths_are_an_error_naming_them() -> None:
    """A driver whose rows name other fields (a record that moved) or a row of another length
    is refused by name, never read into the wrong fields."""
    fields = list(BlockTableView._fields)
    renamed = {"fields": [*fields[:-1], "spec"], "rows": [TABLE_ROW]}
    with pytest.raises(ValueError, match=r"block_table_rows lists .*spec"):
        state_view(dict(PoolMirror().view(view(FIRST, whole=True)), block_table_rows=renamed))
    short = {"fields": fields, "rows": [TABLE_ROW[:-1]]}
    with pytest.raises(ValueError, match="block_table_rows has a row of other than 11 values"):
        state_view(dict(PoolMirror().view(view(FIRST, whole=True)), block_table_rows=short))


def test_in_flight_reads_sent_as_spans_are_the_tables_blocks_there() -> None:
    """A read the driver sends as spans (``in_flight_spans``: ``[row, [[group, start, stop],
    ...]]``) names the real blocks of the request's table in each group as the same view
    left it, in group order; a row sent by id is left as it is; under the cross-check a span
    that names other blocks than the ids read is the harness's error."""
    raw = view(FIRST, whole=True)
    raw["pool"] |= {"tables": [[0, "r1", 0, 0, [1, 2, 3]], [1, "r1", 0, 0, [3, 2]]]}
    raw["pool"]["kinds"] = {"r1": "req"}
    rows = [["r1", [], True, False, True], ["r2", [7], False, True, False]]
    spans = [[0, [[0, 1, 3], [1, 0, 1]]]]
    raw |= {"in_flight_rows": {"fields": InFlightView._fields, "rows": rows}}
    got = state_view(PoolMirror().view(dict(raw, in_flight_spans=spans)))
    assert [(f.rid, f.blocks) for f in got.in_flight_blocks] == [("r1", (2, 3, 3)), ("r2", (7,))]
    checked = dict(raw, in_flight_spans=spans, in_flight_check=[[2, 3, 3], [7]])
    assert state_view(PoolMirror().view(checked)).in_flight_blocks == got.in_flight_blocks
    with pytest.raises(AssertionError, match="rebuilt from spans differ"):
        PoolMirror().view(dict(checked, in_flight_check=[[2, 3], [7]]))


@given(
    st.lists(st.integers(0, 9), max_size=6),
    st.lists(st.integers(0, 9), max_size=6),
    st.booleans(),
)
def test_a_holders_array_grown_from_the_last_is_the_list_made_an_array(old, new, grows) -> None:
    """A holder's census array is built from the view before's where its list only grew
    (pool.py ``_grown``): whatever the two lists, it is the new list, in order."""
    blocks = old + new if grows else new
    last = (old, np.asarray(old, dtype=np.int64))
    assert pool_module._grown(blocks, last).tolist() == blocks
    assert pool_module._grown(blocks, None).tolist() == blocks


def test_a_read_its_table_still_holds_is_left_to_the_block_rules() -> None:
    """The step in flight reads blocks its request's table still holds there (``held``): the
    in-flight rule leaves them to the block rules, and a free one among them breaks those
    (it has a holder); a read not held is the in-flight rule's."""
    from invariants.checking.checker import Checker, Level
    from invariants.checking.loader import load_catalog

    checker = Checker(load_catalog().rules, Level.RECORD)
    blocks = (BlockView(0, is_null=True), BlockView(1, in_free_queue=True, holders=1))
    for held, expected in ((True, {"vllm.ref_cnt_is_holders"}), (False, set())):
        flight = (InFlightView("a", (1,), live=True, held=held),)
        found = {v.invariant for v in checker.check("step", _view(blocks, flight))}
        assert expected <= found and ("vllm.in_flight_blocks_not_free" in found) != held


def _view(blocks: tuple, flight: tuple):
    from engine.view import StateView

    return StateView(event="step", blocks=blocks, in_flight_blocks=flight)
