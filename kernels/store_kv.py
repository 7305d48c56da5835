"""Triton store-KV: scatter new tokens' K/V rows into the pool at their slots.

Invariant: after the call, ``k_buffer[out_cache_loc[i]] == k[i]`` and ``v_buffer[...] == v[i]``
for every token ``i`` (MLA: ``kv_buffer[loc[i], 0] == [k_nope[i] | k_pe[i]]``), and no other
slot changes. Slots in ``out_cache_loc`` must be distinct (padding tokens may all target the
reserved slot 0: the value left there is unspecified, and nothing reads it).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._runtime import (
    check_float,
    check_index,
    check_same_device,
    check_same_dtype,
    check_shape,
    launch_device,
    pow2,
)

TILE_TOKENS = 16


@triton.jit
def _scatter_rows(
    Src,
    Dst,
    Loc,
    num_tokens,
    stride_sn,
    stride_sh,
    stride_dn,
    stride_dh,
    DST_OFFSET: tl.constexpr,
    WIDTH: tl.constexpr,
    TILE_N: tl.constexpr,
    TILE_W: tl.constexpr,
):
    """One (token tile, head): ``Dst[Loc[n], h, DST_OFFSET : DST_OFFSET + WIDTH] = Src[n, h]``."""
    h = tl.program_id(1)
    offs_n = (tl.program_id(0) * TILE_N + tl.arange(0, TILE_N)).to(tl.int64)
    offs_w = tl.arange(0, TILE_W)
    n_mask = offs_n < num_tokens
    mask = n_mask[:, None] & (offs_w[None, :] < WIDTH)
    loc = tl.load(Loc + offs_n, mask=n_mask, other=0).to(tl.int64)
    x = tl.load(Src + offs_n[:, None] * stride_sn + h * stride_sh + offs_w[None, :], mask=mask)
    dst = Dst + loc[:, None] * stride_dn + h * stride_dh + DST_OFFSET + offs_w[None, :]
    tl.store(dst, x, mask=mask)


def _scatter(src: torch.Tensor, dst: torch.Tensor, loc: torch.Tensor, dst_offset: int) -> None:
    """Launch ``_scatter_rows`` for checked operands (``src (N, H, W)`` into ``dst``)."""
    num_tokens, num_heads, width = src.shape
    if num_tokens == 0:
        return
    grid = (triton.cdiv(num_tokens, TILE_TOKENS), num_heads)
    _scatter_rows[grid](
        src,
        dst,
        loc,
        num_tokens,
        src.stride(0),
        src.stride(1),
        dst.stride(0),
        dst.stride(1),
        DST_OFFSET=dst_offset,
        WIDTH=width,
        TILE_N=TILE_TOKENS,
        TILE_W=pow2(width, 1),
    )


def store_kv_cache(
    k: torch.Tensor,
    v: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    out_cache_loc: torch.Tensor,
) -> None:
    """Write ``k (N, H, D)`` and ``v (N, H, Dv)`` into the pool rows ``out_cache_loc (N,)``."""
    for name, t in (("k", k), ("v", v), ("k_buffer", k_buffer), ("v_buffer", v_buffer)):
        check_float(name, t, 3)
    num_tokens, num_heads = k.shape[:2]
    check_shape("v", v, (num_tokens, num_heads, None))
    check_shape("k_buffer", k_buffer, (None, num_heads, k.shape[2]))
    check_shape("v_buffer", v_buffer, (k_buffer.shape[0], num_heads, v.shape[2]))
    check_index("out_cache_loc", out_cache_loc, 1)
    check_shape("out_cache_loc", out_cache_loc, (num_tokens,))
    check_same_dtype(k_buffer.dtype, k=k, v=v, v_buffer=v_buffer)
    check_same_device(k.device, v=v, k_buffer=k_buffer, v_buffer=v_buffer, loc=out_cache_loc)
    launch_device(k)
    _scatter(k, k_buffer, out_cache_loc, 0)
    _scatter(v, v_buffer, out_cache_loc, 0)


def store_mla_kv_cache(
    k_nope: torch.Tensor,
    k_pe: torch.Tensor,
    kv_buffer: torch.Tensor,
    out_cache_loc: torch.Tensor,
) -> None:
    """Write ``[k_nope (N, 1, R) | k_pe (N, 1, P)]`` into ``kv_buffer (slots, 1, R + P)``."""
    for name, t in (("k_nope", k_nope), ("k_pe", k_pe), ("kv_buffer", kv_buffer)):
        check_float(name, t, 3)
    num_tokens, rank = k_nope.shape[0], k_nope.shape[2]
    check_shape("k_nope", k_nope, (num_tokens, 1, rank))
    check_shape("k_pe", k_pe, (num_tokens, 1, None))
    check_shape("kv_buffer", kv_buffer, (None, 1, rank + k_pe.shape[2]))
    check_index("out_cache_loc", out_cache_loc, 1)
    check_shape("out_cache_loc", out_cache_loc, (num_tokens,))
    check_same_dtype(kv_buffer.dtype, k_nope=k_nope, k_pe=k_pe)
    check_same_device(k_nope.device, k_pe=k_pe, kv_buffer=kv_buffer, loc=out_cache_loc)
    launch_device(k_nope)
    _scatter(k_nope, kv_buffer, out_cache_loc, 0)
    _scatter(k_pe, kv_buffer, out_cache_loc, rank)
