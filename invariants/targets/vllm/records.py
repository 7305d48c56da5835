"""Each block's record as kvspec's ``BlockView`` lists it — ``(id, ref_cnt, in_free_queue, hash,
mapped_as, holders, is_null)`` — kept across one run's views from what the vllm driver read
(its ``pool``: driver/pool_reads.py), so that a view hands on only the records that changed
(``block_changes``: their ``BlockView``s, the rest the very objects of the view before), with
the pool's buckets the counters are sums of.

Keeps: at every view a record is rebuilt for each block the driver re-read (those vLLM wrote),
each block whose free-queue membership or holder count changed (the free queue is walked
from the links vLLM wrote: free_queue.py; a holder is recounted when one of its tables
moved), and each block listed under a hash-map key vLLM wrote — every other block's fields,
and so its record, are as they were. The buckets (evictable, protected, request-owned, the
census's cache owner) are flags by block id written from the changed records (buckets.py);
the hash-map keys are taken in at C speed where each lists one block (at block size 1, all
but a few). A hash comes as its number in the run (a key too: two keys with one short hex
are two numbers), each number's short hex once (``shorts``). A ``whole`` read (a run's
first view, a release without the write hooks, a replaced map) rebuilds every record. Under
``KVSPEC_CROSSCHECK`` the driver sends everything too and every kept structure must agree
with it: a difference is the harness's error, never a finding.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from functools import partial
from itertools import chain, compress, repeat
from operator import itemgetter, ne
from typing import Any

from engine.mem.feed import ChangedTuple
from engine.view import BlockView
from invariants.targets.vllm.buckets import NAMES as BUCKETS
from invariants.targets.vllm.buckets import Buckets
from invariants.targets.vllm.free_queue import FreeQueue

_BLOCK = partial(tuple.__new__, BlockView)  # (BlockView._make without its Python frame)


def sliced(old: list[int], start: int, kept: int, tail: list[int]) -> list[int]:
    """``old[start:start + kept] + tail`` (a list delta as driverlib/census_deltas.py makes
    it; ``old`` itself when that is all of it)."""
    if start < 0 or kept < 0 or start + kept > len(old):
        raise ValueError(f"a vllm pool delta slices [{start}, {start + kept}) of {len(old)}")
    if kept == len(old) and not tail:
        return old
    return old[start : start + kept] + tail


def read_map(listing: list) -> tuple[dict[int, tuple[int, ...]], dict]:
    """Every block's keys in the hash map, and every key's block ids, from a whole listing
    (``[key, ids]`` per key: keys by their numbers)."""
    keys: dict[int, tuple[int, ...]] = {}
    under = {}
    for key, ids in listing:
        under[key] = ids
        for b in ids:
            keys[b] = (*keys.get(b, ()), key)
    return keys, under


def mapped_as(keys: tuple[int, ...], shorts: list[str]) -> tuple[str, ...]:
    """The record's ``mapped_as``: the short hexes (24 digits, as a record's hash) of a block's
    keys (``shorts``: by key number), sorted (two keys can share one: the same hash in two KV
    groups)."""
    if len(keys) == 1:  # (most blocks: one key)
        return (shorts[keys[0]],)
    return tuple(sorted(set(map(shorts.__getitem__, keys))))


Read = tuple[dict, dict, dict]  # each block's ref_cnt, hash number and null flag as last read


def _rows(
    ids: list[int], read: tuple, free: set[int], holders: dict, mapped: dict, shorts: list[str]
) -> list:
    """The records of blocks ``ids`` (``read``: their ref_cnts, hash numbers and null flags,
    in order; ``shorts``: each number's short hex), a field at a time: a block size of 1
    changes hundreds a step."""
    ref_cnt, hashes, is_null = read
    return list(
        map(
            _BLOCK,
            zip(
                ids,
                ref_cnt,
                map(free.__contains__, ids),
                map(shorts.__getitem__, hashes),
                map(mapped.get, ids, repeat(_UNMAPPED)),
                map(holders.get, ids, repeat(0)),
                is_null,
            ),
        )
    )


def _last_read(ids: list[int], read: Read) -> tuple:
    """Blocks ``ids``' ref_cnts, hash numbers and null flags as last read, in order."""
    return tuple(map(dict.__getitem__, repeat(column), ids) for column in read)


_KEY, _KEY_IDS = itemgetter(0), itemgetter(1)  # a written key's ``[key, ids]``
_UNMAPPED: tuple[str, ...] = ()  # (every record of a block no key lists)
_ONE = frozenset((1,))


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


def buckets_of(rows: Iterable[tuple]) -> dict[str, set[int]]:
    """Each bucket's blocks from whole records, a record at a time (what the kept flags must
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
    """One run's block records as last sent, with the flags the pool's counters are sums of."""

    def __init__(self) -> None:
        self.rows: list[BlockView | None] = []  # each block's record, by block id
        self.handed: ChangedTuple[BlockView] | None = None  # the records handed out last
        # each block's ref_cnt, hash number and null flag as last read (three dicts of plain values:
        # a tuple a block would be one more object for every collection to walk)
        self.read: Read = ({}, {}, {})
        self.queue = FreeQueue()  # the free queue, walked from its links
        self.free: set[int] = set()  # its blocks (kept from the walks' changes)
        self.held: dict = {}  # each holding's blocks as last read (pool.py)
        self.holders: dict[int, int] = {}  # their count per block, kept with them
        self.keys: dict[int, tuple[int, ...]] = {}  # each listed block's keys (numbers)
        self.mapped: dict[int, tuple[str, ...]] = {}  # ... and its mapped_as
        self.under: dict = {}
        self.shorts: list[str] = [""]  # each hash number's short hex (0: no hash)
        self.flags = Buckets()  # the pool's buckets, as flags by block id (buckets.py)

    def changes(self, read: dict[str, Any], held: dict, moved: set) -> ChangedTuple[BlockView]:
        """Every block's record in block order, naming those that changed since the last call
        (``fresh``) and those they replaced (``gone``); ``read``: the driver's pool reads (the
        free queue's links among them: ``queue`` is kept from them), ``moved``: the keys of
        ``held`` whose blocks may differ from the last call's (every other holding is the very
        same list)."""
        self.shorts += read["hashes"]  # (the hashes first read in this view, numbered on)
        dirty = sorted(self._dirty(read, held, moved))
        if read["whole"] and len(self.rows) != read["num_blocks"]:
            self.rows = [None] * read["num_blocks"]  # (a run's first view lists them all)
            self.flags = Buckets(read["num_blocks"])
        ids, *columns = read["blocks"]
        # (nearly always every block whose record may change was written, and read again)
        values = columns if dirty == ids else _last_read(dirty, self.read)
        free, rows = self.free, self.rows
        fresh = _rows(dirty, values, free, self.holders, self.mapped, self.shorts)
        before = list(map(rows.__getitem__, dirty))
        differ = list(map(ne, fresh, before))
        changed = tuple(compress(fresh, differ))
        if changed:
            columns = list(zip(*changed))
            for i, row in zip(columns[0], changed):
                rows[i] = row
            self.flags.take(columns)
        if "check" in read:
            self._cross_check(read["check"])
        gone = tuple(filter(None, compress(before, differ)))  # (a first view replaces none)
        # (every block has its record once the first view is taken)
        self.handed = ChangedTuple.of(rows, self.handed, changed, gone)  # type: ignore[arg-type]
        return self.handed

    def _dirty(self, read: dict[str, Any], held: dict, moved: set) -> Iterable:
        ids, *columns = read["blocks"]
        for kept, column in zip(self.read, columns):
            kept.update(zip(ids, column))
        counted, queued = self._recount(held, moved), self._refree(read)
        if read["whole"]:
            self.keys, self.under = read_map(read["keys"])
            shorts = self.shorts
            self.mapped = {b: mapped_as(listed, shorts) for b, listed in self.keys.items()}
            return range(read["num_blocks"])
        return set(ids) | queued | counted | self._remap(read["keys"])

    def _refree(self, read: dict[str, Any]) -> set[int]:
        """Walk the free queue again from the links vLLM wrote, and bring the free set up to
        date: the blocks that joined or left it (only those, where the walk was built from
        the last one; else — a double free lists a block twice — the set is taken whole)."""
        changed = self.queue.relink(read["links"], read["num_blocks"], read["whole"])
        if changed is None:
            fresh = set(self.queue.walk.tolist())
            moved, self.free = fresh.symmetric_difference(self.free), fresh
            return moved
        gone, came = changed
        self.free.difference_update(gone)
        self.free.update(came)
        return set(gone).symmetric_difference(came)

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

    def _remap(self, keys: list) -> set[int]:
        """Take in the written keys (``[key, ids]``: the blocks listed under it now): the
        blocks listed under them before or now, whose keys and ``mapped_as`` are brought up
        to date (by number: two keys sharing a short hex are two keys here). A block's
        keys after are its keys before that were not written, and the written keys that list
        it now — whatever order they were written in."""
        if not keys:
            return set()
        moved = self._remap_singles(keys)
        if moved is not None:
            return moved
        under, listed = self.under, self.keys
        written = list(map(_KEY, keys))
        before = set(chain.from_iterable(map(under.pop, written, repeat(()))))
        listing = list(compress(keys, map(_KEY_IDS, keys)))  # (the written keys listing any)
        under.update(listing)
        gone = set(written)
        for b in before:  # the written keys leave the blocks they listed...
            kept = listed[b]  # (most: one key, so the written one)
            listed[b] = () if len(kept) == 1 else tuple(k for k in kept if k not in gone)
        now = set()
        for key, ids in listing:  # ... and join those they list now
            for b in ids:
                listed[b] = (*listed.get(b, ()), key)
            now.update(ids)
        touched = before | now
        for b in touched:
            if listed.get(b):
                self.mapped[b] = mapped_as(listed[b], self.shorts)
            else:
                listed.pop(b, None)
                self.mapped.pop(b, None)
        return touched

    def _remap_singles(self, keys: list) -> set[int] | None:
        """``_remap`` at C speed where every written key lists at most one block, each block
        under at most one key before and after (at block size 1 every key, nearly: a block
        hashed and cached, or evicted); None, having changed nothing, where one does not."""
        under, listed = self.under, self.keys
        written = list(map(_KEY, keys))
        before = list(chain.from_iterable(map(under.get, written, repeat(()))))
        if not set(map(len, map(listed.__getitem__, before))) <= _ONE:
            return None  # (a block listed under a written key and another)
        listing = list(compress(keys, map(_KEY_IDS, keys)))
        if not set(map(len, map(_KEY_IDS, listing))) <= _ONE:
            return None  # (a key listing two blocks)
        now = list(chain.from_iterable(map(_KEY_IDS, listing)))
        came, left = set(now), set(before)
        if len(came) < len(now) or not listed.keys().isdisjoint(came - left):
            return None  # (a block under two written keys, or under one kept besides)
        deque(map(under.pop, written, repeat(None)), maxlen=0)
        under.update(listing)
        deque(map(listed.pop, before), maxlen=0)
        deque(map(self.mapped.pop, before, repeat(None)), maxlen=0)
        keys_now: list[int] = list(map(_KEY, listing))
        listed.update(zip(now, zip(keys_now)))  # (each block's keys: a 1-tuple)
        shorts: map[str] = map(self.shorts.__getitem__, keys_now)
        self.mapped.update(zip(now, zip(shorts)))
        return left | came

    def buckets(self) -> dict[str, set[int]]:
        return self.flags.as_sets()

    def _cross_check(self, check: dict[str, Any]) -> None:
        """Every kept structure against the driver's whole reads (``check``)."""
        if self.queue.walk.tolist() != check["walk"]:
            raise AssertionError("the free queue walked from the driver's links differs")
        keys, free = read_map(check["keys"])[0], set(check["walk"])
        mapped = {b: mapped_as(listed, self.shorts) for b, listed in keys.items()}
        if count_holders(self.held) != self.holders:
            raise AssertionError("holder counts kept incrementally differ from the tables'")
        if free != self.free:
            raise AssertionError("the free set kept incrementally differs from the walk's")
        ids, ref_cnt, hashes, is_null = check["blocks"]
        whole = (dict(zip(ids, ref_cnt)), dict(zip(ids, hashes)), dict(zip(ids, is_null)))
        read = {i: tuple(column[i] for column in whole) for i in ids}
        kept = {i: tuple(column.get(i) for column in self.read) for i in self.read[0]}
        _same("block reads (a write the driver did not re-read)", read, kept)
        values = _last_read(ids, whole)
        full = dict(zip(ids, _rows(ids, values, free, self.holders, mapped, self.shorts)))
        _same("block records", full, dict(enumerate(self.rows)))
        if buckets_of(full.values()) != self.buckets():
            raise AssertionError("the pool's buckets kept incrementally differ from its blocks'")


def _same(what: str, full: dict, kept: dict) -> None:
    if full != kept:
        wrong = sorted(i for i in full.keys() | kept.keys() if full.get(i) != kept.get(i))
        shown = [(i, full.get(i), kept.get(i)) for i in wrong[:4]]  # (id, whole, kept)
        raise AssertionError(f"{what} kept incrementally differ at blocks {shown}")
