"""The census input of each pool sent as what changed since the driver's previous view: a pool's
free list and each owner's pages are long and mostly unchanged (a decode step appends one page
to each running row; an allocation takes pages off the front of the free list, a free appends
them), so a view ships the changes, not the pool. kvspec's side (targets/census_mirror.py)
rebuilds the exact input and takes the census from it as before. Shared by the drivers (SGLang's
scheduler and server, vLLM): runs inside the engine's venv; imports nothing of kvspec.

Keeps: a list ``new`` is sent as ``[s, k, tail]`` against the list ``old`` last sent, meaning
``new == old[s:s + k] + tail`` — any ``s``/``k`` the encoder finds is exact, the worst case
being ``[0, 0, new]``; an owner list as ``[label, s, k, tail]`` per owner, in the new order,
against the same label's last pages (labels repeated: the whole input is sent instead). Each
pool's encodings are numbered (``seq``) so the reader applies each once, in order; a view
copied into another (the session view of a step) carries the same number. Under
``KVSPEC_CROSSCHECK`` the whole input rides along, and kvspec compares. The input's other
fields — ``num_pages``, and ``slots_per_page`` where a driver says how many equal ids in a row
one holding lists (vLLM's lists a block once per holding) — ride along with each delta whole.
"""

from __future__ import annotations

import os

CROSSCHECK = os.environ.get("KVSPEC_CROSSCHECK", "") not in ("", "0")


def list_delta(old: list, new: list) -> list:
    """``[s, k, tail]`` with ``new == old[s:s + k] + tail`` (k as long as found)."""
    if old == new:  # most owners, most views (one comparison, no slices)
        return [0, len(old), []]
    if not old or not new:
        return [0, 0, new]
    try:
        start = old.index(new[0])
    except ValueError:
        return [0, 0, new]
    kept = _common_run(old, start, new)
    return [start, kept, new[kept:]]


def _common_run(old: list, start: int, new: list) -> int:
    """The longest ``n`` with ``old[start:start + n] == new[:n]`` (prefix equality is
    monotone in ``n``: checked whole first, else by bisection)."""
    lo, hi = 0, min(len(old) - start, len(new))
    if old[start : start + hi] == new[:hi]:
        return hi
    while lo < hi:  # old[start:start + lo] == new[:lo] holds, hi does not
        mid = (lo + hi + 1) // 2
        if old[start : start + mid] == new[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


LISTS = ("free_pages", "owned", "referenced")  # an input's lists (the rest is sent whole)


class CensusEncoder:
    """One trace's census inputs, per pool name: what was last sent, and its number."""

    def __init__(self) -> None:
        self.last: dict[str, dict] = {}
        self.seq: dict[str, int] = {}

    def encode(self, view: dict) -> dict:
        """``view`` with each pool's ``census_input`` replaced by ``census_delta``."""
        view["pools"] = [self._pool(pool) for pool in view["pools"]]
        return view

    def _pool(self, pool: dict) -> dict:
        name, full = pool["name"], pool.pop("census_input")
        old = self.last.get(name)
        seq = self.seq[name] = self.seq.get(name, 0) + 1
        delta: dict = {k: v for k, v in full.items() if k not in LISTS} | {"seq": seq}
        if old is None or not _labels_unique(full):
            delta["whole"] = full
        else:
            delta["free_pages"] = list_delta(old["free_pages"], full["free_pages"])
            for part in ("owned", "referenced"):
                delta[part] = _owners_delta(old[part], full[part])
        if CROSSCHECK:
            delta["check"] = full
        self.last[name] = full
        return dict(pool, census_delta=delta)


def _owners_delta(old: list, new: list) -> list:
    """(An owner whose pages are the very list sent before — a driver that keeps unchanged
    lists across views — costs no comparison.)"""
    before = dict(old)
    return [
        [label, 0, len(before[label]), []]
        if before.get(label) is pages
        else [label, *list_delta(before.get(label, []), pages)]
        for label, pages in new
    ]


def _labels_unique(census_input: dict) -> bool:
    return all(
        len({label for label, _ in census_input[part]}) == len(census_input[part])
        for part in ("owned", "referenced")
    )
