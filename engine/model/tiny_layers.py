"""The tiny model's weights and pointwise math: seeded init, RMSNorm, RoPE, SwiGLU; and the
forward's guards (the ForwardBatch contract, one CPU thread).

Keeps: every weight is drawn from one ``torch.Generator`` seeded by the engine seed, in a
fixed order, in float64 on the CPU and only then cast and moved, so one seed gives the same
model on every machine, dtype aside. No hub downloads, no global RNG.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from engine.config.model import TinyConfig
from engine.model.runner import ForwardBatch
from engine.model.tokenizer import VOCAB_SIZE

DTYPES = {
    "float64": torch.float64,
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}


class WeightInit:
    """Seeded draws: ``normal(shape, std)`` in float64 on CPU, cast to the model's dtype."""

    def __init__(self, seed: int, dtype: torch.dtype, device: str) -> None:
        self.gen = torch.Generator(device="cpu").manual_seed(seed)
        self.dtype, self.device = dtype, device

    def normal(self, *shape: int, std: float = 1.0) -> torch.Tensor:
        t = torch.randn(*shape, generator=self.gen, dtype=torch.float64) * std
        return t.to(dtype=self.dtype, device=self.device)

    def linear(self, fan_in: int, fan_out: int) -> torch.Tensor:
        """A ``[fan_in, fan_out]`` matrix (``y = x @ w``) keeping unit variance."""
        return self.normal(fan_in, fan_out, std=1.0 / math.sqrt(fan_in))

    def ones(self, n: int) -> torch.Tensor:
        return torch.ones(n, dtype=self.dtype, device=self.device)


@dataclass(slots=True, eq=False)
class MLP:
    """SwiGLU: ``down(silu(x @ gate) * (x @ up))``."""

    gate: torch.Tensor  # [H, I]
    up: torch.Tensor  # [H, I]
    down: torch.Tensor  # [I, H]

    @classmethod
    def init(cls, w: WeightInit, hidden: int, inter: int) -> MLP:
        return cls(w.linear(hidden, inter), w.linear(hidden, inter), w.linear(inter, hidden))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # [N, H] -> [N, H]
        return (torch.nn.functional.silu(x @ self.gate) * (x @ self.up)) @ self.down


@dataclass(slots=True, eq=False)
class GQAWeights:
    """One GQA attention block: ``[N, H] -> q [N, Hq, D], k/v [N, Hkv, D]``; ``o: [Hq*D, H]``."""

    wq: torch.Tensor  # [H, Hq*D]
    wk: torch.Tensor  # [H, Hkv*D]
    wv: torch.Tensor  # [H, Hkv*D]
    wo: torch.Tensor  # [Hq*D, H]

    @classmethod
    def init(cls, w: WeightInit, cfg: TinyConfig) -> GQAWeights:
        h, d = cfg.hidden_size, cfg.head_dim
        return cls(
            w.linear(h, cfg.num_heads * d),
            w.linear(h, cfg.num_kv_heads * d),
            w.linear(h, cfg.num_kv_heads * d),
            w.linear(cfg.num_heads * d, h),
        )


@dataclass(slots=True, eq=False)
class MLAWeights:
    """One MLA block. Latent ``[c (R) | k_pe (P)] = x @ w_dkv`` (c RMS-normed, k_pe roped);
    ``k_nope_h = w_uk[h] @ c``, ``v_h = c @ w_uv[h]`` — absorbed into q and o, never built."""

    wq: torch.Tensor  # [H, Hq*(Dn + P)]
    w_dkv: torch.Tensor  # [H, R + P]
    kv_norm: torch.Tensor  # [R]
    w_uk: torch.Tensor  # [Hq, Dn, R]
    w_uv: torch.Tensor  # [Hq, R, Dv]
    wo: torch.Tensor  # [Hq*Dv, H]

    @classmethod
    def init(cls, w: WeightInit, cfg: TinyConfig) -> MLAWeights:
        h, nh, r, p = cfg.hidden_size, cfg.num_heads, cfg.kv_lora_rank, cfg.qk_rope_head_dim
        dn, dv = cfg.qk_nope_head_dim, cfg.v_head_dim
        return cls(
            w.linear(h, nh * (dn + p)),
            w.linear(h, r + p),
            w.ones(r),
            w.normal(nh, dn, r, std=1.0 / math.sqrt(dn)),
            w.normal(nh, r, dv, std=1.0 / math.sqrt(r)),
            w.linear(nh * dv, h),
        )


@dataclass(slots=True, eq=False)
class LayerWeights:
    attn_norm: torch.Tensor  # [H]
    attn: GQAWeights | MLAWeights
    mlp_norm: torch.Tensor  # [H]
    mlp: MLP


@dataclass(slots=True, eq=False)
class TinyWeights:
    """Embedding, layers, final norm and LM head (untied), drawn in this order."""

    embed: torch.Tensor  # [V, H]
    layers: list[LayerWeights]
    final_norm: torch.Tensor  # [H]
    lm_head: torch.Tensor  # [H, V]

    @classmethod
    def init(cls, cfg: TinyConfig, w: WeightInit) -> TinyWeights:
        h = cfg.hidden_size
        embed = w.normal(VOCAB_SIZE, h)
        layers = []
        for _ in range(cfg.num_layers):
            attn = GQAWeights.init(w, cfg) if cfg.attention == "gqa" else MLAWeights.init(w, cfg)
            mlp = MLP.init(w, h, cfg.intermediate_size)
            layers.append(LayerWeights(w.ones(h), attn, w.ones(h), mlp))
        return cls(embed, layers, w.ones(h), w.linear(h, VOCAB_SIZE))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / rms(x) * weight`` over the last dim (computed in float32 at least)."""
    xf = x if x.dtype == torch.float64 else x.float()
    out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return out.to(x.dtype) * weight


def rope_tables(
    positions: torch.Tensor, dim: int, theta: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos, sin [N, dim/2]`` for absolute ``positions [N]`` (computed in float64)."""
    even = torch.arange(0, dim, 2, dtype=torch.float64, device=positions.device)
    inv_freq = theta ** (-even / dim)  # [dim/2]
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]  # [N, dim/2]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE on ``x [N, heads, dim]`` with ``cos/sin [N, dim/2]``."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


@contextmanager
def one_cpu_thread(device: str) -> Iterator[None]:
    """Run the CPU forward on one intra-op thread: at these sizes OpenMP's spin-waits cost
    100x the math (worse when cores are shared), and one thread fixes the reduction order."""
    if not device.startswith("cpu"):
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def check_batch(batch: ForwardBatch) -> None:
    """Raise on a batch that breaks the ForwardBatch contract."""
    ext, n = batch.extend_lens, len(batch.input_ids)
    sizes = {n, len(batch.positions), len(batch.out_cache_loc)}
    if sizes != {int(ext.sum())} or not np.array_equal(batch.seq_lens, batch.prefix_lens + ext):
        raise ValueError(
            f"ForwardBatch: token arrays {sorted(sizes)} long, sum(extend_lens)="
            f"{int(ext.sum())}, or seq_lens != prefix_lens + extend_lens"
        )
    if batch.batch_size == 0 or int(ext.min()) < 1:
        raise ValueError("ForwardBatch: the tiny model needs >= 1 token per request")
    if n and int(batch.seq_lens.max()) > batch.req_to_token.shape[1]:
        raise ValueError("ForwardBatch: a seq_len exceeds the req_to_token row width")
