"""The one sliding-window convention shared by every kernel, twin and (later) the model.

Invariant: a query at absolute position ``q`` with window ``W`` attends exactly the keys at
positions ``[max(0, q - W), q]`` -- ``W + 1`` keys including itself once ``q >= W``.

This is SGLang's extend-kernel mask ``q_pos <= k_pos + W`` (docs/sglang.md §6.2) and
FlashInfer's decode clamp ``min(seq_len, W + 1)``. Models whose config names a window of
``config.sliding_window`` keys pass ``W = config.sliding_window - 1``, as SGLang's gemma2 and
gpt-oss do. ``None`` (or any ``W < 0``, SGLang's ``-1``) means no window: full causal attention.

Index regions for one query at position ``q`` (keys by absolute position)::

    [0, max(0, q - W))     outside the window: masked
    [max(0, q - W), q]     attended (W + 1 keys, fewer near the start of the sequence)
    (q, seq_len)           the future: masked (causal)

Decode at ``seq_len`` tokens is the query at ``q = seq_len - 1``: it attends the last
``min(seq_len, W + 1)`` keys.
"""

from __future__ import annotations

import torch

NO_WINDOW = -1
"""The kernels' in-launch encoding of "no window" (Triton scalars cannot be ``None``)."""


def normalize_window(window: int | None) -> int:
    """Return the kernel encoding of ``window``: ``W`` itself, or ``NO_WINDOW`` for none."""
    if window is None or window < 0:
        return NO_WINDOW
    return int(window)


def window_start(q_pos: int, window: int | None) -> int:
    """Return the first key position a query at ``q_pos`` attends."""
    w = normalize_window(window)
    return 0 if w == NO_WINDOW else max(0, q_pos - w)


def visible_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None) -> torch.Tensor:
    """Return ``mask[i, j]``: may the query at ``q_pos[i]`` attend the key at ``k_pos[j]``."""
    diff = q_pos[:, None] - k_pos[None, :]  # (num_q, num_k): distance back from the query
    mask = diff >= 0
    w = normalize_window(window)
    if w != NO_WINDOW:
        mask &= diff <= w
    return mask
