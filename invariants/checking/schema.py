"""Catalog file schema: pydantic models for invariant entries and fixture views.

Keeps: a catalog entry has exactly the documented keys (extra keys are errors, so typos fail at
load) and a fixture view names only StateView fields (docs/design.md §5).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from functools import cache
from typing import Any, Literal, get_args, get_origin, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from engine.view import StateView, is_record, record_fields

# the engine's events (engine/hooks.py), then ``crash``: the harness's, when an engine
# operation raised (the view is the state at that moment, with the exception in ``crash``)
EVENTS: tuple[str, ...] = (
    "schedule", "forward", "process", "step", "idle", "session", "response", "crash",
)  # fmt: skip
Event = Literal["schedule", "forward", "process", "step", "idle", "session", "response", "crash"]
ID_PATTERN = r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$"  # dotted lowercase: pool.busy_sum

Loc = tuple[str | int, ...]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FixtureSpec(_Strict):
    """One fixture: the event and a partial StateView (plus an optional previous view)."""

    event: Event
    view: dict[str, Any] = Field(default_factory=dict)
    prev: dict[str, Any] | None = None


class FixturesSpec(_Strict):
    """The passing and the failing fixture every invariant ships."""

    pass_: FixtureSpec = Field(alias="pass")
    fail: FixtureSpec


class InvariantSpec(_Strict):
    """One catalog entry, as written in YAML."""

    id: str = Field(pattern=ID_PATTERN)
    title: str = Field(min_length=1)
    when: list[Event] = Field(min_length=1)
    for_each: str | None = None
    where: str | None = None
    expr: str = Field(min_length=1)
    message: str = Field(min_length=1)
    origin: list[str] = Field(default_factory=list)
    for_steps: int = Field(default=0, ge=0)
    fixtures: FixturesSpec


class CatalogFileSpec(_Strict):
    """A catalog file: a version and a list of entries (validated one by one)."""

    version: Literal[1]
    invariants: list[Any] = Field(min_length=1)


@cache
def _state_adapter() -> TypeAdapter[StateView]:
    return TypeAdapter(StateView)


@cache
def _fields(cls: type) -> dict[str, tuple[type | None, bool]]:
    """A view record's fields → (the record type it holds, or None for a plain value;
    whether it holds a tuple of them). Resolved once per class: a target's views are checked
    by the thousand, each with a record per request and tree node."""
    fields: dict[str, tuple[type | None, bool]] = {}
    for key, hint in get_type_hints(cls).items():
        if is_record(hint):
            fields[key] = (hint, False)
        elif get_origin(hint) is tuple and is_record(get_args(hint)[0]):
            fields[key] = (get_args(hint)[0], True)
        else:
            fields[key] = (None, False)
    return fields


def unknown_view_keys(data: Any, cls: type = StateView, loc: Loc = ()) -> Iterator[tuple[Loc, str]]:
    """(location, reason) for every key that is not a field of its view record (a dataclass,
    or the NamedTuple ReqView).

    pydantic ignores extra keys on stdlib dataclasses, and view.py is frozen, so walk it here.
    A list's records of plain fields whose keys are all their own pass at C speed (a target's
    views hold a record per request and group, by the thousand).
    """
    if not isinstance(data, Mapping):
        return
    fields = _fields(cls)
    for key, value in data.items():
        if key not in fields:
            names = ", ".join(record_fields(cls))
            yield loc + (key,), f"unknown key '{key}' in {cls.__name__} (fields: {names})"
            continue
        record, many = fields[key]
        if record is None:
            continue
        if not many:
            yield from unknown_view_keys(value, record, loc + (key,))
        elif isinstance(value, list):
            own = _fields(record).keys() if _flat(record) else None
            for i, item in enumerate(value):
                if own is None or type(item) is not dict or not own >= item.keys():
                    yield from unknown_view_keys(item, record, loc + (key, i))


@cache
def _flat(cls: type) -> bool:
    """Whether none of a view record's fields holds a record."""
    return all(record is None for record, _ in _fields(cls).values())


def build_view(data: Mapping[str, Any], event: str) -> StateView:
    """A StateView from plain data; `event` fills the view's event unless the data names one.

    Raises pydantic.ValidationError (with locations) for values of the wrong type.
    """
    return _state_adapter().validate_python({"event": event, **data})
