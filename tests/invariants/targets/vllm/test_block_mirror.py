"""The vllm target's incremental block records (invariants/targets/vllm/blocks.py): a view carries
only the blocks whose record changed; the mirror hands the checker every block, each as last
derived — the same views a full listing would give."""

from __future__ import annotations

from typing import Any

import pytest

from engine.view import BlockTableView, BlockView
from invariants.targets.views import to_state_view
from invariants.targets.vllm.blocks import BlockMirror


def raw(changes: list[list[Any]]) -> dict[str, Any]:
    """A view whose changed blocks are ``changes`` (records' fields in order, as pool.py
    hands them: ``BlockView``s)."""
    pool = {
        "name": "full", "page_size": 1, "capacity": 3, "free": 3,
        "census_input": {"num_pages": 3, "free_pages": [1, 2, 3], "owned": [], "referenced": []},
    }  # fmt: skip
    records = [BlockView(*c[:4], tuple(c[4]), *c[5:]) for c in changes]
    return {"event": "step", "step": 1, "page_size": 1, "pools": [pool], "block_changes": records}


def test_changed_blocks_replace_their_records_and_the_rest_stay() -> None:
    """The first view lists every block; the next changes block 2 only: blocks 0, 1 and 3
    are the same objects, block 2 the new record."""
    mirror = BlockMirror()
    first = mirror.view(raw([
        [0, 0, False, "", [], 0, True], [1, 0, True, "", [], 0, False],
        [2, 0, True, "", [], 0, False], [3, 0, True, "", [], 0, False],
    ]))  # fmt: skip
    assert [b.id for b in first.blocks] == [0, 1, 2, 3] and first.blocks[0].is_null
    second = mirror.view(raw([[2, 1, False, "ab12", ["ab12"], 1, False]]))
    assert second.blocks[2] == BlockView(2, 1, False, "ab12", ("ab12",), 1, False)
    assert all(second.blocks[i] is first.blocks[i] for i in (0, 1, 3))
    assert mirror.view(raw([])).blocks == second.blocks  # nothing changed: the same records


def test_a_view_without_changes_is_an_ordinary_view() -> None:
    """Other targets' views (no ``block_changes``) pass through unchanged: no blocks."""
    plain = raw([])
    del plain["block_changes"]
    assert BlockMirror().view(plain).blocks == ()


def test_each_tuple_names_what_changed_since_the_one_before() -> None:
    """``prior`` is the tuple handed out before, ``fresh`` the records built since (a first
    view's placeholders replaced in it are not among them), ``gone`` those they replaced: the
    tuple is ``prior`` - ``gone`` + ``fresh``, what lets a block rule re-test only ``fresh``."""
    mirror = BlockMirror()
    first = mirror.view(raw([[0, 0, False, "", [], 0, True], [2, 0, True, "", [], 0, False]]))
    blocks = first.blocks
    assert [b.id for b in blocks.fresh] == [0, 1, 2] and blocks.gone == ()  # 1: a placeholder
    second = mirror.view(raw([[2, 1, False, "", [], 1, False]])).blocks
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
    checker, mirror = Checker(rules, Level.RECORD), BlockMirror()
    good = [[0, 0, False, "", [], 0, True], [1, 1, False, "", [], 1, False]]
    assert checker.check("step", mirror.view(raw(good))) == ()
    assert checker.check("step", mirror.view(raw([[2, 0, True, "", [], 0, False]]))) == ()
    (found,) = checker.check("step", mirror.view(raw([[1, 2, False, "", [], 1, False]])))
    assert found.invariant == "vllm.ref_cnt_is_holders" and "block 1" in found.message


TABLE_ROW = ["r1", "0:FullAttentionManager", 0, 0, 9, 4, 4, 3, [0], "attention", 0]


def test_tables_and_in_flight_reads_sent_as_rows_are_the_records_a_listing_gives() -> None:
    """Block tables and the step in flight's reads come as rows of their records' fields in
    order (``block_table_rows``, ``in_flight_rows``): the mirror makes the very records the
    same view listed field by field makes (lists become tuples), with or without block
    changes."""
    fields, flight = list(BlockTableView._fields), ["r1", [5, 6], True, False]
    plain = {k: v for k, v in raw([]).items() if k != "block_changes"}
    listed = to_state_view(
        dict(
            plain,
            block_tables=[dict(zip(fields, TABLE_ROW))],
            in_flight_blocks=[dict(zip(["rid", "blocks", "live", "fenced"], flight))],
        )
    )
    rows = {
        "block_table_rows": {"fields": fields, "rows": [TABLE_ROW]},
        "in_flight_rows": {"fields": ["rid", "blocks", "live", "fenced"], "rows": [flight]},
    }
    for view in (dict(raw([]), **rows), dict(plain, **rows)):
        got = BlockMirror().view(view)
        assert got.block_tables == listed.block_tables
        assert got.in_flight_blocks == listed.in_flight_blocks
        assert type(got.block_tables[0].null_blocks) is tuple


def test_rows_of_other_fields_or_lengths_are_an_error_naming_them() -> None:
    """A driver whose rows name other fields (a record that moved) or a row of another length
    is refused by name, never read into the wrong fields."""
    fields = list(BlockTableView._fields)
    renamed = {"fields": [*fields[:-1], "spec"], "rows": [TABLE_ROW]}
    with pytest.raises(ValueError, match=r"block_table_rows lists .*spec"):
        BlockMirror().view(dict(raw([]), block_table_rows=renamed))
    short = {"fields": fields, "rows": [TABLE_ROW[:-1]]}
    with pytest.raises(ValueError, match="block_table_rows has a row of other than 11 values"):
        BlockMirror().view(dict(raw([]), block_table_rows=short))
