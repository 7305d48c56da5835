"""Triton paged decode attention (GQA, split-KV, optional sliding window; MLA via a rope part).

Invariant: ``o[b, h]`` is softmax attention of query ``b`` (absolute position
``seq_lens[b] - 1``, its own KV already stored) over the keys at positions
``[window_start, seq_lens[b])`` of request row ``req_pool_indices[b]`` (kernels/window.py).

Two stages, as in SGLang's ``decode_attention_fwd_grouped`` (docs/sglang.md §6.1):
stage 1 runs per (request, KV head, head tile, split) with an online softmax and stores the
split's normalised partial output and LSE; stage 2 merges the splits by LSE. A split that holds
no key stores ``lse = -inf`` and weighs nothing. Key range of one request, split ``s``::

    [kv_start, seq_len)                   the attended keys (kv_start from the window)
    split_len = round_up(ceil(kv_len / num_kv_splits), TILE_N)
    [kv_start + s*split_len, min(kv_start + (s+1)*split_len, seq_len))   split s (maybe empty)
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
from kernels._softmax import online_softmax_update
from kernels.window import normalize_window

DEFAULT_NUM_KV_SPLITS = 8
DEFAULT_TILE_N = 32  # SGLang's grouped-decode BLOCK; keeps MLA's 512-wide K and V tiles in smem
INTERPRETED_TILE_N = 16


@triton.jit
def _decode_stage1(
    Q,
    K,
    V,
    ReqToToken,
    ReqPoolIdx,
    SeqLens,
    PartO,
    PartLse,
    sm_scale,
    window,
    stride_qb,
    stride_qh,
    stride_kn,
    stride_kh,
    stride_vn,
    stride_vh,
    stride_rt,
    stride_pb,
    stride_ph,
    stride_ps,
    stride_lb,
    stride_lh,
    GROUP: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    HEAD_TILES: tl.constexpr,
    D: tl.constexpr,
    DPE: tl.constexpr,
    DV: tl.constexpr,
    TILE_H: tl.constexpr,
    TILE_N: tl.constexpr,
    TILE_D: tl.constexpr,
    TILE_DPE: tl.constexpr,
    TILE_DV: tl.constexpr,
    PREC: tl.constexpr,
):
    """One (request, KV head, head tile, split): partial output and LSE of the split."""
    b = tl.program_id(0)
    kv_head = tl.program_id(1) // HEAD_TILES
    split = tl.program_id(2)
    h_in_group = (tl.program_id(1) % HEAD_TILES) * TILE_H + tl.arange(0, TILE_H)
    h_mask = h_in_group < GROUP
    heads = kv_head * GROUP + h_in_group  # (TILE_H,) query heads sharing this KV head

    seq_len = tl.load(SeqLens + b).to(tl.int32)
    row = tl.load(ReqPoolIdx + b).to(tl.int64)
    kv_start = tl.where(window >= 0, tl.maximum(seq_len - 1 - window, 0), 0)
    split_len = tl.cdiv(tl.cdiv(seq_len - kv_start, NUM_SPLITS), TILE_N) * TILE_N
    lo = kv_start + split * split_len
    hi = tl.minimum(lo + split_len, seq_len)

    offs_d = tl.arange(0, TILE_D)
    offs_dv = tl.arange(0, TILE_DV)
    q_rows = Q + b * stride_qb + heads[:, None] * stride_qh
    q = tl.load(q_rows + offs_d[None, :], mask=h_mask[:, None] & (offs_d[None, :] < D), other=0.0)
    if TILE_DPE > 0:
        offs_pe = D + tl.arange(0, TILE_DPE)
        pe_mask = h_mask[:, None] & (offs_pe[None, :] < D + DPE)
        q_pe = tl.load(q_rows + offs_pe[None, :], mask=pe_mask, other=0.0)

    m_i = tl.full([TILE_H], float("-inf"), tl.float32)
    l_i = tl.zeros([TILE_H], dtype=tl.float32)
    acc = tl.zeros([TILE_H, TILE_DV], dtype=tl.float32)
    for start in range(lo, hi, TILE_N):
        offs_n = start + tl.arange(0, TILE_N)
        n_mask = offs_n < hi
        slots = tl.load(ReqToToken + row * stride_rt + offs_n, mask=n_mask, other=0).to(tl.int64)
        k_cols = K + slots[None, :] * stride_kn + kv_head * stride_kh  # (1, TILE_N)
        k_mask = n_mask[None, :] & (offs_d[:, None] < D)
        k = tl.load(k_cols + offs_d[:, None], mask=k_mask, other=0.0)  # (TILE_D, TILE_N)
        qk = tl.dot(q, k, input_precision=PREC)  # (TILE_H, TILE_N)
        if TILE_DPE > 0:
            pe_k_mask = n_mask[None, :] & (offs_pe[:, None] < D + DPE)
            k_pe = tl.load(k_cols + offs_pe[:, None], mask=pe_k_mask, other=0.0)
            qk += tl.dot(q_pe, k_pe, input_precision=PREC)
        qk = tl.where(n_mask[None, :], qk * sm_scale, float("-inf"))
        v_rows = V + slots[:, None] * stride_vn + kv_head * stride_vh
        v_mask = n_mask[:, None] & (offs_dv[None, :] < DV)
        v = tl.load(v_rows + offs_dv[None, :], mask=v_mask, other=0.0)  # (TILE_N, TILE_DV)
        m_i, l_i, acc = online_softmax_update(qk, v, m_i, l_i, acc, PREC)

    non_empty = hi > lo
    out = tl.where(non_empty, acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None], 0.0)
    lse = tl.where(non_empty, m_i + tl.log(tl.where(l_i == 0.0, 1.0, l_i)), float("-inf"))
    part = PartO + b * stride_pb + heads[:, None] * stride_ph + split * stride_ps
    tl.store(part + offs_dv[None, :], out, mask=h_mask[:, None] & (offs_dv[None, :] < DV))
    tl.store(PartLse + b * stride_lb + heads * stride_lh + split, lse, mask=h_mask)


@triton.jit
def _decode_stage2(
    PartO,
    PartLse,
    Out,
    stride_pb,
    stride_ph,
    stride_ps,
    stride_lb,
    stride_lh,
    stride_ob,
    stride_oh,
    DV: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    TILE_S: tl.constexpr,
    TILE_DV: tl.constexpr,
):
    """One (request, query head): merge the split partials by their LSE."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_s = tl.arange(0, TILE_S)
    offs_dv = tl.arange(0, TILE_DV)
    s_mask = offs_s < NUM_SPLITS
    lse_ptrs = PartLse + b * stride_lb + h * stride_lh + offs_s
    lse = tl.load(lse_ptrs, mask=s_mask, other=float("-inf"))  # (TILE_S,)
    lse_max = tl.max(lse, 0)
    weights = tl.exp(lse - tl.where(lse_max == float("-inf"), 0.0, lse_max))  # (TILE_S,)
    part_rows = PartO + b * stride_pb + h * stride_ph + offs_s[:, None] * stride_ps
    part_ptrs = part_rows + offs_dv[None, :]  # (TILE_S, TILE_DV)
    part = tl.load(part_ptrs, mask=s_mask[:, None] & (offs_dv[None, :] < DV), other=0.0)
    denom = tl.sum(weights, 0)
    out = tl.sum(weights[:, None] * part, 0) / tl.where(denom == 0.0, 1.0, denom)
    o_ptrs = Out + b * stride_ob + h * stride_oh + offs_dv
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=offs_dv < DV)


