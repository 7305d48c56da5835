"""The vllm target's block records across one run: each view brings only the blocks whose
record changed since the run's previous view (``block_changes``: their ``BlockView``s in block
order, derived on this side from the driver's reads: pool.py, records.py); ``BlockMirror``
keeps every block's current ``BlockView`` and hands each view the whole tuple.

Keeps: the views the checker reads are exactly those a full listing would give (a block's
record is replaced whenever any field changed, and records.py compares every block it may have
changed at every view); unchanged records are the same objects, so a view costs the changes,
not the pool.
The tuple says what changed (``prior``: the tuple handed out before, ``fresh``: the records
built since, ``gone``: those they replaced), as the tree's node tuple does: a per-block rule
is then re-tested on the fresh records only (invariants/checking/memos.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any, get_origin, get_type_hints

from engine.mem.feed import ChangedTuple
from engine.view import BlockTableView, BlockView, InFlightView, StateView
from invariants.targets.views import to_state_view

Decode = Callable[[dict[str, Any]], StateView]


class BlockMirror:
    """One run's blocks by id (a new run — a new config op — needs a new mirror); ``decode``
    makes the rest of the view (the census mirror's, whose input comes as deltas too)."""

    def __init__(self, decode: Decode = to_state_view) -> None:
        self.decode = decode
        self.blocks: list[BlockView] = []
        self.handed: ChangedTuple[BlockView] | None = None

    def view(self, raw: dict[str, Any]) -> StateView:
        """The driver's view with the mirror brought up to date and every block attached (and
        its block tables and in-flight reads, sent as rows: ``ROWS``)."""
        rows: dict[str, Any] = {
            f: _rows(raw, key, cls) for key, (f, cls) in ROWS.items() if key in raw
        }
        rest = {k: v for k, v in raw.items() if k not in ROWS and k != "block_changes"}
        changes = raw.get("block_changes")
        if changes is None:
            view = self.decode(rest)
            return replace(view, **rows) if rows else view
        fresh, blocks = changes, self.blocks
        ids = [block.id for block in fresh]
        known = len(blocks)
        placeholders = self._grow(ids)
        gone = [blocks[i] for i in ids if i < known]
        for i, block in zip(ids, fresh):
            blocks[i] = block
        if placeholders:  # (block order, as the driver sends the changes)
            fresh = sorted(placeholders + fresh, key=lambda b: b.id)
        self.handed = ChangedTuple.of(self.blocks, self.handed, tuple(fresh), tuple(gone))
        return replace(self.decode(rest), blocks=self.handed, **rows)

    def _grow(self, ids: list[int]) -> list[BlockView]:
        """Room for the blocks ``ids`` lists past the known ones: a placeholder for each id
        in between that it does not list (a first view lists every block: none)."""
        start, last = len(self.blocks), max(ids, default=-1)
        if last < start:
            return []
        listed = set(ids)
        room = [_SLOT if i in listed else BlockView(i) for i in range(start, last + 1)]
        self.blocks.extend(room)  # (a listed id's slot is filled next)
        return [b for b in room if b is not _SLOT]


def _rows(raw: dict[str, Any], key: str, cls: type) -> tuple:
    """A view's records sent as rows (``{"fields", "rows"}``: the record's fields in order,
    each row its values; a list where the record holds a tuple), built at C speed, as the
    block records are; fields that are not the record's, or a row of another length, are an
    error naming them."""
    part, fields = raw[key], cls._fields  # type: ignore[attr-defined]
    if tuple(part["fields"]) != fields:
        raise ValueError(f"a driver view's {key} lists {part['fields']}, {cls.__name__} {fields}")
    rows = part["rows"]
    if any(len(row) != len(fields) for row in rows):
        raise ValueError(f"a driver view's {key} has a row of other than {len(fields)} values")
    columns: list[Any] = list(zip(*rows)) or [()] * len(fields)
    for i in _TUPLED[cls]:
        columns[i] = map(tuple, columns[i])
    return tuple(map(partial(tuple.__new__, cls), zip(*columns)))


# a view's records sent as rows: the key in the driver's view -> the StateView field and record
ROWS = {
    "block_table_rows": ("block_tables", BlockTableView),
    "in_flight_rows": ("in_flight_blocks", InFlightView),
}
_TUPLED = {  # each record's fields that hold a tuple (JSON sends a list), by position
    cls: [i for i, hint in enumerate(get_type_hints(cls).values()) if get_origin(hint) is tuple]
    for _, cls in ROWS.values()
}
_SLOT = BlockView(-1)  # a listed block's place between growing the mirror and filling it
