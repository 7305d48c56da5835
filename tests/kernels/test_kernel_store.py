"""Triton store-KV writes exactly the rows at out_cache_loc, like its torch twin."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from kernels import store_kv_cache, store_kv_cache_ref, store_mla_kv_cache, store_mla_kv_cache_ref


@pytest.mark.parametrize(
    ("page_size", "loc_dtype", "num_tokens"), [(1, torch.int32, 5), (4, torch.int64, 21)]
)
def test_store_kv_matches_twin(
    paged: Callable, randn: Callable, page_size: int, loc_dtype: torch.dtype, num_tokens: int
) -> None:
    """k_buffer[loc[i]] = k[i] and v_buffer[loc[i]] = v[i]; every other slot is unchanged."""
    pool = paged([num_tokens], page_size)
    loc = pool.req_to_token[pool.rows[0], :num_tokens].to(loc_dtype)
    k, v = randn(num_tokens, 3, 16), randn(num_tokens, 3, 8)
    bufs = (randn(pool.num_slots, 3, 16), randn(pool.num_slots, 3, 8))
    twins = tuple(b.clone() for b in bufs)
    store_kv_cache(k, v, *bufs, loc)
    store_kv_cache_ref(k, v, *twins, loc)
    assert all(torch.equal(b, t) for b, t in zip(bufs, twins))


def test_store_kv_accepts_strided_heads(paged: Callable, randn: Callable) -> None:
    """k/v may be views with a non-contiguous head stride (e.g. slices of a fused qkv)."""
    pool = paged([6], 1)
    loc = pool.req_to_token[pool.rows[0], :6]
    qkv = randn(6, 6, 16)
    k, v = qkv[:, 2:4], qkv[:, 4:6]
    bufs = (randn(pool.num_slots, 2, 16), randn(pool.num_slots, 2, 16))
    twins = tuple(b.clone() for b in bufs)
    store_kv_cache(k, v, *bufs, loc)
    store_kv_cache_ref(k, v, *twins, loc)
    assert all(torch.equal(b, t) for b, t in zip(bufs, twins))


def test_store_mla_kv_writes_latent_then_rope(paged: Callable, randn: Callable) -> None:
    """kv_buffer[loc[i], 0] = [k_nope[i] | k_pe[i]] for the single MLA buffer."""
    pool = paged([9], 4)
    loc = pool.req_to_token[pool.rows[0], :9]
    nope, pe = randn(9, 1, 32), randn(9, 1, 16)
    kv = randn(pool.num_slots, 1, 48)
    twin = kv.clone()
    store_mla_kv_cache(nope, pe, kv, loc)
    store_mla_kv_cache_ref(nope, pe, twin, loc)
    assert torch.equal(kv, twin)
