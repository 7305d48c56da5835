"""The sim model's sequential loop, compiled (numba): the greedy tokens after a context hash,
one at a time — each token is a function of the hash, the hash a function of the token.

Keeps: bit for bit what ``SimModel.predict`` and the context hash give one token at a time
(uint64 arithmetic wraps as the Python-int loop masks; tests/engine/model/test_sim_reference.py
compares the two).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from engine.model.sim_context import BASE, TERM_MUL
from engine.model.tokenizer import EOS_ID, NUM_BYTES

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_BASE, _TERM_MUL = np.uint64(BASE), np.uint64(TERM_MUL)
_UNIT = 2.0**-53


@njit(cache=True, inline="always")
def _splitmix64(x: np.uint64) -> np.uint64:
    z = x + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


@njit(cache=True)
def greedy_tokens(
    h: np.uint64, key_token: np.uint64, key_eos: np.uint64, eos_prob: float, n: int
) -> np.ndarray:
    """The ``n`` greedy tokens after the context hashed ``h`` (no penalties)."""
    out = np.empty(n, np.int64)
    for i in range(n):
        coin = float(_splitmix64(h ^ key_eos) >> np.uint64(11)) * _UNIT
        token = EOS_ID
        if coin >= eos_prob:
            token = int(_splitmix64(h ^ key_token) % np.uint64(NUM_BYTES))
        out[i] = token
        h = h * _BASE + np.uint64(token + 1) * _TERM_MUL
    return out
