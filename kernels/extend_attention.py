"""Triton paged extend (prefill) attention: cached prefix from the pool, new tokens causal.

Invariant: the new token ``i`` of request ``b`` (absolute position ``prefix_lens[b] + i``)
attends the keys ``[window_start, prefix_lens[b] + i]`` (kernels/window.py), reading positions
``< prefix_lens[b]`` from the pool through ``req_to_token`` and the rest from ``k_extend``.

NOTE: the new tokens' K/V come from ``k_extend/v_extend``, as in SGLang's ``_fwd_kernel``
(docs/sglang.md §6.2); the kernel never reads their pool slots, so the caller may store
them before or after the call. Token regions of request ``b`` (absolute positions)::

    [0, prefix_len)                      prefix: pool slots req_to_token[row, pos]   (phase 1)
    [prefix_len, prefix_len + ext_len)   new tokens: rows qo_indptr[b] + i of q/k/v  (phase 2)

One program per (request, query head, tile of TILE_M new tokens); tiles wholly before the
window of the tile's first query are skipped.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from kernels._runtime import (
    check_float,
    check_index,
    check_same_device,
    check_same_dtype,
    check_shape,
    dot_floor,
    dot_precision,
    launch_device,
    pow2,
    require,
)
from kernels._softmax import online_softmax_update, window_ok
from kernels.window import normalize_window

DEFAULT_TILES = (64, 64)
INTERPRETED_TILES = (16, 16)


class _Tiles(NamedTuple):
    """Tile sizes of one extend launch: queries, keys, K head dim, V head dim."""

    m: int
    n: int
    d: int
    dv: int


@triton.jit
def _extend_fwd(
    Q,
    KExt,
    VExt,
    Out,
    KBuf,
    VBuf,
    ReqToToken,
    ReqPoolIdx,
    PrefixLens,
    QoIndptr,
    sm_scale,
    window,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_ot,
    stride_oh,
    stride_kbn,
    stride_kbh,
    stride_vbn,
    stride_vbh,
    stride_rt,
    GROUP: tl.constexpr,
    D: tl.constexpr,
    DV: tl.constexpr,
    TILE_M: tl.constexpr,
    TILE_N: tl.constexpr,
    TILE_D: tl.constexpr,
    TILE_DV: tl.constexpr,
    PREC: tl.constexpr,
):
    """One (request, query head, query tile): both phases, then the normalised output."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    m0 = tl.program_id(2) * TILE_M
    ext_start = tl.load(QoIndptr + b).to(tl.int64)
    ext_len = (tl.load(QoIndptr + b + 1) - ext_start).to(tl.int32)
    if m0 >= ext_len:
        return
    kv_head = h // GROUP
    prefix_len = tl.load(PrefixLens + b).to(tl.int32)
    row = tl.load(ReqPoolIdx + b).to(tl.int64)
    offs_m = m0 + tl.arange(0, TILE_M)  # extend-local query index
    m_mask = offs_m < ext_len
    offs_d = tl.arange(0, TILE_D)
    offs_dv = tl.arange(0, TILE_DV)
    q_ptrs = Q + (ext_start + offs_m)[:, None] * stride_qt + h * stride_qh + offs_d[None, :]
    q = tl.load(q_ptrs, mask=m_mask[:, None] & (offs_d[None, :] < D), other=0.0)
    d_mask = offs_d[:, None] < D
    dv_mask = offs_dv[None, :] < DV
    m_i = tl.full([TILE_M], float("-inf"), tl.float32)
    l_i = tl.zeros([TILE_M], dtype=tl.float32)
    acc = tl.zeros([TILE_M, TILE_DV], dtype=tl.float32)

    # Phase 1: prefix keys [lo, prefix_len) from the pool; all are causal-visible.
    q_pos = prefix_len + offs_m
    lo = tl.where(window >= 0, tl.maximum(prefix_len + m0 - window, 0), 0)
    for start in range(lo, prefix_len, TILE_N):
        offs_n = start + tl.arange(0, TILE_N)
        n_mask = offs_n < prefix_len
        slots = tl.load(ReqToToken + row * stride_rt + offs_n, mask=n_mask, other=0).to(tl.int64)
        k_ptrs = KBuf + slots[None, :] * stride_kbn + kv_head * stride_kbh + offs_d[:, None]
        k = tl.load(k_ptrs, mask=n_mask[None, :] & d_mask, other=0.0)
        v_ptrs = VBuf + slots[:, None] * stride_vbn + kv_head * stride_vbh + offs_dv[None, :]
        v = tl.load(v_ptrs, mask=n_mask[:, None] & dv_mask, other=0.0)
        visible = n_mask[None, :] & window_ok(q_pos[:, None], offs_n[None, :], window)
        qk = tl.where(visible, tl.dot(q, k, input_precision=PREC) * sm_scale, float("-inf"))
        m_i, l_i, acc = online_softmax_update(qk, v, m_i, l_i, acc, PREC)

    # Phase 2: new keys [lo, min(ext_len, m0 + TILE_M)) from k_extend, causal within the extend.
    lo = tl.where(window >= 0, tl.maximum(m0 - window, 0), 0)
    hi = tl.minimum(ext_len, m0 + TILE_M)
    for start in range(lo, hi, TILE_N):
        offs_n = start + tl.arange(0, TILE_N)
        n_mask = offs_n < hi
        rows = ext_start + offs_n
        k_ptrs = KExt + rows[None, :] * stride_kt + kv_head * stride_kh + offs_d[:, None]
        k = tl.load(k_ptrs, mask=n_mask[None, :] & d_mask, other=0.0)
        v_ptrs = VExt + rows[:, None] * stride_vt + kv_head * stride_vh + offs_dv[None, :]
        v = tl.load(v_ptrs, mask=n_mask[:, None] & dv_mask, other=0.0)
        causal = offs_n[None, :] <= offs_m[:, None]
        visible = n_mask[None, :] & causal & window_ok(offs_m[:, None], offs_n[None, :], window)
        qk = tl.where(visible, tl.dot(q, k, input_precision=PREC) * sm_scale, float("-inf"))
        m_i, l_i, acc = online_softmax_update(qk, v, m_i, l_i, acc, PREC)

    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    o_ptrs = Out + (ext_start + offs_m)[:, None] * stride_ot + h * stride_oh + offs_dv[None, :]
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=m_mask[:, None] & dv_mask)


