"""Pure-torch twins of every Triton kernel (CPU ground truth; same arguments, same meaning).

Invariant: each twin computes exactly its kernel's contract (see the kernel module docstrings
and kernels/window.py) with plain torch ops, looping over requests, in float32 (float64 when
the inputs are float64) and returning the kernel's dtype. ``naive_dense_attention`` is the
twins' own oracle: a per-query float64 loop that shares no code with them but the window rule.
"""

from __future__ import annotations

import math

import torch

from kernels._runtime import require
from kernels.window import visible_mask, window_start


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Return the dtype twins compute in: float64 stays, everything else is float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _expand_kv(t: torch.Tensor, num_q_heads: int) -> torch.Tensor:
    """Repeat each KV head over its GQA group: ``(N, H_kv, d) -> (N, H_q, d)``."""
    require(num_q_heads % t.shape[1] == 0, f"H_q={num_q_heads} not a multiple of H_kv={t.shape[1]}")
    return t.repeat_interleave(num_q_heads // t.shape[1], dim=1)


def naive_dense_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal_offset: int,
    window: int | None,
    sm_scale: float | None = None,
) -> torch.Tensor:
    """Dense causal attention by a per-query float64 loop; returns ``(M, H_q, Dv)`` float64.

    ``q (M, H_q, D)`` holds the queries at absolute positions ``causal_offset + i``;
    ``k (N, H_kv, D)``, ``v (N, H_kv, Dv)`` the keys at positions ``0 .. N-1``. Query ``i``
    attends keys ``[window_start(p), p]`` with ``p = causal_offset + i`` (kernels/window.py).
    """
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    k64 = _expand_kv(k, q.shape[1]).double()
    v64 = _expand_kv(v, q.shape[1]).double()
    out = torch.zeros(q.shape[0], q.shape[1], v.shape[2], dtype=torch.float64, device=q.device)
    for i in range(q.shape[0]):
        pos = causal_offset + i
        require(pos < k.shape[0], f"query position {pos} has no key (only {k.shape[0]} keys)")
        lo = window_start(pos, window)
        for h in range(q.shape[1]):
            scores = (k64[lo : pos + 1, h] @ q[i, h].double()) * scale  # (n,)
            out[i, h] = torch.softmax(scores, dim=0) @ v64[lo : pos + 1, h]
    return out


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, sm_scale: float
) -> torch.Tensor:
    """Masked GQA attention: ``q (M, H_q, D)``, ``k/v (N, H_kv, *)``, ``mask (M, N)``."""
    k, v = _expand_kv(k, q.shape[1]), _expand_kv(v, q.shape[1])
    scores = torch.einsum("mhd,nhd->hmn", q, k) * sm_scale
    scores = scores.masked_fill(~mask[None], float("-inf"))
    return torch.einsum("hmn,nhd->mhd", torch.softmax(scores, dim=-1), v)


def decode_attention_ref(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Twin of ``decode_attention_fwd``: gather the windowed keys of each request, attend."""
    cd = _compute_dtype(q.dtype)
    out = torch.empty(q.shape[0], q.shape[1], v_buffer.shape[2], dtype=q.dtype, device=q.device)
    for b, (row, seq_len) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist())):
        require(seq_len >= 1, f"seq_lens[{b}]={seq_len}: decode needs the current token's KV")
        slots = req_to_token[row, window_start(seq_len - 1, sliding_window) : seq_len].long()
        k = _expand_kv(k_buffer[slots], q.shape[1]).to(cd)  # (n, H_q, D)
        v = _expand_kv(v_buffer[slots], q.shape[1]).to(cd)
        scores = torch.einsum("hd,nhd->hn", q[b].to(cd), k) * sm_scale
        out[b] = torch.einsum("hn,nhd->hd", torch.softmax(scores, dim=-1), v).to(q.dtype)
    return out


def extend_attention_ref(
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
) -> torch.Tensor:
    """Twin of ``extend_attention_fwd``: prefix keys from the pool, new keys from ``k_extend``."""
    cd = _compute_dtype(q_extend.dtype)
    out = torch.empty(*q_extend.shape[:2], v_buffer.shape[2], dtype=q_extend.dtype)
    out = out.to(q_extend.device)
    bounds = qo_indptr.tolist()
    for b, (row, prefix_len) in enumerate(zip(req_pool_indices.tolist(), prefix_lens.tolist())):
        lo, hi = bounds[b], bounds[b + 1]
        slots = req_to_token[row, :prefix_len].long()
        k = torch.cat([k_buffer[slots], k_extend[lo:hi]]).to(cd)  # (prefix + ext, H_kv, D)
        v = torch.cat([v_buffer[slots], v_extend[lo:hi]]).to(cd)
        k_pos = torch.arange(prefix_len + hi - lo, device=q_extend.device)
        mask = visible_mask(k_pos[prefix_len:], k_pos, sliding_window)  # (ext, prefix + ext)
        out[lo:hi] = _attend(q_extend[lo:hi].to(cd), k, v, mask, sm_scale).to(q_extend.dtype)
    return out


def mla_decode_ref(
    q: torch.Tensor,
    kv_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    kv_lora_rank: int,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Twin of ``mla_decode_fwd``: ``softmax(q_nope . c + q_pe . k_pe) @ c`` per request."""
    cd, rank = _compute_dtype(q.dtype), kv_lora_rank
    out = torch.empty(q.shape[0], q.shape[1], rank, dtype=q.dtype, device=q.device)
    for b, (row, seq_len) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist())):
        require(seq_len >= 1, f"seq_lens[{b}]={seq_len}: decode needs the current token's KV")
        slots = req_to_token[row, window_start(seq_len - 1, sliding_window) : seq_len].long()
        latent = kv_buffer[slots, 0].to(cd)  # (n, R + P)
        c, k_pe = latent[:, :rank], latent[:, rank:]
        q_b = q[b].to(cd)  # (H, R + P)
        scores = (q_b[:, :rank] @ c.T + q_b[:, rank:] @ k_pe.T) * sm_scale  # (H, n)
        out[b] = (torch.softmax(scores, dim=-1) @ c).to(q.dtype)
    return out


def store_kv_cache_ref(
    k: torch.Tensor,
    v: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    out_cache_loc: torch.Tensor,
) -> None:
    """Twin of ``store_kv_cache``: ``k_buffer[loc[i]] = k[i]``, ``v_buffer[loc[i]] = v[i]``."""
    loc = out_cache_loc.long()
    k_buffer[loc] = k
    v_buffer[loc] = v


def store_mla_kv_cache_ref(
    k_nope: torch.Tensor,
    k_pe: torch.Tensor,
    kv_buffer: torch.Tensor,
    out_cache_loc: torch.Tensor,
) -> None:
    """Twin of ``store_mla_kv_cache``: ``kv_buffer[loc[i], 0] = [k_nope[i] | k_pe[i]]``."""
    kv_buffer[out_cache_loc.long()] = torch.cat([k_nope, k_pe], dim=-1)
