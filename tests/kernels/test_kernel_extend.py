"""Triton extend attention equals its torch twin (paged prefix, ragged causal new tokens)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from kernels import extend_attention_fwd, extend_attention_ref

TOL = {"atol": 1e-4, "rtol": 1e-3}

# (page_size, head_dim, group, window, (tile_m, tile_n), prefix_lens, extend_lens)
EXTEND_CASES = [
    (1, 16, 1, None, (4, 4), [0, 5, 12], [7, 1, 9]),  # a request without prefix
    (4, 32, 2, 3, (4, 8), [0, 5, 12], [7, 1, 9]),  # window shorter than prefix and extend
    (4, 64, 4, 100, (8, 4), [3, 8], [10, 6]),  # window longer than the context
    (1, 24, 2, 6, (2, 4), [9, 4, 2], [5, 0, 11]),  # non-power-of-two dim, an empty extend
]


@pytest.mark.parametrize(
    ("page_size", "d", "group", "window", "tiles", "prefix", "ext"), EXTEND_CASES
)
def test_extend_matches_twin(
    paged: Callable,
    randn: Callable,
    tile: Callable,
    page_size: int,
    d: int,
    group: int,
    window: int | None,
    tiles: tuple[int, int],
    prefix: list[int],
    ext: list[int],
) -> None:
    """New token i of request b attends its windowed prefix from the pool and new tokens <= i."""
    pool = paged([p + e for p, e in zip(prefix, ext)], page_size)
    num_kv_heads, num_tokens = 2, sum(ext)
    k_buf, v_buf = randn(pool.num_slots, num_kv_heads, d), randn(pool.num_slots, num_kv_heads, d)
    q = randn(num_tokens, num_kv_heads * group, d)
    k, v = randn(num_tokens, num_kv_heads, d), randn(num_tokens, num_kv_heads, d)
    qo_indptr = torch.tensor([0, *torch.tensor(ext).cumsum(0).tolist()], device=q.device)
    prefix_lens = torch.tensor(prefix, dtype=torch.int32, device=q.device)
    args = (
        q,
        k,
        v,
        k_buf,
        v_buf,
        pool.req_to_token,
        pool.rows,
        prefix_lens,
        qo_indptr,
        d**-0.5,
        window,
    )
    out = extend_attention_fwd(*args, tiles=(tile(tiles[0]), tile(tiles[1])))
    assert out.shape == (num_tokens, num_kv_heads * group, d) and out.dtype == q.dtype
    torch.testing.assert_close(out, extend_attention_ref(*args), **TOL)


def test_extend_takes_a_distinct_value_head_dim(paged: Callable, randn: Callable) -> None:
    """Dv may differ from D (MLA prefill in MHA form): the output has Dv columns."""
    pool = paged([6, 9], 4)
    k_buf, v_buf = randn(pool.num_slots, 1, 32), randn(pool.num_slots, 1, 16)
    q, k, v = randn(7, 2, 32), randn(7, 1, 32), randn(7, 1, 16)
    index = [torch.tensor(x, device=q.device) for x in ([2, 6], [0, 4, 7])]
    args = (q, k, v, k_buf, v_buf, pool.req_to_token, pool.rows, *index, 0.2, None)
    out = extend_attention_fwd(*args, max_len_extend=4)
    torch.testing.assert_close(out, extend_attention_ref(*args), **TOL)
