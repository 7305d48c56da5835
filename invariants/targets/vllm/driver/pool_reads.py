"""What each view reads of vLLM's block pool, as what changed since the run's previous view:
the blocks vLLM wrote (their ``ref_cnt``, hash and null flag: writes.py records which), the
hash-map keys it wrote (the blocks each lists now), the free queue's walk and each table that
moved (as list deltas: driverlib/census_deltas.py), and each holder's kind. Runs inside the
vllm venv. kvspec's side rebuilds the pool from these and derives everything else — each
block's record, the pool's buckets and the census input (invariants/targets/vllm/pool.py): the
driver's process is the engine's, so it reads and nothing more while the checks run beside it.

Keeps: a view lists every block and key vLLM wrote since the last (all of them at a run's first
view, without a recording, or once the map was replaced: ``whole``); a block or key vLLM did
not write holds what it held. Under ``KVSPEC_CROSSCHECK`` every view lists everything too
(``check``), and kvspec's side must have rebuilt the same: a difference is the harness's
error, never a finding.
"""

from __future__ import annotations

from operator import attrgetter

from census_deltas import CROSSCHECK, list_delta


class _Hexes(dict):
    """A hash (immutable bytes) -> its hex, each computed once; None -> ""."""

    def __missing__(self, h) -> str:
        text = self[h] = bytes(h).hex()
        return text


class _ShortHexes(dict):
    """A block hash -> the first 24 hex digits of it (what a record lists); None -> ""."""

    def __missing__(self, h) -> str:
        text = self[h] = _HEX[h][:24]
        return text


_HEX, _SHORT = _Hexes({None: ""}), _ShortHexes({None: ""})
hex_of = _SHORT.__getitem__  # (a dict's lookup: a column maps at C speed)
key_of = _HEX.__getitem__  # a hash-map key, whole: two keys can share a short hex
REF_CNT, HASH, IS_NULL = attrgetter("ref_cnt"), attrgetter("block_hash"), attrgetter("is_null")


def block_ids(entry) -> list[int]:
    """The blocks a hash-map entry lists (one block, or a dict of them by id)."""
    if entry is None:
        return []
    return [entry.block_id] if hasattr(entry, "block_id") else list(entry)


def block_columns(blocks: list, ids) -> list[list]:
    """The blocks' ids, ``ref_cnt``, short hashes and null flags, a column at a time."""
    hashes = list(map(hex_of, map(HASH, blocks)))
    return [list(ids), list(map(REF_CNT, blocks)), hashes, list(map(IS_NULL, blocks))]


def map_listing(hash_map, keys) -> list[list]:
    """Each key of ``keys`` (whole hex) with the blocks the map lists under it now."""
    cache = hash_map._cache
    return [[key_of(key), block_ids(cache.get(key))] for key in keys]


class PoolReads:
    """One run's reads of the pool as last sent (what the next view's deltas are against)."""

    def __init__(self, writes) -> None:
        for memo in (_HEX, _SHORT):  # (a run's hashes: the memos would grow run after run)
            memo.clear()
            memo[None] = ""
        self.writes = writes  # writes.Writes, or None: read every block at every view
        self.map = None  # the hash map read last (a new one: reset_prefix_cache)
        self.walk: list[int] = []  # the free queue as last sent
        self.tables: dict = {}  # each table as read by views.read_tables (per group)
        self.held: dict = {}  # each holding's blocks as last sent
        self.kinds: dict[str, str] = {}  # each holder's kind as last sent

    def read(self, pool, walk: list[int], held: dict, moved: set, owners: dict) -> dict:
        """The view's ``pool``: what changed since the last call. ``held``: each table's real
        blocks by ``(group, rid)``; ``moved``: the keys of those that may differ (every other
        is the very list sent before); ``owners``: each request's holder kind (``kinds``) and
        each batch of frees deferred past the step in flight (``fenced``: sent whole)."""
        kinds = owners["kinds"]
        written, keys = self.writes.take() if self.writes is not None else (None, ())
        whole = written is None or pool.cached_block_hash_to_block is not self.map
        if whole:
            self.map = pool.cached_block_hash_to_block
            ids, keys = range(len(pool.blocks)), list(self.map._cache)
        else:
            written.discard(-1)  # the free queue's fake head and tail (never but by their links)
            ids = sorted(written)
        out = {
            "num_blocks": len(pool.blocks),
            "num_free_blocks": pool.free_block_queue.num_free_blocks,
            "whole": whole,
            "blocks": block_columns(list(map(pool.blocks.__getitem__, ids)), ids),
            "keys": map_listing(self.map, keys),
            "free": list_delta(self.walk, walk),
            "tables": self._tables(held, moved),
            "kinds": None if kinds == self.kinds else kinds,
            "fenced": owners["fenced"],
        }
        self.walk, self.kinds = walk, kinds
        if CROSSCHECK:
            out["check"] = _everything(pool, walk, held, kinds)
        return out

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


def _everything(pool, walk: list[int], held: dict, kinds: dict) -> dict:
    """Every block, key, free block and table, read whole (what kvspec's side must have)."""
    ids = range(len(pool.blocks))
    hash_map = pool.cached_block_hash_to_block
    return {
        "blocks": block_columns(pool.blocks, ids),
        "keys": sorted(map_listing(hash_map, list(hash_map._cache))),
        "walk": walk,
        "tables": sorted([*key, blocks] for key, blocks in held.items()),
        "kinds": kinds,
    }
