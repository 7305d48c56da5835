"""What each view reads of vLLM's block pool, as what changed since the run's previous view:
the blocks vLLM wrote (their ``ref_cnt``, hash and null flag: writes.py records which), the
blocks whose free-queue link it wrote (the block each links to now: driverlib/free_links.py),
the hash-map keys it wrote (the blocks each lists now), each table that moved (as a list delta:
driverlib/census_deltas.py), and each holder's kind — a hash (the blocks' and the map's keys)
as its number in the run (``HashIds``: each number's short hex is sent once, in the view that
first read it, as ``hashes``). Runs inside the vllm venv. kvspec's side
rebuilds the pool from these and derives everything else — the free queue's walk, each block's
record, the pool's buckets and the census input (invariants/targets/vllm/pool.py): the driver's
process is the engine's, so it reads and nothing more while the checks run beside it.

Keeps: a view lists every block, link and key vLLM wrote since the last (all of them at a run's
first view, without a recording, or once the map was replaced: ``whole``); a block, link or key
vLLM did not write holds what it held. Under ``KVSPEC_CROSSCHECK`` every view lists everything too
(``check``), and kvspec's side must have rebuilt the same: a difference is the harness's
error, never a finding.
"""

from __future__ import annotations

from itertools import compress, repeat
from operator import attrgetter, getitem, is_

from census_deltas import CROSSCHECK, list_delta
from free_links import HEAD, TAIL, UNLINKED


class HashIds:
    """A run's block hashes (the hash map's keys: one hash a KV-cache group) numbered as first
    read, 0 for none: a view sends a hash as its number, and each new number's short hex (its
    first 24 digits: what a record lists) once — two keys with one short hex are two
    numbers. At block size 1 a run reads thousands of hashes, each many times."""

    def __init__(self) -> None:
        self.ids: dict = {None: 0}
        self.new: list[str] = []  # the short hexes numbered since the last ``take``

    def of(self, hashes: list) -> list[int]:
        """Each hash's number, the new ones numbered in order (all at C speed)."""
        ids = list(map(self.ids.get, hashes))
        if None not in ids:
            return ids
        fresh = list(dict.fromkeys(compress(hashes, map(is_, ids, repeat(None)))))
        self.ids.update(zip(fresh, range(len(self.ids), len(self.ids) + len(fresh))))
        wholes = map(bytes.hex, fresh)  # (a key is bytes: vLLM's BlockHashWithGroupId)
        self.new += map(getitem, wholes, repeat(_SHORT))
        return list(map(self.ids.__getitem__, hashes))

    def take(self) -> list[str]:
        """The short hexes numbered since the last call, in number order."""
        new, self.new = self.new, []
        return new


_SHORT = slice(0, 24)
REF_CNT, IS_NULL = attrgetter("ref_cnt"), attrgetter("is_null")
PUBLIC_HASH = attrgetter("block_hash")  # (KVCacheBlock's read-only property)
NEXT = attrgetter("next_free_block")


def _hash_getter() -> attrgetter:
    """A block's hash read from the slot behind ``block_hash`` where vLLM's KVCacheBlock keeps
    it there (0.25 to 0.33: the property returns ``_block_hash``) — at C speed, no property
    call a block — else the property (the cross-check reads the property: a divergence is
    the harness's error)."""
    try:
        from vllm.v1.core.kv_cache_utils import KVCacheBlock
    except ImportError:  # pragma: no cover (the driver runs in a vllm venv)
        return PUBLIC_HASH
    slots = getattr(KVCacheBlock, "__slots__", ())
    return attrgetter("_block_hash") if "_block_hash" in slots else PUBLIC_HASH


HASH = _hash_getter()


def block_ids(entry) -> list[int]:
    """The blocks a hash-map entry lists (one block, or a dict of them by id)."""
    if entry is None:
        return []
    return [entry.block_id] if hasattr(entry, "block_id") else list(entry)


def block_columns(blocks: list, ids, numbers: HashIds, hash_of: attrgetter = HASH) -> list:
    """The blocks' ids, ``ref_cnt``, hash numbers and null flags, a column at a time."""
    hashes = numbers.of(list(map(hash_of, blocks)))
    return [list(ids), list(map(REF_CNT, blocks)), hashes, list(map(IS_NULL, blocks))]


def link_columns(queue, blocks: list, ids) -> list:
    """The fake head's next block and ``blocks``' ids and next blocks, as free_links' ids."""
    head, tail = queue.fake_free_list_head, queue.fake_free_list_tail
    nexts = list(map(NEXT, blocks))
    if any(map(is_, nexts, repeat(head))):  # (no block links back to the head in vLLM)
        linked = [_link(node, head, tail) for node in nexts]
    else:  # the fake tail's id is TAIL's; None has none (at C speed)
        linked = list(map(getattr, nexts, repeat("block_id"), repeat(UNLINKED)))
    return [_link(head.next_free_block, head, tail), list(ids), linked]


