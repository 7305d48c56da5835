"""Triton decode and MLA decode equal their torch twins (paged, GQA, split-KV, windows)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from kernels import decode_attention_fwd, decode_attention_ref, mla_decode_fwd, mla_decode_ref

TOL = {"atol": 1e-4, "rtol": 1e-3}
LENS = [1, 7, 19, 4]  # ragged, with a one-token context

# (page_size, head_dim, v_head_dim, group, window, num_kv_splits, tile_n)
DECODE_CASES = [
    (1, 16, 16, 1, None, 1, 4),  # MHA, one split, several tiles
    (4, 32, 32, 2, 3, 3, 4),  # window shorter than the context
    (4, 64, 64, 4, 100, 4, 8),  # window longer than the context
    (1, 48, 24, 2, 5, 2, 16),  # non-power-of-two dims, Dv != D
    (4, 16, 16, 4, None, 8, 4),  # more splits than keys: empty splits merge as nothing
]


@pytest.mark.parametrize(
    ("page_size", "d", "dv", "group", "window", "splits", "tile_n"), DECODE_CASES
)
def test_decode_matches_twin(
    paged: Callable,
    randn: Callable,
    tile: Callable,
    page_size: int,
    d: int,
    dv: int,
    group: int,
    window: int | None,
    splits: int,
    tile_n: int,
) -> None:
    """Each request's output is attention of its last position over its windowed paged keys."""
    pool = paged(LENS, page_size)
    num_kv_heads = 2
    k_buf, v_buf = randn(pool.num_slots, num_kv_heads, d), randn(pool.num_slots, num_kv_heads, dv)
    q = randn(len(LENS), num_kv_heads * group, d)
    seq_lens = torch.tensor(LENS, dtype=torch.int32, device=q.device)
    args = (q, k_buf, v_buf, pool.req_to_token, pool.rows, seq_lens, d**-0.5, window)
    out = decode_attention_fwd(*args, num_kv_splits=splits, tile_n=tile(tile_n))
    assert out.shape == (len(LENS), num_kv_heads * group, dv) and out.dtype == q.dtype
    torch.testing.assert_close(out, decode_attention_ref(*args), **TOL)


@pytest.mark.parametrize(("window", "splits", "num_heads"), [(None, 3, 4), (5, 2, 20)])
def test_mla_decode_matches_twin(
    paged: Callable,
    randn: Callable,
    tile: Callable,
    window: int | None,
    splits: int,
    num_heads: int,
) -> None:
    """MLA decode scores q_nope.c + q_pe.k_pe and returns the weighted latent c."""
    rank, rope = 32, 16
    pool = paged(LENS, 4)
    kv = randn(pool.num_slots, 1, rank + rope)
    q = randn(len(LENS), num_heads, rank + rope)
    seq_lens = torch.tensor(LENS, device=q.device)
    args = (q, kv, pool.req_to_token, pool.rows, seq_lens, 0.1, rank, window)
    out = mla_decode_fwd(*args, num_kv_splits=splits, tile_n=tile(8))
    assert out.shape == (len(LENS), num_heads, rank)
    torch.testing.assert_close(out, mla_decode_ref(*args), **TOL)


def test_decode_of_an_empty_batch_is_empty(paged: Callable, randn: Callable) -> None:
    """A batch of zero requests launches nothing and returns a (0, H_q, Dv) tensor."""
    pool = paged([3], 1)
    k_buf = randn(pool.num_slots, 1, 16)
    empty = pool.rows[:0]
    out = decode_attention_fwd(randn(0, 2, 16), k_buf, k_buf, pool.req_to_token, empty, empty, 1.0)
    assert out.shape == (0, 2, 16)
