"""The vllm target's block records across one run: the driver sends, per view, only the
blocks whose record changed since its previous view (``block_changes``); ``BlockMirror``
keeps every block's current ``BlockView`` and hands each view the whole tuple.

Keeps: the views the checker reads are exactly those a full listing would give (a block's
record is replaced whenever any field changed, and the driver compares every block at every
view); unchanged records are the same objects, so a view costs the changes, not the pool.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from engine.view import BlockView, StateView
from invariants.targets.views import to_state_view


class BlockMirror:
    """One run's blocks by id (a new run — a new config op — needs a new mirror)."""

    def __init__(self) -> None:
        self.blocks: list[BlockView] = []

    def view(self, raw: dict[str, Any]) -> StateView:
        """The driver's view with the mirror brought up to date and every block attached."""
        changes = raw.get("block_changes")
        if changes is None:
            return to_state_view(raw)
        for row in changes:
            block = BlockView(row[0], row[1], row[2], row[3], tuple(row[4]), row[5], row[6])
            if block.id >= len(self.blocks):
                self.blocks.extend(BlockView(i) for i in range(len(self.blocks), block.id + 1))
            self.blocks[block.id] = block
        rest = {k: v for k, v in raw.items() if k != "block_changes"}
        return replace(to_state_view(rest), blocks=tuple(self.blocks))
