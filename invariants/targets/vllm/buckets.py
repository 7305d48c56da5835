"""The vllm target's pool buckets — the blocks the pool's counters are sizes of, and the census's
cache owner — as columns of flags by block id, kept from the records that changed at each view
(records.py): at block size 1 hundreds change a view, and a test over a 12,289-block column
is a few microseconds of numpy.

Keeps: each bucket is a test of one record, the null block in none but ``null``: ``hashed``
(a hash), ``evictable`` (a hash, in the free queue), ``protected`` / ``request_owned``
(ref_cnt > 0 with / without a hash), ``cache`` (a hash, some holder holds it, not free) — so
a column written from every changed record, and no other, holds what a test of every record
would (``buckets_of`` in records.py: the cross-check compares them).
"""

from __future__ import annotations

import numpy as np

NAMES = ("null", "hashed", "evictable", "protected", "request_owned", "cache")


class Buckets:
    """One run's flags by block id: null, hashed (real blocks only), free, in use (ref_cnt > 0,
    real), held (some holder holds it)."""

    def __init__(self, size: int = 0) -> None:
        self.null, self.hashed, self.free, self.in_use, self.held = (
            np.zeros(size, dtype=bool) for _ in range(5)
        )

    def take(self, columns: list[tuple]) -> None:
        """The changed records, as columns ``(ids, ref_cnt, free, hash, mapped_as, holders,
        is_null)``, written into the flags."""
        ids, ref_cnt, free, hashes, _, holders, is_null = columns
        at, n = np.fromiter(ids, np.int64, len(ids)), len(ids)
        null = np.fromiter(is_null, bool, n)
        real = ~null
        self.null[at] = null
        self.hashed[at] = np.fromiter(map(bool, hashes), bool, n) & real
        self.free[at] = np.fromiter(free, bool, n)
        self.in_use[at] = np.fromiter(map((0).__lt__, ref_cnt), bool, n) & real
        self.held[at] = np.fromiter(map(bool, holders), bool, n)

    def counts(self) -> dict[str, int]:
        """The size of each bucket but the cache."""
        hashed, in_use = self.hashed, self.in_use
        return {
            "null": int(np.count_nonzero(self.null)),
            "evictable": int(np.count_nonzero(self.free & hashed)),
            "protected": int(np.count_nonzero(in_use & hashed)),
            "request_owned": int(np.count_nonzero(in_use & ~hashed)),
        }

    def cache(self) -> np.ndarray:
        """The census's cache owner: blocks with a hash some holder holds, not free, in order."""
        return np.flatnonzero(self.hashed & self.held & ~self.free)

    def unhashed(self, blocks: np.ndarray) -> np.ndarray:
        """``blocks`` (ids) without those with a hash (a cached block is the cache's)."""
        return blocks[~self.hashed[blocks]] if len(blocks) else blocks

    def as_sets(self) -> dict[str, set[int]]:
        """Every bucket as a set of block ids (what the cross-check compares)."""
        hashed, in_use, free = self.hashed, self.in_use, self.free
        masks = (self.null, hashed, free & hashed, in_use & hashed, in_use & ~hashed)
        sets = {name: set(np.flatnonzero(mask).tolist()) for name, mask in zip(NAMES, masks)}
        return sets | {"cache": set(self.cache().tolist())}
