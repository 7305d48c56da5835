"""One run's census inputs rebuilt from the driver's deltas (driverlib/census_deltas.py), for
every real target: each pool's free list and owner pages as the driver last read them, brought
up to date by each view's ``census_delta`` and handed to ``to_state_view`` whole — the census
is then taken from them exactly as from a full listing.

Keeps: a delta applies once, in order (``seq`` one past the last; the same number again is a
view copied into another: the same input); a gap, or a slice reaching past what was sent, is a
harness error naming the pool. The input is kept as arrays (what the census reads), a delta
applied by slicing them: an owner or a free list that did not change is the very same array,
and a long free list is never converted again. Under cross-check the driver sends the whole
input too, and the rebuilt one must equal it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.observe.crosscheck import cross_check
from engine.view import StateView
from invariants.targets.views import to_state_view

PARTS = ("owned", "referenced")
Owner = tuple[str, np.ndarray]  # label, its pages


@dataclass(slots=True)
class _Input:
    """One pool's census input as last rebuilt (``seq``: the delta that made it)."""

    seq: int
    fields: dict[str, Any]  # its fields but the lists: num_pages, slots_per_page if sent
    free: np.ndarray
    owners: dict[str, list[Owner]]
    arrays: dict[str, Any] | None = None  # as_arrays', built once (a copied view reuses it)

    def as_arrays(self) -> dict[str, Any]:
        """The input ``to_state_view`` takes (pages as arrays)."""
        if self.arrays is None:
            parts = {p: [[label, arr] for label, arr in self.owners[p]] for p in PARTS}
            self.arrays = {**self.fields, "free_pages": self.free, **parts}
        return self.arrays

    def as_lists(self) -> dict[str, Any]:
        """The input as the driver lists it (what cross-check compares)."""
        parts = {p: [[label, arr.tolist()] for label, arr in self.owners[p]] for p in PARTS}
        return {**self.fields, "free_pages": self.free.tolist(), **parts}


class CensusMirror:
    """The census inputs of one run (a new run — a new config op — needs a new mirror)."""

    def __init__(self) -> None:
        self.inputs: dict[str, _Input] = {}

    def view(self, raw: dict[str, Any]) -> StateView:
        """The driver's view with every pool's census input rebuilt, as a StateView."""
        pools = raw.get("pools") or []
        if any("census_delta" in pool for pool in pools):
            raw = dict(raw, pools=[self._pool(pool) for pool in pools])
        return to_state_view(raw)

    def _pool(self, pool: dict[str, Any]) -> dict[str, Any]:
        if "census_delta" not in pool:
            return pool
        rest = {k: v for k, v in pool.items() if k != "census_delta"}
        rebuilt = self._rebuilt(pool["name"], pool["census_delta"])
        return dict(rest, census_input=rebuilt.as_arrays())

    def _rebuilt(self, name: str, delta: dict[str, Any]) -> _Input:
        last = self.inputs.get(name)
        seq = 0 if last is None else last.seq
        if delta["seq"] == seq and last is not None:
            return last  # the same view, copied
        if delta["seq"] != seq + 1:
            raise ValueError(f"pool {name}: census delta {delta['seq']} after {seq}")
        now = _whole(delta) if "whole" in delta else _applied(name, last, delta)
        if "check" in delta:
            cross_check(f"census input of pool {name} (rebuilt)", now.as_lists(), delta["check"])
        self.inputs[name] = now
        return now


def _whole(delta: dict[str, Any]) -> _Input:
    full = delta["whole"]
    owners = {p: [(label, _array(pages)) for label, pages in full[p]] for p in PARTS}
    return _Input(delta["seq"], _fields(full), _array(full["free_pages"]), owners)


def _applied(name: str, last: _Input | None, delta: dict[str, Any]) -> _Input:
    if last is None:
        raise ValueError(f"pool {name}: a census delta with nothing before it")
    free = _sliced(name, last.free, *delta["free_pages"])
    owners = {p: _owners(name, last.owners[p], delta[p]) for p in PARTS}
    return _Input(delta["seq"], _fields(delta), free, owners)


def _fields(raw: dict[str, Any]) -> dict[str, Any]:
    """An input's fields but its lists (a delta's: but its lists, its number, its check)."""
    return {k: v for k, v in raw.items() if k not in _NOT_FIELDS}


_NOT_FIELDS = frozenset(("free_pages", *PARTS, "seq", "whole", "check"))


def _owners(name: str, last: list[Owner], changes: list[list[Any]]) -> list[Owner]:
    before = dict(last)
    return [
        (label, _sliced(name, before.get(label, _EMPTY), start, kept, tail))
        for label, start, kept, tail in changes
    ]


def _sliced(name: str, old: np.ndarray, start: int, kept: int, tail: list[int]) -> np.ndarray:
    """``old[start:start + kept] + tail`` (``old`` itself when that is all of it)."""
    if start < 0 or kept < 0 or start + kept > len(old):
        raise ValueError(
            f"pool {name}: census delta slices [{start}, {start + kept}) of {len(old)}"
        )
    if not tail:
        return old if kept == len(old) else old[start : start + kept]
    return np.concatenate((old[start : start + kept], _array(tail)))


def _array(pages: list[int]) -> np.ndarray:
    return np.asarray(pages, dtype=np.int64)


_EMPTY = _array([])
