"""The torch twins (kernels/reference.py) agree with naive per-query float64 attention."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from kernels.reference import (
    decode_attention_ref,
    extend_attention_ref,
    mla_decode_ref,
    naive_dense_attention,
    store_kv_cache_ref,
    store_mla_kv_cache_ref,
)

F64 = torch.float64
TOL = {"atol": 1e-10, "rtol": 1e-10}


def _gather(buffer: torch.Tensor, req_to_token: torch.Tensor, row: int, n: int) -> torch.Tensor:
    """Return the first ``n`` positions of a request's row, densely: ``(n, H, d)``."""
    return buffer[req_to_token[row, :n].long()]


@pytest.mark.parametrize(("group", "window"), [(1, None), (2, 2), (4, 0), (2, 50)])
def test_decode_twin_matches_naive(
    paged: Callable, randn: Callable, group: int, window: int | None
) -> None:
    """Decode of request b is the naive attention of its last position over its stored keys."""
    lens = [1, 6, 13]
    pool = paged(lens, 4)
    k_buf, v_buf = randn(pool.num_slots, 2, 8, dtype=F64), randn(pool.num_slots, 2, 5, dtype=F64)
    q = randn(3, 2 * group, 8, dtype=F64)
    seq_lens = torch.tensor(lens, device=q.device)
    out = decode_attention_ref(q, k_buf, v_buf, pool.req_to_token, pool.rows, seq_lens, 0.3, window)
    for b, (row, n) in enumerate(zip(pool.rows.tolist(), lens)):
        k, v = _gather(k_buf, pool.req_to_token, row, n), _gather(v_buf, pool.req_to_token, row, n)
        want = naive_dense_attention(q[b : b + 1], k, v, n - 1, window, sm_scale=0.3)
        torch.testing.assert_close(out[b : b + 1], want, **TOL)


@pytest.mark.parametrize(("group", "window"), [(1, None), (4, 3), (2, 100)])
def test_extend_twin_matches_naive(
    paged: Callable, randn: Callable, group: int, window: int | None
) -> None:
    """Extend rows of request b are naive attention over [prefix from pool | new tokens]."""
    prefix, ext = [0, 5, 9], [4, 1, 6]
    pool = paged([p + e for p, e in zip(prefix, ext)], 1)
    k_buf, v_buf = randn(pool.num_slots, 2, 8, dtype=F64), randn(pool.num_slots, 2, 8, dtype=F64)
    q, k, v = (
        randn(11, 2 * group, 8, dtype=F64),
        randn(11, 2, 8, dtype=F64),
        randn(11, 2, 8, dtype=F64),
    )
    qo = [0, 4, 5, 11]
    args = (pool.req_to_token, pool.rows, torch.tensor(prefix), torch.tensor(qo))
    out = extend_attention_ref(q, k, v, k_buf, v_buf, *(a.to(q.device) for a in args), 0.4, window)
    for b, row in enumerate(pool.rows.tolist()):
        lo, hi, p = qo[b], qo[b + 1], prefix[b]
        keys = torch.cat([_gather(k_buf, pool.req_to_token, row, p), k[lo:hi]])
        vals = torch.cat([_gather(v_buf, pool.req_to_token, row, p), v[lo:hi]])
        want = naive_dense_attention(q[lo:hi], keys, vals, p, window, sm_scale=0.4)
        torch.testing.assert_close(out[lo:hi], want, **TOL)


@pytest.mark.parametrize("window", [None, 3])
def test_mla_twin_matches_naive(paged: Callable, randn: Callable, window: int | None) -> None:
    """MLA decode is naive MQA with K = the whole latent row and V = its first kv_lora_rank."""
    lens, rank = [2, 11], 8
    pool = paged(lens, 4)
    kv = randn(pool.num_slots, 1, rank + 4, dtype=F64)
    q = randn(2, 3, rank + 4, dtype=F64)
    seq_lens = torch.tensor(lens, device=q.device)
    out = mla_decode_ref(q, kv, pool.req_to_token, pool.rows, seq_lens, 0.2, rank, window)
    for b, (row, n) in enumerate(zip(pool.rows.tolist(), lens)):
        latent = _gather(kv, pool.req_to_token, row, n)
        want = naive_dense_attention(q[b : b + 1], latent, latent[..., :rank], n - 1, window, 0.2)
        torch.testing.assert_close(out[b : b + 1], want, **TOL)


def test_naive_attention_of_a_single_visible_key_is_its_value(randn: Callable) -> None:
    """With W = 0 each query sees only itself, so the output is its own value row."""
    q, k, v = randn(5, 2, 4), randn(5, 2, 4), randn(5, 2, 3)
    torch.testing.assert_close(naive_dense_attention(q, k, v, 0, 0), v.double())


def test_naive_attention_of_equal_scores_is_the_mean_value(randn: Callable) -> None:
    """Zero queries score every key equally: the output is the mean of the visible values."""
    v = randn(6, 1, 3, dtype=F64)
    out = naive_dense_attention(torch.zeros(2, 1, 4, dtype=F64), randn(6, 1, 4), v, 4, None)
    torch.testing.assert_close(out[0, 0], v[:5, 0].mean(0))
    torch.testing.assert_close(out[1, 0], v[:, 0].mean(0))


def test_store_twins_write_exactly_the_target_slots(randn: Callable) -> None:
    """The store twins change the rows at out_cache_loc and nothing else."""
    k_buf, v_buf, kv = randn(10, 2, 4), randn(10, 2, 3), randn(10, 1, 6)
    before = [t.clone() for t in (k_buf, v_buf, kv)]
    loc = torch.tensor([7, 2, 5], dtype=torch.int32, device=k_buf.device)
    k, v, nope, pe = randn(3, 2, 4), randn(3, 2, 3), randn(3, 1, 4), randn(3, 1, 2)
    store_kv_cache_ref(k, v, k_buf, v_buf, loc)
    store_mla_kv_cache_ref(nope, pe, kv, loc)
    untouched = [i for i in range(10) if i not in (7, 2, 5)]
    for t, old in zip((k_buf, v_buf, kv), before):
        assert torch.equal(t[untouched], old[untouched])
    assert torch.equal(k_buf[loc.long()], k) and torch.equal(v_buf[loc.long()], v)
    assert torch.equal(kv[loc.long()], torch.cat([nope, pe], -1))