class DecodeDims(NamedTuple):
    """Head geometry of one decode launch (``dpe`` > 0 only for MLA's rope part)."""

    d: int
    dpe: int
    dv: int


class DecodeOperands(NamedTuple):
    """The checked tensors of one decode launch (MLA: ``v_buffer`` is a view of ``k_buffer``)."""

    q: torch.Tensor  # (B, H_q, D + DPE)
    k_buffer: torch.Tensor  # (num_slots, H_kv, D + DPE)
    v_buffer: torch.Tensor  # (num_slots, H_kv, DV)
    req_to_token: torch.Tensor  # (rows, max_ctx) int32
    req_pool_indices: torch.Tensor  # (B,)
    seq_lens: torch.Tensor  # (B,)


class _Tiles(NamedTuple):
    """Tile sizes of one decode launch: heads, keys, then the three head-dim parts."""

    h: int
    n: int
    d: int
    dpe: int
    dv: int


def _tiles(group: int, dims: DecodeDims, tile_n: int | None, interpreted: bool) -> _Tiles:
    """Pick tile sizes legal for the launch mode (compiled ``tl.dot`` needs >= 16)."""
    floor = dot_floor(interpreted)
    tile_n = tile_n or (INTERPRETED_TILE_N if interpreted else DEFAULT_TILE_N)
    legal = tile_n == pow2(tile_n, floor)
    require(legal, f"tile_n must be a power of two >= {floor}, got {tile_n}")
    tile_dpe = pow2(dims.dpe, floor) if dims.dpe else 0
    tile_h = pow2(min(group, 16), floor)
    return _Tiles(tile_h, tile_n, pow2(dims.d, floor), tile_dpe, pow2(dims.dv, floor))


def check_decode_indices(ops: DecodeOperands) -> None:
    """Check the paging operands shared by decode and MLA decode."""
    check_index("req_to_token", ops.req_to_token, 2, (torch.int32,))
    check_index("req_pool_indices", ops.req_pool_indices, 1)
    check_index("seq_lens", ops.seq_lens, 1)
    check_shape("req_pool_indices", ops.req_pool_indices, (ops.q.shape[0],))
    check_shape("seq_lens", ops.seq_lens, (ops.q.shape[0],))
    check_same_device(
        ops.q.device,
        req_to_token=ops.req_to_token,
        req_pool_indices=ops.req_pool_indices,
        seq_lens=ops.seq_lens,
    )


