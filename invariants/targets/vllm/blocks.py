"""The vllm target's view as the checker reads it: the rest of the view decoded, then every
block's record attached as pool.py derived it (``block_records``: records.py), and the block
tables and the step in flight's reads, which the driver sends as rows of their records'
fields (``ROWS``).

Keeps: the records are exactly those a full listing would give (records.py rebuilds a block's
record whenever any field may have changed, and compares it); unchanged records are the very
objects of the view before, so a view costs the changes, not the pool. The records' tuple says
what changed (``prior``: the tuple handed out before, ``fresh``: the records built since,
``gone``: those they replaced), as the tree's node tuple does: a per-block rule is then
re-tested on the fresh records only (invariants/checking/memos.py).
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Any, get_origin, get_type_hints

from engine.view import BlockTableView, InFlightView, StateView
from invariants.targets.views import to_state_view


def state_view(raw: dict[str, Any]) -> StateView:
    """The view with its block records (where pool.py derived them), block tables and
    in-flight reads attached; a view without any of them decodes as it is."""
    found: dict[str, Any] = {
        f: _rows(raw, key, cls) for key, (f, cls) in ROWS.items() if key in raw
    }
    if "block_records" in raw:
        found["blocks"] = raw["block_records"]
    rest = {k: v for k, v in raw.items() if k not in ROWS and k != "block_records"}
    view = to_state_view(rest)
    return replace(view, **found) if found else view


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