def _check_extend(
    new: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    pool: tuple[torch.Tensor, torch.Tensor],
    index: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
) -> None:
    """Check ``new = (q, k, v)``, ``pool = (k_buffer, v_buffer)`` and the paging operands."""
    (q, k, v), (k_buffer, v_buffer) = new, pool
    req_to_token, req_pool_indices, prefix_lens, qo_indptr = index
    for name, t in zip(("q_extend", "k_extend", "v_extend", "k_buffer", "v_buffer"), (*new, *pool)):
        check_float(name, t, 3)
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads, dv = k_buffer.shape[1], v_buffer.shape[2]
    check_shape("k_extend", k, (num_tokens, num_kv_heads, head_dim))
    check_shape("v_extend", v, (num_tokens, num_kv_heads, dv))
    check_shape("k_buffer", k_buffer, (None, num_kv_heads, head_dim))
    check_shape("v_buffer", v_buffer, (k_buffer.shape[0], num_kv_heads, dv))
    require(
        num_q_heads % num_kv_heads == 0,
        f"H_q={num_q_heads} must be a multiple of H_kv={num_kv_heads} (GQA group)",
    )
    check_same_dtype(q.dtype, k_extend=k, v_extend=v, k_buffer=k_buffer, v_buffer=v_buffer)
    check_index("req_to_token", req_to_token, 2, (torch.int32,))
    for name, t in zip(("req_pool_indices", "prefix_lens", "qo_indptr"), index[1:]):
        check_index(name, t, 1)
    batch = req_pool_indices.shape[0]
    check_shape("prefix_lens", prefix_lens, (batch,))
    check_shape("qo_indptr", qo_indptr, (batch + 1,))
    others = dict(zip(("k_extend", "v_extend", "k_buffer", "v_buffer"), (k, v, *pool)))
    check_same_device(q.device, **others, req_to_token=req_to_token, qo_indptr=qo_indptr)
    check_same_device(q.device, req_pool_indices=req_pool_indices, prefix_lens=prefix_lens)


