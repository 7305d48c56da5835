"""KV fingerprints: a shadow of every KV pool that the sim model writes and verifies.

Keeps: ``pool[s]`` is ``fingerprint(t, p)`` of the last token ``t`` at position ``p`` whose KV
was written to slot ``s`` (0 = never written; a fingerprint is never 0). A request that reads
slot ``s`` for position ``p`` of its context, whose token there is ``t``, is served correct KV
only if ``pool[s] == fingerprint(t, p)``; every other outcome is an ``IntegrityFailure``.

    pool   array              indexed by             read for position p when
    full   ``full``           full slot              p in [0, prefix_len)
    swa    ``swa``            ``full_to_swa[slot]``  p in [max(prefix_len - window, 0),
                                                           prefix_len): the model's window

Slots below ``page_size`` (page 0, the padding target) are never a valid read: they are
kept 0 (padding writes are dropped), so a row or a ``full_to_swa`` entry naming them
(0 = "no SWA slot") always fails, and so does an out-of-range slot (it reads a zero guard).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from engine.mem.allocator import PagedAllocator, SWAAllocator

U64 = np.uint64
_GOLDEN = U64(0x9E3779B97F4A7C15)
_MIX1 = U64(0xBF58476D1CE4E5B9)
_MIX2 = U64(0x94D049BB133111EB)
_TOKEN_MUL = U64(0xD6E8FEB86659FD93)
_POS_MUL = U64(0xA0761D6478BD642F)
_S30, _S27, _S31 = U64(30), U64(27), U64(31)
_MASK = (1 << 64) - 1
_GOLDEN_INT, _MIX1_INT, _MIX2_INT = int(_GOLDEN), int(_MIX1), int(_MIX2)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser, elementwise on a uint64 array (a bijection of 64-bit ints).
    Arrays only: numpy wraps array arithmetic silently but warns on scalar overflow."""
    z = x + _GOLDEN
    z = (z ^ (z >> _S30)) * _MIX1
    z = (z ^ (z >> _S27)) * _MIX2
    return z ^ (z >> _S31)


def splitmix64_int(x: int) -> int:
    """``splitmix64`` of one value in Python ints (a sequential loop: no numpy per call)."""
    z = (x + _GOLDEN_INT) & _MASK
    z = ((z ^ (z >> 30)) * _MIX1_INT) & _MASK
    z = ((z ^ (z >> 27)) * _MIX2_INT) & _MASK
    return z ^ (z >> 31)


