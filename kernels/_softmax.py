"""Triton device helpers shared by the attention kernels: the online-softmax tile update.

Invariant: after folding tiles ``t_1..t_k``, ``acc / l_i`` is the softmax-weighted sum of the
values seen so far and ``m_i + log(l_i)`` their log-sum-exp; fully masked rows stay at zero.

NOTE: arguments of ``@triton.jit`` functions are left unannotated except ``tl.constexpr``:
Triton reads annotations as type specialisations, so ``x: int`` would change the kernel.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def online_softmax_update(qk, v, m_i, l_i, acc, PREC: tl.constexpr):
    """Fold one tile of scaled scores ``qk`` (``-inf`` = masked) and values ``v`` into state.

    Shapes: ``qk (TILE_Q, TILE_N)``, ``v (TILE_N, TILE_DV)``, ``m_i, l_i (TILE_Q,)``,
    ``acc (TILE_Q, TILE_DV)``; returns the updated ``(m_i, l_i, acc)``.
    """
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    # NOTE: a row with no visible key yet keeps m = -inf; shift it by 0 so exp() gives 0, not NaN.
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp(qk - m_safe[:, None])
    alpha = tl.exp(m_i - m_safe)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
    l_i = l_i * alpha + tl.sum(p, 1)
    return m_new, l_i, acc


@triton.jit
def window_ok(q_pos, k_pos, window):
    """Return the sliding-window part of the mask (kernels/window.py): ``q - k <= W`` or none."""
    return (window < 0) | (q_pos - k_pos <= window)