def _tiles(tiles: tuple[int, int] | None, head_dims: tuple[int, int], interpreted: bool) -> _Tiles:
    """Pick tile sizes legal for the launch mode (compiled ``tl.dot`` needs >= 16)."""
    floor = dot_floor(interpreted)
    tile_m, tile_n = tiles or (INTERPRETED_TILES if interpreted else DEFAULT_TILES)
    for name, t in (("TILE_M", tile_m), ("TILE_N", tile_n)):
        require(t == pow2(t, floor), f"{name} must be a power of two >= {floor}, got {t}")
    return _Tiles(tile_m, tile_n, pow2(head_dims[0], floor), pow2(head_dims[1], floor))


def _launch(
    new: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    pool: tuple[torch.Tensor, torch.Tensor],
    index: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    out: torch.Tensor,
    tiles: _Tiles,
    grid: tuple[int, int, int],
    sm_scale: float,
    window: int,
) -> None:
    """Launch ``_extend_fwd`` on checked operands."""
    (q, k, v), (k_buf, v_buf), req_to_token = new, pool, index[0]
    _extend_fwd[grid](
        q,
        k,
        v,
        out,
        k_buf,
        v_buf,
        *index,
        sm_scale,
        window,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        out.stride(0),
        out.stride(1),
        k_buf.stride(0),
        k_buf.stride(1),
        v_buf.stride(0),
        v_buf.stride(1),
        req_to_token.stride(0),
        GROUP=q.shape[1] // k.shape[1],
        D=q.shape[2],
        DV=v.shape[2],
        TILE_M=tiles.m,
        TILE_N=tiles.n,
        TILE_D=tiles.d,
        TILE_DV=tiles.dv,
        PREC=dot_precision(q.dtype),
        num_warps=4 if q.shape[2] <= 64 else 8,
        num_stages=1,
    )


def extend_attention_fwd(
    q_extend: torch.Tensor,
    k_extend: torch.Tensor,
    v_extend: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    qo_indptr: torch.Tensor,
    sm_scale: float,
    sliding_window: int | None = None,
    *,
    max_len_extend: int | None = None,
    tiles: tuple[int, int] | None = None,
) -> torch.Tensor:
    """Paged extend attention; returns ``o (T, H_q, Dv)`` in ``q_extend.dtype``.

    Shapes: ``q_extend (T, H_q, D)``, ``k_extend (T, H_kv, D)``, ``v_extend (T, H_kv, Dv)``
    with the requests' new tokens packed in order: request ``b`` owns rows
    ``[qo_indptr[b], qo_indptr[b+1])`` (``qo_indptr (B+1,)``, ``qo_indptr[0] == 0``);
    ``prefix_lens (B,)`` cached tokens per request; pool and rows as in decode.
    ``max_len_extend`` (host int) avoids a device sync; ``tiles = (TILE_M, TILE_N)`` overrides
    the tile sizes (tests use it to force multi-tile paths).
    """
    new, pool = (q_extend, k_extend, v_extend), (k_buffer, v_buffer)
    index = (req_to_token, req_pool_indices, prefix_lens, qo_indptr)
    _check_extend(new, pool, index)
    picked = _tiles(tiles, (q_extend.shape[2], v_buffer.shape[2]), launch_device(q_extend))
    batch = req_pool_indices.shape[0]
    if max_len_extend is None:
        max_len_extend = int((qo_indptr[1:] - qo_indptr[:-1]).max()) if batch else 0
    out = q_extend.new_empty(*q_extend.shape[:2], v_buffer.shape[2])
    if batch > 0 and max_len_extend > 0:
        grid = (batch, q_extend.shape[1], triton.cdiv(max_len_extend, picked.m))
        _launch(new, pool, index, out, picked, grid, sm_scale, normalize_window(sliding_window))
    return out
