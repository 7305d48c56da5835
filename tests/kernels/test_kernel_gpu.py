"""Real-shape bf16 kernels on CUDA equal their float32-computing twins (skipped without CUDA)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from kernels import (
    decode_attention_fwd,
    decode_attention_ref,
    extend_attention_fwd,
    extend_attention_ref,
    mla_decode_fwd,
    mla_decode_ref,
    store_kv_cache,
    store_kv_cache_ref,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]
BF16 = torch.bfloat16
TOL = {"atol": 2e-2, "rtol": 2e-2}
LENS = [1, 37, 1000, 2048, 513]


@pytest.mark.parametrize(("group", "window"), [(4, None), (8, 127), (1, 4095)])
def test_decode_bf16_real_shapes(
    paged: Callable, randn: Callable, group: int, window: int | None
) -> None:
    """Llama-like decode (D = 128, page 16, ragged to 2048) matches the twin in bf16."""
    pool = paged(LENS, 16)
    k_buf, v_buf = (randn(pool.num_slots, 8, 128, dtype=BF16) for _ in "kv")
    q = randn(len(LENS), 8 * group, 128, dtype=BF16)
    args = (
        q,
        k_buf,
        v_buf,
        pool.req_to_token,
        pool.rows,
        torch.tensor(LENS, device="cuda"),
        128**-0.5,
        window,
    )
    torch.testing.assert_close(decode_attention_fwd(*args), decode_attention_ref(*args), **TOL)


@pytest.mark.parametrize("window", [None, 255])
def test_mla_decode_bf16_deepseek_shapes(
    paged: Callable, randn: Callable, window: int | None
) -> None:
    """DeepSeek MLA decode (128 heads, rank 512 + rope 64) matches the twin in bf16."""
    pool = paged(LENS, 16)
    kv = randn(pool.num_slots, 1, 576, dtype=BF16)
    q = randn(len(LENS), 128, 576, dtype=BF16)
    args = (
        q,
        kv,
        pool.req_to_token,
        pool.rows,
        torch.tensor(LENS, device="cuda"),
        576**-0.5,
        512,
        window,
    )
    torch.testing.assert_close(mla_decode_fwd(*args), mla_decode_ref(*args), **TOL)


@pytest.mark.parametrize(("group", "window"), [(4, None), (2, 127)])
def test_extend_bf16_real_shapes(
    paged: Callable, randn: Callable, group: int, window: int | None
) -> None:
    """Extend with long prefixes and ragged extends (D = 128) matches the twin in bf16."""
    prefix, ext = [0, 512, 1000], [300, 256, 1]
    pool = paged([p + e for p, e in zip(prefix, ext)], 16)
    k_buf, v_buf = (randn(pool.num_slots, 8, 128, dtype=BF16) for _ in "kv")
    q = randn(sum(ext), 8 * group, 128, dtype=BF16)
    k, v = (randn(sum(ext), 8, 128, dtype=BF16) for _ in "kv")
    qo = torch.tensor([0, 300, 556, 557], device="cuda")
    prefix_lens = torch.tensor(prefix, device="cuda")
    args = (q, k, v, k_buf, v_buf, pool.req_to_token, pool.rows, prefix_lens, qo, 128**-0.5, window)
    torch.testing.assert_close(extend_attention_fwd(*args), extend_attention_ref(*args), **TOL)


def test_store_kv_bf16_real_shapes(paged: Callable, randn: Callable) -> None:
    """Storing 4096 tokens x 8 heads x 128 into a paged pool equals the twin bit for bit."""
    pool = paged([4096], 16)
    loc = pool.req_to_token[pool.rows[0], :4096]
    k, v = (randn(4096, 8, 128, dtype=BF16) for _ in "kv")
    bufs = [torch.zeros(pool.num_slots, 8, 128, dtype=BF16, device="cuda") for _ in "kv"]
    twins = [b.clone() for b in bufs]
    store_kv_cache(k, v, *bufs, loc)
    store_kv_cache_ref(k, v, *twins, loc)
    assert all(torch.equal(b, t) for b, t in zip(bufs, twins))
