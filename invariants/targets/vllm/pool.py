"""The vllm target's block pool rebuilt on kvspec's side from what the driver read (its view's
``pool``: driver/pool_reads.py) — the blocks, free-queue links and hash-map keys vLLM wrote,
each table, each holder's kind — and everything that follows from it derived here: each
block's record (records.py), the pool's counters and the census input by block id: the view
goes on with ``pools`` (the census input's blocks as arrays, what the census reads) and
``block_records`` (blocks.py hands them to the checker).

Keeps: the driver's process is the engine's, so it only reads; the derivation runs here, beside
the engine, while the driver runs the next step. The counters are vLLM's own free count and
its ref counts — free + evictable is ``num_free_blocks``, protected / request-owned the blocks
with ref_cnt > 0 with / without a hash — so their sum equals the capacity only if vLLM's
counter and its ref counts agree; the census input lists raw block ids, each once per holding:
the free queue as walked from its links (free_queue.py), each holder's blocks over its KV-cache
groups — a request (``req:``), one whose blocks await a connector load (``load:``) or a send
(``send:``), each batch of frees deferred past the step in flight (``deferred:``) — and, as
owners, the cache (blocks with a hash some holder holds, not free) and each holder's blocks no
hash covers. The step in flight's reads the driver sent as spans of a request's table are
listed by id from the tables as this view left them (driver/in_flight.py).
A holder's joined list (its one table's list itself, for a request with one group) is built
again only when one of its tables moved, and its array then grown from the last where the
list only grew, else made again; its unhashed blocks and the cache are taken from the pool's
flags by block id at every view (buckets.py: numpy over the array). Under
``KVSPEC_CROSSCHECK`` the rebuilt walk, tables, kinds and arrays must equal the driver's
whole reads.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from invariants.targets.vllm.records import Records, sliced

Key = tuple[int, str]  # a table's: (KV-cache group, request id)


class PoolMirror:
    """One run's pool as the driver read it (a new run — a new config op — needs a new one)."""

    def __init__(self) -> None:
        self.records = Records()  # (the free queue among what it keeps)
        self.arrays: dict[str, tuple[list[int], np.ndarray]] = {}  # holder: list, as array
        self.tables: dict[Key, list[int]] = {}  # each table's real blocks
        self.groups: dict[str, list[int]] = {}  # each request's groups with a table, sorted
        self.kinds: dict[str, str] = {}  # each request's holder kind
        self.fenced: dict[str, list[int]] = {}  # each batch of deferred frees
        self.joined: dict[str, list[int]] = {}  # each request's blocks over its groups

    def view(self, raw: dict[str, Any]) -> dict[str, Any]:
        """The driver's view with its ``pool`` reads turned into ``pools`` (the counters and
        the census input) and ``block_records`` (every block's, naming those that changed)."""
        raw = dict(raw)
        read, page_size = raw.pop("pool"), raw["page_size"]
        moved = self._retable(read["tables"])
        rebuilt = {rid for _, rid in moved}
        fenced = self.fenced = read["fenced"]
        held: dict[Any, list[int]] = {**self.tables, **fenced}
        if read["kinds"] is not None:
            self.kinds = read["kinds"]
        if "check" in read:
            self._cross_check(read["check"])
        raw["block_records"] = self.records.changes(read, held, moved | fenced.keys())
        raw["pools"] = [self._pool(read, page_size, rebuilt)]
        if "check" in read and any(a.tolist() != b for b, a in self.arrays.values()):
            raise AssertionError("a holder's array grown from the view before differs")
        spans = raw.pop("in_flight_spans", None)
        if spans:
            raw["in_flight_rows"] = self._spanned(raw["in_flight_rows"], spans)
        if "in_flight_check" in raw:
            _check_in_flight(raw["in_flight_rows"], raw.pop("in_flight_check"))
        return raw

    def _spanned(self, part: dict[str, Any], spans: list) -> dict[str, Any]:
        """The step in flight's reads with each one sent as spans (``[row, [[group, start,
        stop], ...]]``: of the real blocks of the request's table there, as this view left
        them) listed by id, in group order (driver/in_flight.py)."""
        rows, tables = list(part["rows"]), self.tables
        for at, pieces in spans:
            rid, *rest = rows[at]
            blocks: list[int] = []
            for group, start, stop in pieces:
                blocks += tables[group, rid][start:stop]
            rest[0] = blocks
            rows[at] = [rid, *rest]
        return dict(part, rows=rows)

    def _retable(self, changes: list[list[Any]]) -> set[Key]:
        """Apply the moved tables (``[group, rid, start, kept, tail]``; gone: ``[group,
        rid]``): their keys."""
        moved: set[Key] = set()
        for group, rid, *delta in changes:
            key = (group, rid)
            moved.add(key)
            groups = self.groups.setdefault(rid, [])
            if delta:
                self.tables[key] = sliced(self.tables.get(key, []), *delta)
                if group not in groups:
                    groups.append(group)
                    groups.sort()
                continue
            self.tables.pop(key, None)
            groups.remove(group)
            if not groups:
                del self.groups[rid]
        return moved

    def _pool(self, read: dict[str, Any], page_size: int, rebuilt: set[str]) -> dict[str, Any]:
        flags, bs = self.records.flags, page_size
        counts = flags.counts()
        live, evictable = read["num_blocks"] - counts["null"], counts["evictable"]
        referenced = self._as_arrays(self._holders(rebuilt))
        owned = [["cache", flags.cache()]]  # (then each holder's blocks no hash covers)
        owned += ([owner, flags.unhashed(blocks)] for owner, blocks in referenced)
        return {
            "name": "full",
            "page_size": bs,
            "capacity": live * bs,
            "free": (read["num_free_blocks"] - evictable) * bs,
            "evictable": evictable * bs,
            "protected": counts["protected"] * bs,
            "request_owned": counts["request_owned"] * bs,
            "census_input": {
                "num_pages": live,
                "slots_per_page": 1,  # a block is listed once per holding, whatever its size
                "free_pages": self.records.queue.walk,
                "owned": owned,
                "referenced": referenced,
            },
        }

    def _as_arrays(self, held: dict[str, list[int]]) -> list[list]:
        """Each holder with its blocks as an array (what the census reads): the array of the
        view before where the list is the very same (a holder none of whose tables moved),
        that array and the new blocks' where the list only grew (at block size 1 a running
        request's table grows by a block a step: no list of thousands made an array again),
        else made again."""
        last, now = self.arrays, {}
        for owner, blocks in held.items():
            kept = last.get(owner)
            if kept is None or kept[0] is not blocks:
                kept = (blocks, _grown(blocks, kept))
            now[owner] = kept
        self.arrays = now
        return [[owner, array] for owner, (_, array) in now.items()]

    def _holders(self, rebuilt: set[str]) -> dict[str, list[int]]:
        """Each holder's blocks over its KV-cache groups by owner label (the very list of the
        view before for a request none of whose tables moved), then the deferred frees."""
        last, tables = self.joined, self.tables
        joined: dict[str, list[int]] = {}
        for rid, groups in self.groups.items():
            if len(groups) == 1:  # (its one table's list itself: lists are never changed)
                joined[rid] = tables[groups[0], rid]
            elif rid in rebuilt or rid not in last:
                blocks = joined[rid] = []
                for group in groups:
                    blocks += tables[group, rid]
            else:
                joined[rid] = last[rid]
        self.joined, kinds = joined, self.kinds
        return {f"{kinds[rid]}:{rid}": blocks for rid, blocks in joined.items()} | self.fenced

    def _cross_check(self, check: dict[str, Any]) -> None:
        tables = sorted([*key, blocks] for key, blocks in self.tables.items())
        for what, kept, whole in (
            ("block tables", tables, check["tables"]),
            ("holder kinds", self.kinds, check["kinds"]),
        ):
            if kept != whole:
                raise AssertionError(f"the {what} rebuilt from the driver's deltas differ")


def _grown(blocks: list[int], last: tuple[list[int], np.ndarray] | None) -> np.ndarray:
    """``blocks`` as an array, from ``last`` (a list and its array) where ``blocks`` only
    added to the end of that list (compared at C speed, the ids mostly the very objects)."""
    if last is not None and len(blocks) > len(last[0]) and blocks[: len(last[0])] == last[0]:
        added = np.asarray(blocks[len(last[0]) :], dtype=np.int64)
        return np.concatenate((last[1], added))
    return np.asarray(blocks, dtype=np.int64)


def _check_in_flight(part: dict[str, Any], ids: list[list[int]]) -> None:
    if [list(row[1]) for row in part["rows"]] != ids:
        raise AssertionError("the step in flight's reads rebuilt from spans differ from its ids")