def fingerprint(token_ids: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """int64 fingerprint of each ``(token, position)`` pair; odd, hence never 0.
    Fixed (no seed): two models or two requests agree on the KV of a shared prefix."""
    t = np.asarray(token_ids).astype(U64)
    p = np.asarray(positions).astype(U64)
    return (splitmix64(t * _TOKEN_MUL ^ p * _POS_MUL) | U64(1)).view(np.int64)


class IntegrityFailure(NamedTuple):
    """One read that did not find its KV: request, position, the slot in ``pool``
    ("full" or "swa"; slot 0 = no slot mapped), the fingerprint expected and found."""

    rid: str
    position: int
    slot: int
    pool: str
    expected: int
    found: int


class KVRead(NamedTuple):
    """Positions ``[start, end)`` that request ``rid`` reads through row ``row``; the SWA
    pool (when hybrid) is read only from ``max(start, swa_start)``. ``expected[p]`` is the
    fingerprint of the request's token at absolute position ``p`` (length >= ``end``)."""

    rid: str
    row: int
    start: int
    end: int
    swa_start: int
    expected: np.ndarray


class KVFingerprints:
    """One int64 array per KV pool, sized like the allocator's slot space
    (``num_pages * page_size + page_size``: page 0 included)."""

    def __init__(
        self,
        num_slots: int,
        page_size: int = 1,
        *,
        swa_num_slots: int | None = None,
        full_to_swa: np.ndarray | None = None,
        sliding_window: int | None = None,
    ) -> None:
        hybrid = swa_num_slots is not None
        if hybrid != (full_to_swa is not None) or hybrid != (sliding_window is not None):
            raise ValueError("a SWA pool needs swa_num_slots, full_to_swa and sliding_window")
        if full_to_swa is not None and len(full_to_swa) < num_slots:
            raise ValueError(f"full_to_swa has {len(full_to_swa)} entries, {num_slots} full slots")
        self.page_size = page_size
        # one zero guard past the end: reads clip to it (or to the zero page 0), so an
        # invalid slot fails the fingerprint compare without a separate range check
        self._full_guarded = np.zeros(num_slots + 1, dtype=np.int64)
        self.full = self._full_guarded[:num_slots]
        self._swa_guarded: np.ndarray | None = None
        self.swa: np.ndarray | None = None
        if swa_num_slots is not None:
            self._swa_guarded = np.zeros(swa_num_slots + 1, dtype=np.int64)
            self.swa = self._swa_guarded[:swa_num_slots]
        self.full_to_swa = full_to_swa  # the allocator's own array: mapping changes show here
        self.sliding_window = sliding_window

    @classmethod
    def for_allocator(
        cls, allocator: PagedAllocator | SWAAllocator, sliding_window: int | None = None
    ) -> KVFingerprints:
        """Arrays matching ``allocator``'s pools; a SWA allocator needs the window."""
        ps = allocator.page_size
        if isinstance(allocator, SWAAllocator):
            if sliding_window is None:
                raise ValueError("a SWA allocator needs sliding_window")
            return cls(
                allocator.size + ps,
                ps,
                swa_num_slots=allocator.size_swa + ps,
                full_to_swa=allocator.full_to_swa,
                sliding_window=sliding_window,
            )
        return cls(allocator.size + ps, ps)

    @property
    def is_hybrid(self) -> bool:
        return self.swa is not None

    def clear(self) -> None:
        self.full[:] = 0
        if self.swa is not None:
            self.swa[:] = 0

    def swa_read_start(self, prefix_len: int) -> int:
        """First prefix position the sliding-window layers read: query ``q`` reads keys
        ``[q - window, q]``, so the queries ``q >= prefix_len`` read the prefix from
        ``prefix_len - window`` (decode: ``seq_len - 1 - window``). The model's own window,
        never the engine's eviction cursor: KV freed inside the window fails the read."""
        window = self.sliding_window if self.sliding_window is not None else prefix_len
        return max(prefix_len - window, 0)

    def write(
        self,
        out_cache_loc: np.ndarray,
        fps: np.ndarray,
        swa_out_cache_loc: np.ndarray | None = None,
    ) -> None:
        """Store ``fps`` at the written full slots and at their SWA slots (through
        ``full_to_swa`` unless the batch names them)."""
        self.full[out_cache_loc] = fps
        self.full[: self.page_size] = 0
        if self.swa is not None and self.full_to_swa is not None:
            swa_loc = swa_out_cache_loc
            if swa_loc is None:
                swa_loc = self.full_to_swa[out_cache_loc]
            self.swa[swa_loc] = fps
            self.swa[: self.page_size] = 0

    def verify(
        self, req_to_token: np.ndarray, reads: Sequence[KVRead], limit: int = 8
    ) -> tuple[list[IntegrityFailure], int]:
        """Check every read of every pool: (the first ``limit`` failures, the failure count)."""
        spans = [(r, r.start) for r in reads if r.end > r.start]
        failures, total = self._check("full", req_to_token, spans, limit)
        if self.swa is not None:
            swa_spans = [(r, s) for r in reads if (s := max(r.start, r.swa_start)) < r.end]
            more, count = self._check("swa", req_to_token, swa_spans, limit - len(failures))
            failures += more
            total += count
        return failures, total

    def _check(
        self, pool: str, req_to_token: np.ndarray, spans: list[tuple[KVRead, int]], limit: int
    ) -> tuple[list[IntegrityFailure], int]:
        if not spans:
            return [], 0
        # one concatenated gather per pool rather than a numpy call per request
        slots = np.concatenate([req_to_token[r.row, s : r.end] for r, s in spans])
        expected = np.concatenate([r.expected[s : r.end] for r, s in spans])
        table = self._full_guarded
        if pool == "swa":
            assert self._swa_guarded is not None and self.full_to_swa is not None
            # an out-of-range full slot already fails in the full pool; here it reads
            # some mapping entry, and an unmapped one (0) reads the zero page
            slots, table = self.full_to_swa.take(slots, mode="clip"), self._swa_guarded
        found = table.take(slots, mode="clip")
        bad = found != expected  # expected is never 0; reserved and guard slots always are
        total = int(np.count_nonzero(bad))
        if total == 0 or limit <= 0:
            return [], total
        return _describe(pool, spans, np.flatnonzero(bad)[:limit], slots, expected, found), total


def _describe(
    pool: str,
    spans: list[tuple[KVRead, int]],
    flat: np.ndarray,
    slots: np.ndarray,
    expected: np.ndarray,
    found: np.ndarray,
) -> list[IntegrityFailure]:
    """Map flat indices of the concatenated reads back to (request, position)."""
    starts = np.array([s for _, s in spans], dtype=np.int64)
    lens = np.array([r.end - s for r, s in spans], dtype=np.int64)
    firsts = np.cumsum(lens) - lens  # flat index of each span's first read
    which = np.searchsorted(firsts, flat, side="right") - 1
    positions = starts[which] + flat - firsts[which]
    return [
        IntegrityFailure(spans[w][0].rid, p, int(slots[i]), pool, int(expected[i]), int(found[i]))
        for i, w, p in zip(flat.tolist(), which.tolist(), positions.tolist())
    ]
