"""Each block's record as kvspec's ``BlockView`` lists it — ``(id, ref_cnt, in_free_queue, hash,
mapped_as, holders, is_null)`` — kept across one run's views, so that a view lists only the
records that changed (``block_changes``, as seven columns in that order: kvspec's side keeps the
rest, invariants/targets/vllm/blocks.py). Runs inside the vllm venv.

Keeps: at every view a record is rebuilt for each block vLLM wrote (writes.py), each block whose
free-queue membership or holder count changed (the free queue's walk is read whole at every view
and compared; a holder is recounted when one of its tables is not the very same as the view
before), and each block listed under a hash-map key vLLM wrote (that key re-read) — every other
block's fields, and so its record, are as they were. The pool's buckets (evictable, protected,
request-owned, the census's cache owner) are sets kept from the changed records too. Without a
recording (a release lacking the hooked classes) or once the map was replaced
(``reset_prefix_cache``), every block is read. Under ``KVSPEC_CROSSCHECK`` every view reads every
block too and must agree: a difference is the driver's error, never a finding.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from itertools import compress, repeat
from operator import and_, attrgetter, ne, not_

from census_deltas import list_delta

CROSSCHECK = os.environ.get("KVSPEC_CROSSCHECK", "") not in ("", "0")


class _Hexes(dict):
    """A block hash (immutable bytes) -> its short hex, each computed once; None -> ""."""

    def __missing__(self, h) -> str:
        text = self[h] = bytes(h).hex()[:24]
        return text


_HEX = _Hexes({None: ""})
hex_of = _HEX.__getitem__  # (a dict's lookup: a column of hashes maps at C speed)


def block_ids(entry) -> tuple[int, ...]:
    """The blocks a hash-map entry lists (one block, or a dict of them by id)."""
    if entry is None:
        return ()
    return (entry.block_id,) if hasattr(entry, "block_id") else tuple(entry)


def read_map(hash_map) -> tuple[dict[int, set], dict]:
    """Every block's keys in the hash map, and every key's block ids."""
    keys: dict[int, set] = {}
    under = {}
    for key, entry in hash_map._cache.items():
        under[key] = ids = block_ids(entry)
        for b in ids:
            keys.setdefault(b, set()).add(key)
    return keys, under


def mapped_as(keys: Iterable) -> list[str]:
    """The record's ``mapped_as``: the short hexes of a block's keys, sorted (two keys can share
    one: the same hash in two KV groups)."""
    return sorted(set(map(hex_of, keys)))


def _rows(blocks: list, ids: list[int], free: set[int], holders: dict, mapped: dict) -> list:
    """The records of ``blocks`` (ids ``ids``), read a field at a time: a block size of 1
    changes hundreds a step."""
    return list(
        zip(
            ids,
            map(attrgetter("ref_cnt"), blocks),
            map(free.__contains__, ids),
            map(hex_of, map(attrgetter("block_hash"), blocks)),
            map(mapped.get, ids, repeat(_UNMAPPED)),
            map(holders.get, ids, repeat(0)),
            map(attrgetter("is_null"), blocks),
        )
    )


_UNMAPPED: list[str] = []  # (shared by every record of a block no key lists: never changed)


def count_holders(held: dict) -> dict[int, int]:
    holders: dict[int, int] = {}
    for blocks in held.values():
        for b in blocks:
            holders[b] = holders.get(b, 0) + 1
    return holders


def table_change(old: list[int], new: list[int]) -> tuple[list[int], list[int]]:
    """(blocks added, blocks dropped) from ``old`` to ``new``, as multisets: a table grows or
    shrinks at its end, and a sliding window or an attention chunk drops its first blocks
    (a few comparisons); anything else is counted whole."""
    if new[: len(old)] == old:
        return new[len(old) :], []
    if old[: len(new)] == new:
        return [], old[len(new) :]
    try:
        start = old.index(new[0])
    except (IndexError, ValueError):
        return new, old
    kept = len(old) - start
    return (new[kept:], old[:start]) if old[start:] == new[:kept] else (new, old)


BUCKETS = ("null", "hashed", "evictable", "protected", "request_owned", "cache")


def buckets_of(rows: Iterable[tuple]) -> dict[str, set[int]]:
    """Each bucket's blocks from whole records, a record at a time (what the kept sets must
    equal under cross-check)."""
    out: dict[str, set[int]] = {name: set() for name in BUCKETS}
    for i, ref_cnt, free, hashed, _, holders, is_null in rows:
        tests = (
            is_null,
            hashed,
            free and hashed,
            ref_cnt > 0 and hashed,
            ref_cnt > 0 and not hashed,
            hashed and holders > 0 and not free,
        )
        for name, test in zip(BUCKETS, tests):
            if test and (name == "null" or not is_null):
                out[name].add(i)
    return out


class Records:
    """One run's block records as last sent, with the sets the pool's counters are sums of."""

    def __init__(self, writes) -> None:
        self.writes = writes  # writes.Writes, or None: read every block at every view
        self.rows: dict[int, tuple] = {}
        self.walk: list[int] = []  # the free queue as last walked
        self.free: set[int] = set()  # its blocks (kept from the walks' changes)
        self.tables: dict = {}  # each table as last read (views.read_tables)
        self.joined: dict = {}  # each holder's blocks over its groups, as last joined (views)
        self.owned: dict = {}  # each owner's blocks no hash covers, as last filtered (views)
        self.held: dict = {}  # each holding's blocks as last read (views.holdings)
        self.holders: dict[int, int] = {}  # their count per block, kept with them
        self.map = None  # the hash map read last (a new one: reset_prefix_cache)
        self.keys: dict[int, set] = {}  # each listed block's keys
        self.mapped: dict[int, list[str]] = {}  # ... and its mapped_as
        self.under: dict = {}
        # the real (not null) blocks in each of the pool's buckets, kept from the changed
        # records (a bucket is a test of one record: the pool's counters are their sizes)
        self.null: set[int] = set()
        self.hashed: set[int] = set()  # with a hash
        self.evictable: set[int] = set()  # ... in the free queue
        self.protected: set[int] = set()  # ... with ref_cnt > 0
        self.request_owned: set[int] = set()  # ref_cnt > 0, no hash
        self.cache: set[int] = set()  # with a hash, held, not free: the census's cache owner
        self.toggled: set[int] = set()  # the blocks whose hash came or went at the last view
        self.cached: list[int] | None = []  # the cache's blocks sorted (None: sort them again)

    def changes(self, pool, walk: list[int], held: dict, moved: set) -> list:
        """The records that changed since the last call, in block order, as columns (none
        changed: an empty list); ``moved``: the keys of ``held`` whose blocks may differ from
        the last call's (every other holding is the very same)."""
        dirty = sorted(self._dirty(pool, walk, held, moved))
        free, rows = self.free, self.rows
        blocks = list(map(pool.blocks.__getitem__, dirty))
        fresh = _rows(blocks, dirty, free, self.holders, self.mapped)
        changed = list(compress(fresh, map(ne, fresh, map(rows.get, dirty))))  # (at C speed)
        columns = [list(column) for column in zip(*changed)]
        self.toggled = set()
        if columns:
            rows.update(zip(columns[0], changed))
            self._index(columns)
        if CROSSCHECK:
            self._cross_check(pool, walk, self.holders)
        return columns

    def _dirty(self, pool, walk: list[int], held: dict, moved: set) -> Iterable[int]:
        written, keys = self.writes.take() if self.writes is not None else (None, ())
        counted, queued = self._recount(held, moved), self._refree(walk)
        if written is None or pool.cached_block_hash_to_block is not self.map:
            self.map = pool.cached_block_hash_to_block
            self.keys, self.under = read_map(self.map)
            self.mapped = {b: mapped_as(listed) for b, listed in self.keys.items()}
            return range(len(pool.blocks))
        written.discard(-1)  # the free queue's fake head and tail (never but by their links)
        return written | queued | counted | self._remap(keys)

    def _refree(self, walk: list[int]) -> set[int]:
        """Bring the free set up to date with the walk: the blocks that joined or left it.
        The queue loses blocks at its front and gains them at its end, so the walk is matched
        against the last as ``old[s:s + k] + tail`` (census_deltas.list_delta) and, when most
        of it kept its order, only what left or came is touched, not the pool; otherwise (a
        prefix hit takes blocks from the middle, a double free lists one twice) the set is
        taken whole."""
        old, self.walk = self.walk, walk
        if len(self.free) == len(old):  # the last walk listed no block twice
            start, kept, came = list_delta(old, walk)
            if 2 * kept >= len(walk):
                gone = old[:start] + old[start + kept :]
                self.free.difference_update(gone)
                self.free.update(came)
                if len(self.free) == len(walk):
                    return set(gone).symmetric_difference(came)
                self.free = set(old)  # the walk lists a block twice: as the last walk was
        fresh = set(walk)
        moved, self.free = fresh.symmetric_difference(self.free), fresh
        return moved

    def _recount(self, held: dict, keys: set) -> set[int]:
        """Bring the holder counts up to date with the holdings ``keys`` names (those that
        may have changed): the blocks whose count moved."""
        before, holders, moved = self.held, self.holders, set()
        for rid in keys | (before.keys() - held.keys()):  # (and every holding gone)
            old, new = before.get(rid, []), held.get(rid, [])
            if old == new:
                continue
            added, dropped = table_change(old, new)
            for blocks, step in ((added, 1), (dropped, -1)):
                for b in blocks:
                    holders[b] = holders.get(b, 0) + step
                    if not holders[b]:
                        del holders[b]
                moved.update(blocks)
        self.held = held
        return moved

    def _remap(self, keys: Iterable) -> set[int]:
        """Re-read the written keys: the blocks listed under them before or now, whose keys
        and ``mapped_as`` are brought up to date (by whole keys: two keys sharing a short hex
        are two keys here)."""
        cache, under, listed, touched = self.map._cache, self.under, self.keys, set()
        for key in keys:
            before, now = under.pop(key, ()), block_ids(cache.get(key))
            for b in before:
                listed[b].discard(key)
            for b in now:
                listed.setdefault(b, set()).add(key)
            if now:
                under[key] = now
            touched.update(before, now)
        for b in touched:
            if listed.get(b):
                self.mapped[b] = mapped_as(listed[b])
            else:
                listed.pop(b, None)
                self.mapped.pop(b, None)
        return touched

    def _index(self, columns: list[list]) -> None:
        """The buckets brought up to date with the changed records (as columns, each test
        at C speed); ``toggled``: the changed blocks whose hash came or went."""
        ids, ref_cnt, free, hashes, _, holders, is_null = columns
        self.toggled = self.hashed.intersection(ids)
        cache_moved = not self.cache.isdisjoint(ids)
        buckets = (self.null, self.hashed, self.evictable, self.protected, self.request_owned)
        for members in (*buckets, self.cache):
            members.difference_update(ids)
        real = list(map(not_, is_null))
        hashed = list(map(and_, map(bool, hashes), real))
        in_use = list(map(and_, map((0).__lt__, ref_cnt), real))
        unfree = list(map(not_, free))
        self.null.update(compress(ids, is_null))
        self.hashed.update(compress(ids, hashed))
        self.evictable.update(compress(ids, map(and_, free, hashed)))
        self.protected.update(compress(ids, map(and_, in_use, hashed)))
        self.request_owned.update(compress(ids, map(and_, in_use, map(not_, hashed))))
        held = map(and_, map((0).__lt__, holders), unfree)
        self.cache.update(compress(ids, map(and_, held, hashed)))
        self.toggled.symmetric_difference_update(self.hashed.intersection(ids))
        if cache_moved or not self.cache.isdisjoint(ids):
            self.cached = None

    def cache_blocks(self) -> list[int]:
        """The census's cache owner: blocks with a hash some holder holds, not free, sorted
        (again only when one of them changed)."""
        if self.cached is None:
            self.cached = sorted(self.cache)
        return self.cached

    def buckets(self) -> dict[str, set[int]]:
        return {name: getattr(self, name) for name in BUCKETS}

    def _cross_check(self, pool, walk: list[int], holders: dict[int, int]) -> None:
        keys, free = read_map(pool.cached_block_hash_to_block)[0], set(walk)
        mapped = {b: mapped_as(listed) for b, listed in keys.items()}
        if count_holders(self.held) != holders:
            raise AssertionError("holder counts kept incrementally differ from the tables'")
        if free != self.free:
            raise AssertionError("the free set kept incrementally differs from the walk's")
        ids = [b.block_id for b in pool.blocks]
        full = dict(zip(ids, _rows(pool.blocks, ids, free, holders, mapped)))
        if full != self.rows:
            wrong = sorted(
                i for i in full.keys() | self.rows.keys() if full.get(i) != self.rows.get(i)
            )
            wrong = [(i, full.get(i), self.rows.get(i)) for i in wrong[:4]]  # (id, full, kept)
            raise AssertionError(f"block records read incrementally differ at blocks {wrong}")
        if buckets_of(full.values()) != self.buckets():
            raise AssertionError("the pool's buckets kept incrementally differ from its blocks'")
        if self.cached not in (None, sorted(self.cache)):
            raise AssertionError("the cache's blocks as kept sorted differ from the cache's")
