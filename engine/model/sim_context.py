"""The sim model's context record: a request's tokens with their KV fingerprints and the
chained context hash ``H`` (engine/model/sim.py's docstring gives the hash).

Keeps: ``hashes[p]`` is ``H`` of tokens ``[0, p)``; ``chain_hashes`` computes a whole batch's
chains without a Python loop, and equals stepping ``H`` token by token.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.model.fingerprint import U64

BASE = 0xC2B2AE3D27D4EB4F  # odd, so invertible mod 2**64
_BASE_INV = pow(BASE, -1, 1 << 64)
TERM_MUL = U64(0x165667B19E3779F9)


class _Powers:
    """``B**j`` and ``B**-j`` mod 2**64 for ``j`` in ``[0, len)``, grown on demand."""

    def __init__(self) -> None:
        self.pow = np.ones(1, dtype=U64)
        self.inv = np.ones(1, dtype=U64)

    def ensure(self, n: int) -> None:
        if n > len(self.pow):
            self.pow = _power_table(BASE, max(n, 2 * len(self.pow)))
            self.inv = _power_table(_BASE_INV, len(self.pow))


def _power_table(base: int, n: int) -> np.ndarray:
    """``[1, base, base**2, ...]`` mod 2**64 (numpy's uint64 products wrap)."""
    table = np.full(n, base, dtype=U64)
    table[0] = 1
    return np.cumprod(table, dtype=U64)


_POWERS = _Powers()  # pure function tables, shared


def chain_hashes(h0: np.ndarray, seg_lens: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """Hash after each token of each segment; segment k starts from ``h0[k]``.

    ``H_j = B**j h0 + sum_{i<j} term_i B**(j-1-i)`` computed without a Python loop as
    ``B**j (h0 + cumsum_{i<j} term_i B**-(i+1))`` (B is odd, so ``B**-1`` exists mod 2**64).
    """
    total = len(tokens)
    if total == 0:
        return np.empty(0, dtype=U64)
    seg_lens = np.asarray(seg_lens, dtype=np.int64)
    firsts = np.cumsum(seg_lens) - seg_lens
    rel = np.arange(1, total + 1, dtype=np.int64) - np.repeat(firsts, seg_lens)  # j in 1..len
    _POWERS.ensure(int(rel.max()) + 1)
    terms = (np.asarray(tokens).astype(U64) + U64(1)) * TERM_MUL
    weighted = terms * _POWERS.inv[rel]
    csum = np.cumsum(weighted, dtype=U64)
    first = np.minimum(firsts, total - 1)  # empty segments repeat zero times below
    before = np.repeat(csum[first] - weighted[first], seg_lens)
    return _POWERS.pow[rel] * (np.repeat(np.asarray(h0, dtype=U64), seg_lens) + csum - before)


@dataclass(slots=True, eq=False)
class Context:
    """A request's context ``[0, length)``: tokens, their fingerprints, prefix hashes."""

    ids: list[int]  # the same tokens as Python ints: validated with one list comparison
    tokens: np.ndarray  # int64 [capacity]
    fps: np.ndarray  # int64 [capacity]
    hashes: np.ndarray  # uint64 [capacity + 1]; hashes[p] = H of tokens [0, p)
    length: int = 0

    @classmethod
    def empty(cls, h0: np.uint64, capacity: int = 64) -> Context:
        hashes = np.zeros(capacity + 1, dtype=U64)
        hashes[0] = h0
        return cls([], np.zeros(capacity, np.int64), np.zeros(capacity, np.int64), hashes)

    def matching_len(self, ids: list[int], limit: int) -> int:
        """Length of the common prefix of this context and ``ids``, at most ``limit``."""
        n = min(self.length, limit)
        head = ids if len(ids) == n else ids[:n]
        if head == (self.ids if self.length == n else self.ids[:n]):
            return n
        diff = np.flatnonzero(np.asarray(head, dtype=np.int64) != self.tokens[:n])
        return int(diff[0]) if len(diff) else n

    def truncate(self, n: int) -> None:
        if n < self.length:
            del self.ids[n:]
            self.length = n

    def append(
        self, tokens: np.ndarray, fps: np.ndarray, hashes: np.ndarray, ids: list[int]
    ) -> None:
        """Append tokens with their fingerprints and the hashes after each of them."""
        a, b = self.length, self.length + len(tokens)
        if b > len(self.tokens):
            self._grow(max(b, 2 * len(self.tokens)))
        self.tokens[a:b], self.fps[a:b], self.hashes[a + 1 : b + 1] = tokens, fps, hashes
        self.ids.extend(ids)
        self.length = b

    def _grow(self, capacity: int) -> None:
        n = self.length
        tokens, fps = np.empty(capacity, np.int64), np.empty(capacity, np.int64)
        hashes = np.empty(capacity + 1, U64)
        tokens[:n], fps[:n], hashes[: n + 1] = self.tokens[:n], self.fps[:n], self.hashes[: n + 1]
        self.tokens, self.fps, self.hashes = tokens, fps, hashes
