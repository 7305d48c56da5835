"""The vllm target's incremental block records (invariants/targets/vllm/blocks.py): a view carries
only the blocks whose record changed; the mirror hands the checker every block, each as the
driver last described it — the same views a full listing would give."""

from __future__ import annotations

from typing import Any

from engine.view import BlockView
from invariants.targets.vllm.blocks import BlockMirror


def raw(changes: list[list[Any]]) -> dict[str, Any]:
    pool = {
        "name": "full", "page_size": 1, "capacity": 3, "free": 3,
        "census_input": {"num_pages": 3, "free_pages": [1, 2, 3], "owned": [], "referenced": []},
    }  # fmt: skip
    return {"event": "step", "step": 1, "page_size": 1, "pools": [pool], "block_changes": changes}


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