def _stage1(
    ops: DecodeOperands,
    dims: DecodeDims,
    tiles: _Tiles,
    sm_scale: float,
    window: int,
    part_o: torch.Tensor,
    part_lse: torch.Tensor,
) -> None:
    """Launch stage 1 over (request, KV head x head tile, split)."""
    q, k, v, req_to_token = ops.q, ops.k_buffer, ops.v_buffer, ops.req_to_token
    group = q.shape[1] // k.shape[1]
    head_tiles = triton.cdiv(group, tiles.h)
    num_splits = part_o.shape[2]
    _decode_stage1[(q.shape[0], k.shape[1] * head_tiles, num_splits)](
        q,
        k,
        v,
        req_to_token,
        ops.req_pool_indices,
        ops.seq_lens,
        part_o,
        part_lse,
        sm_scale,
        window,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        req_to_token.stride(0),
        part_o.stride(0),
        part_o.stride(1),
        part_o.stride(2),
        part_lse.stride(0),
        part_lse.stride(1),
        GROUP=group,
        NUM_SPLITS=num_splits,
        HEAD_TILES=head_tiles,
        D=dims.d,
        DPE=dims.dpe,
        DV=dims.dv,
        TILE_H=tiles.h,
        TILE_N=tiles.n,
        TILE_D=tiles.d,
        TILE_DPE=tiles.dpe,
        TILE_DV=tiles.dv,
        PREC=dot_precision(q.dtype),
        num_warps=4,
        num_stages=2,
    )


def _stage2(part_o: torch.Tensor, part_lse: torch.Tensor, out: torch.Tensor) -> None:
    """Launch stage 2 over (request, query head): merge ``part_o (B, H_q, splits, DV)``."""
    batch, num_q_heads, num_splits, dv = part_o.shape
    _decode_stage2[(batch, num_q_heads)](
        part_o,
        part_lse,
        out,
        part_o.stride(0),
        part_o.stride(1),
        part_o.stride(2),
        part_lse.stride(0),
        part_lse.stride(1),
        out.stride(0),
        out.stride(1),
        DV=dv,
        NUM_SPLITS=num_splits,
        TILE_S=pow2(num_splits, 1),
        TILE_DV=pow2(dv, 1),
        num_warps=4,
        num_stages=2,
    )


def launch_decode(
    ops: DecodeOperands,
    dims: DecodeDims,
    sm_scale: float,
    sliding_window: int | None,
    num_kv_splits: int,
    tile_n: int | None,
) -> torch.Tensor:
    """Run both decode stages on checked operands; return ``o (B, H_q, DV)``."""
    require(num_kv_splits >= 1, f"num_kv_splits must be >= 1, got {num_kv_splits}")
    interpreted = launch_device(ops.q)
    batch, num_q_heads = ops.q.shape[:2]
    tiles = _tiles(num_q_heads // ops.k_buffer.shape[1], dims, tile_n, interpreted)
    part_shape = (batch, num_q_heads, num_kv_splits)
    part_o = torch.empty(*part_shape, dims.dv, dtype=torch.float32, device=ops.q.device)
    part_lse = torch.empty(*part_shape, dtype=torch.float32, device=ops.q.device)
    out = torch.empty(batch, num_q_heads, dims.dv, dtype=ops.q.dtype, device=ops.q.device)
    if batch > 0:
        _stage1(ops, dims, tiles, sm_scale, normalize_window(sliding_window), part_o, part_lse)
        _stage2(part_o, part_lse, out)
    return out


def decode_attention_fwd(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    sliding_window: int | None = None,
    *,
    num_kv_splits: int = DEFAULT_NUM_KV_SPLITS,
    tile_n: int | None = None,
) -> torch.Tensor:
    """Paged GQA decode attention; returns ``o (B, H_q, Dv)`` in ``q.dtype``.

    Shapes: ``q (B, H_q, D)``, ``k_buffer (num_slots, H_kv, D)``, ``v_buffer (num_slots, H_kv,
    Dv)``, ``req_to_token (rows, max_ctx) int32``, ``req_pool_indices (B,)``, ``seq_lens (B,)``
    (int32/int64; ``seq_lens[b] >= 1`` counts the current token, whose KV is stored).
    ``tile_n`` overrides the key tile (tests use it to force multi-tile paths).
    """
    for name, t in (("q", q), ("k_buffer", k_buffer), ("v_buffer", v_buffer)):
        check_float(name, t, 3)
    num_q_heads, head_dim = q.shape[1:]
    num_slots, num_kv_heads = k_buffer.shape[:2]
    check_shape("k_buffer", k_buffer, (None, None, head_dim))
    check_shape("v_buffer", v_buffer, (num_slots, num_kv_heads, None))
    require(
        num_q_heads % num_kv_heads == 0,
        f"H_q={num_q_heads} must be a multiple of H_kv={num_kv_heads} (GQA group)",
    )
    check_same_dtype(q.dtype, k_buffer=k_buffer, v_buffer=v_buffer)
    check_same_device(q.device, k_buffer=k_buffer, v_buffer=v_buffer)
    ops = DecodeOperands(q, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens)
    check_decode_indices(ops)
    dims = DecodeDims(d=head_dim, dpe=0, dv=v_buffer.shape[2])
    return launch_decode(ops, dims, sm_scale, sliding_window, num_kv_splits, tile_n)
