"""Scratch runs of a model outside any engine: each request on its own row of a fixed slot
table (no allocator, no prefix cache, no chunking, no retract, no overlap) — what the tiny
model's draft distils from (draft.py) and what the token oracle compares against (``greedy``).

Keeps: request ``b`` sits at row ``b + 1`` and position ``p`` at slot ``table[b + 1, p]``
(row 0 and slot 0 are padding), so a scratch run writes every position's KV exactly once
and reads only what it wrote.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from engine.model.runner import ForwardBatch, ForwardMode, ModelRunner
from engine.request import Req


def slot_table(num: int, width: int) -> np.ndarray:
    """Rows ``1 .. num`` of ``width`` slots each, numbered from 1 (row 0: padding)."""
    table = np.zeros((num + 1, width), dtype=np.int32)
    table[1:] = 1 + np.arange(num)[:, None] * width + np.arange(width)[None, :]
    return table


def scratch_batch(
    mode: ForwardMode,
    reqs: list[Req],
    ids: np.ndarray,
    prefix: np.ndarray,
    ext: np.ndarray,
    table: np.ndarray,
) -> ForwardBatch:
    """A batch of ``reqs`` at rows ``1 .. len(reqs)``: ``ext`` tokens each after ``prefix``."""
    rows = np.arange(1, len(reqs) + 1, dtype=np.int64)
    positions = np.concatenate([np.arange(p, p + e) for p, e in zip(prefix, ext)])
    loc = table[np.repeat(rows, ext), positions].astype(np.int64)
    return ForwardBatch(
        mode=mode,
        reqs=reqs,
        input_ids=np.asarray(ids, dtype=np.int64),
        positions=positions,
        out_cache_loc=loc,
        req_pool_indices=rows,
        prefix_lens=prefix,
        extend_lens=ext,
        seq_lens=prefix + ext,
        req_to_token=table,
        sample=[True] * len(reqs),
    )


def greedy(
    runner: ModelRunner, prompt: Sequence[int], n: int, rid: str, like: Req | None = None
) -> list[int]:
    """The ``n`` greedy tokens ``runner`` samples after ``prompt`` (under the sampling
    parameters and EOS ids of request ``like``: its penalties): one extend of the whole
    prompt, then one decode per token, over a scratch row (``runner``'s pool must hold
    ``len(prompt) + n`` slots past the padding)."""
    table = slot_table(1, len(prompt) + n)
    req = Req(rid, list(prompt))
    if like is not None:
        req.sampling_params, req.eos_token_ids = like.sampling_params, like.eos_token_ids
    one = np.ones(1, dtype=np.int64)
    batch = scratch_batch(
        ForwardMode.EXTEND,
        [req],
        np.asarray(prompt),
        np.zeros(1, np.int64),
        one * len(prompt),
        table,
    )
    tokens = [int(runner.forward(batch).next_token_ids[0])]
    while len(tokens) < n:
        req.output_ids = tokens[:-1]  # the last token is the decode's input, not yet output
        at = one * (len(prompt) + len(tokens) - 1)
        batch = scratch_batch(ForwardMode.DECODE, [req], np.array(tokens[-1:]), at, one, table)
        tokens.append(int(runner.forward(batch).next_token_ids[0]))
    return tokens
