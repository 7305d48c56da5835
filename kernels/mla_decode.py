"""Triton MLA decode: attention over one latent KV buffer per layer (DeepSeek-style MLA).

Invariant: ``o[b, h] = softmax(q_nope . c + q_pe . k_pe) @ c`` over the same key positions as
decode attention (kernels/window.py), where ``kv_buffer[slot, 0] = [c (kv_lora_rank) | k_pe
(rope_dim)]`` and V aliases the latent part ``c`` (SGLang's ``MLATokenToKVPool``).

Layout of the last dim of ``q`` and ``kv_buffer``::

    [0, kv_lora_rank)                        nope / latent part  (K and V)
    [kv_lora_rank, kv_lora_rank + rope_dim)  rope part           (K only)

The launch reuses the split-KV decode kernel with a separate rope tile (``DPE``), as SGLang's
grouped kernel does for ``Lk = 576 = 512 + 64`` (docs/sglang.md §6.1).
"""

from __future__ import annotations

import torch

from kernels._runtime import check_float, check_same_device, check_same_dtype, check_shape, require
from kernels.decode_attention import (
    DEFAULT_NUM_KV_SPLITS,
    DecodeDims,
    DecodeOperands,
    check_decode_indices,
    launch_decode,
)


def mla_decode_fwd(
    q: torch.Tensor,
    kv_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    kv_lora_rank: int,
    sliding_window: int | None = None,
    *,
    num_kv_splits: int = DEFAULT_NUM_KV_SPLITS,
    tile_n: int | None = None,
) -> torch.Tensor:
    """Paged MLA decode; returns ``o (B, H, kv_lora_rank)`` in ``q.dtype``.

    Shapes: ``q (B, H, kv_lora_rank + rope_dim)``, ``kv_buffer (num_slots, 1, kv_lora_rank +
    rope_dim)``; the paging operands are those of ``decode_attention_fwd``.
    """
    check_float("q", q, 3)
    check_float("kv_buffer", kv_buffer, 3)
    width = q.shape[2]
    require(
        0 < kv_lora_rank <= width,
        f"kv_lora_rank={kv_lora_rank} must be in (0, {width}] (q's last dim)",
    )
    check_shape("kv_buffer", kv_buffer, (None, 1, width))
    check_same_dtype(q.dtype, kv_buffer=kv_buffer)
    check_same_device(q.device, kv_buffer=kv_buffer)
    latent = kv_buffer[..., :kv_lora_rank]  # V aliases K's latent part: same storage
    ops = DecodeOperands(q, kv_buffer, latent, req_to_token, req_pool_indices, seq_lens)
    check_decode_indices(ops)
    dims = DecodeDims(d=kv_lora_rank, dpe=width - kv_lora_rank, dv=kv_lora_rank)
    return launch_decode(ops, dims, sm_scale, sliding_window, num_kv_splits, tile_n)