def _link(node, head, tail) -> int:
    if node is None or node is tail:
        return UNLINKED if node is None else TAIL
    return HEAD if node is head else node.block_id


def free_walk(pool) -> list[int]:
    """The free queue in order, link by link (a repeat is a double free; a cycle stops one
    past the pool's size): what kvspec's side must have walked (the cross-check)."""
    queue, out = pool.free_block_queue, []
    append, tail = out.append, queue.fake_free_list_tail
    node = queue.fake_free_list_head.next_free_block
    for _ in range(len(pool.blocks) + 1):
        if node is None or node is tail:
            break
        append(node.block_id)
        node = node.next_free_block
    return out


def map_listing(hash_map, keys, numbers: HashIds) -> list[list]:
    """Each key of ``keys`` (its number) with the blocks the map lists under it now."""
    keys, get = list(keys), hash_map._cache.get
    return [[n, block_ids(get(key))] for n, key in zip(numbers.of(keys), keys)]


class PoolReads:
    """One run's reads of the pool as last sent (what the next view's deltas are against)."""

    def __init__(self, writes) -> None:
        self.numbers = HashIds()  # the run's hashes (a number is sent in place of each)
        self.writes = writes  # writes.Writes, or None: read every block at every view
        self.map = None  # the hash map read last (a new one: reset_prefix_cache)
        self.tables: dict = {}  # each table as read by views.read_tables (per group)
        self.held: dict = {}  # each holding's blocks as last sent
        self.kinds: dict[str, str] = {}  # each holder's kind as last sent

    def read(self, pool, held: dict, moved: set, owners: dict) -> dict:
        """The view's ``pool``: what changed since the last call. ``held``: each table's real
        blocks by ``(group, rid)``; ``moved``: the keys of those that may differ (every other
        is the very list sent before); ``owners``: each request's holder kind (``kinds``) and
        each batch of frees deferred past the step in flight (``fenced``: sent whole)."""
        kinds, blocks = owners["kinds"], pool.blocks
        written, linked, keys = self._written()
        whole = written is None or pool.cached_block_hash_to_block is not self.map
        if whole:
            self.map = pool.cached_block_hash_to_block
            written = linked = range(len(blocks))
            keys = list(self.map._cache)
        out = {
            "num_blocks": len(blocks),
            "num_free_blocks": pool.free_block_queue.num_free_blocks,
            "whole": whole,
            "blocks": block_columns(list(map(blocks.__getitem__, written)), written, self.numbers),
            "links": link_columns(
                pool.free_block_queue, list(map(blocks.__getitem__, linked)), linked
            ),
            "keys": map_listing(self.map, keys, self.numbers),
            "tables": self._tables(held, moved),
            "kinds": None if kinds == self.kinds else kinds,
            "fenced": owners["fenced"],
        }
        self.kinds = kinds
        if CROSSCHECK:
            out["check"] = _everything(pool, held, kinds, self.numbers)
        out["hashes"] = self.numbers.take()  # (last: the check's reads numbered too)
        return out

    def _written(self) -> tuple:
        """The block ids written to since the last view (a record's fields, sorted; a link),
        and the hash-map keys (None: no recording, read everything)."""
        if self.writes is None:
            return None, None, ()
        written, linked, keys = self.writes.take()
        for ids in (written, linked):
            ids.discard(-1)  # the free queue's fake head and tail (read through the links)
        return sorted(written), list(linked), keys

    def _tables(self, held: dict, moved: set) -> list[list]:
        """Each table that moved as ``[group, rid, start, kept, tail]`` against the one sent
        before (gone: ``[group, rid]``; one equal to it: not sent)."""
        before, out = self.held, []
        for key in moved:
            if key in held:
                if key not in before or before[key] != held[key]:
                    out.append([*key, *list_delta(before.get(key, []), held[key])])
            elif key in before:
                out.append(list(key))
        self.held = held
        return out


def _everything(pool, held: dict, kinds: dict, numbers: HashIds) -> dict:
    """Every block, key, free block and table, read whole (what kvspec's side must have)."""
    ids = range(len(pool.blocks))
    hash_map = pool.cached_block_hash_to_block
    return {
        "blocks": block_columns(pool.blocks, ids, numbers, PUBLIC_HASH),
        "keys": sorted(map_listing(hash_map, list(hash_map._cache), numbers)),
        "walk": free_walk(pool),
        "tables": sorted([*key, blocks] for key, blocks in held.items()),
        "kinds": kinds,
    }
