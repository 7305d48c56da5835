"""One window rule across kernels: decode at position q is the last extend row at q."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from kernels import (
    decode_attention_fwd,
    decode_attention_ref,
    extend_attention_fwd,
    extend_attention_ref,
    store_kv_cache,
)

TOL = {"atol": 1e-4, "rtol": 1e-3}


@pytest.mark.parametrize("window", [None, 0, 2, 5, 100])
@pytest.mark.parametrize("impl", ["triton", "twin"])
def test_decode_equals_last_extend_row(
    paged: Callable, randn: Callable, tile: Callable, impl: str, window: int | None
) -> None:
    """With every KV stored, decode of a length-L context equals extend row L - 1 (same q)."""
    lens, prefix = [9, 14], [4, 13]  # extend 5 and 1 new tokens over the same contexts
    ext = [n - p for n, p in zip(lens, prefix)]
    pool = paged(lens, 4)
    num_tokens = sum(lens)
    k, v, q = randn(num_tokens, 2, 16), randn(num_tokens, 2, 16), randn(sum(ext), 4, 16)
    bufs = (randn(pool.num_slots, 2, 16), randn(pool.num_slots, 2, 16))
    loc = torch.cat([pool.req_to_token[row, :n] for row, n in zip(pool.rows.tolist(), lens)])
    store_kv_cache(k, v, *bufs, loc)  # the whole context of both requests is in the pool
    starts = [0, lens[0]]
    new = [torch.cat([t[s + p : s + n] for s, p, n in zip(starts, prefix, lens)]) for t in (k, v)]
    qo_indptr = torch.tensor([0, ext[0], sum(ext)], device=q.device)
    ext_args = (q, *new, *bufs, pool.req_to_token, pool.rows, torch.tensor(prefix, device=q.device))
    last_rows = qo_indptr[1:] - 1
    dec_args = (
        q[last_rows],
        *bufs,
        pool.req_to_token,
        pool.rows,
        torch.tensor(lens, device=q.device),
    )
    if impl == "triton":
        extended = extend_attention_fwd(
            *ext_args, qo_indptr, 0.25, window, tiles=(tile(4), tile(4))
        )
        decoded = decode_attention_fwd(*dec_args, 0.25, window, num_kv_splits=2, tile_n=tile(4))
    else:
        extended = extend_attention_ref(*ext_args, qo_indptr, 0.25, window)
        decoded = decode_attention_ref(*dec_args, 0.25, window)
    torch.testing.assert_close(decoded, extended[last_rows], **TOL)


def test_window_changes_the_result(paged: Callable, randn: Callable) -> None:
    """Guard for the test above: a window shorter than the context changes decode's output."""
    pool = paged([12], 1)
    bufs = (randn(pool.num_slots, 1, 8), randn(pool.num_slots, 1, 8))
    args = (
        randn(1, 1, 8),
        *bufs,
        pool.req_to_token,
        pool.rows,
        torch.tensor([12], device=bufs[0].device),
        1.0,
    )
    full, windowed = decode_attention_ref(*args, None), decode_attention_ref(*args, 3)
    assert not torch.allclose(full, windowed)
