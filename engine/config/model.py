"""TinyConfig: the shape, attention kind, numerics and backend of the tiny transformer.

Keeps: a TinyConfig that passes ``check_memory`` builds a model whose KV pools match the
memory layer's pools — sliding-window layers exist iff the memory has a window, a hybrid
(SWA) pool has at least one sliding-window layer, MLA never meets a hybrid pool, and the
Triton backend never meets float64. Imports no torch (EngineConfig holds one).

Layer kinds come from ``attention_pattern``, tiled over ``num_layers``: ``F`` = full
attention, ``S`` = sliding window (a query at ``q`` sees keys ``[q - W, q]`` with ``W =
memory.sliding_window``, kernels/window.py). ``"FS"`` over 4 layers gives F S F S.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from engine.config.memory import MemoryConfig, Problem, check_fields
from engine.errors import ConfigError

AttentionKind = Literal["gqa", "mla"]
DType = Literal["float64", "float32", "float16", "bfloat16"]
Backend = Literal["torch", "triton"]
POSITIVE_FIELDS = (
    "num_layers",
    "hidden_size",
    "intermediate_size",
    "num_heads",
    "num_kv_heads",
    "kv_lora_rank",
    "v_head_dim",
    "qk_nope_head_dim",
)


@dataclass(frozen=True, slots=True)
class TinyConfig:
    """A small Llama-style model (RMSNorm, RoPE, GQA or MLA, SwiGLU) with seeded weights.

    GQA: ``num_heads`` query heads of ``head_dim`` over ``num_kv_heads`` KV heads (MHA when
    equal). MLA (DeepSeek-style): one latent of ``kv_lora_rank + qk_rope_head_dim`` per token
    and layer; queries of ``qk_nope_head_dim + qk_rope_head_dim`` per head; values of
    ``v_head_dim`` per head decompressed from the latent.
    """

    num_layers: int = 2
    hidden_size: int = 32
    intermediate_size: int = 64
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 8
    attention: AttentionKind = "gqa"
    attention_pattern: str = "F"
    kv_lora_rank: int = 16  # MLA only
    qk_rope_head_dim: int = 8  # MLA only
    qk_nope_head_dim: int = 8  # MLA only
    v_head_dim: int = 8  # MLA only
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    dtype: DType = "float64"
    backend: Backend = "torch"
    device: str = "cpu"

    def __post_init__(self) -> None:
        check_fields(self, self._problems(), prefix="tiny.")

    def _problems(self) -> Iterator[Problem]:
        for name in POSITIVE_FIELDS:
            if getattr(self, name) < 1:
                yield name, "must be >= 1"
        for name in ("head_dim", "qk_rope_head_dim"):
            if getattr(self, name) < 2 or getattr(self, name) % 2:
                yield name, "RoPE needs an even size >= 2"
        if self.num_heads % self.num_kv_heads:
            yield "num_kv_heads", f"must divide num_heads ({self.num_heads})"
        if self.attention not in ("gqa", "mla"):
            yield "attention", "must be 'gqa' or 'mla'"
        if not self.attention_pattern or not set(self.attention_pattern) <= {"F", "S"}:
            yield "attention_pattern", "must be a non-empty string of F and S"
        if self.dtype not in ("float64", "float32", "float16", "bfloat16"):
            yield "dtype", "must be float64, float32, float16 or bfloat16"
        if self.backend not in ("torch", "triton"):
            yield "backend", "must be 'torch' or 'triton'"
        if self.backend == "triton" and self.dtype == "float64":
            why = "the Triton kernels take float32/16/bf16 only (use backend='torch' for float64)"
            yield "dtype", why
        if self.attention == "mla" and "S" in self.attention_pattern:
            yield "attention_pattern", "sliding-window layers are GQA only (no MLA + SWA)"
        if self.rope_theta <= 0 or self.rms_norm_eps <= 0:
            yield "rope_theta", "rope_theta and rms_norm_eps must be > 0"

    @property
    def window_layers(self) -> frozenset[int]:
        """The layers that attend through the sliding window."""
        pattern = self.attention_pattern
        return frozenset(i for i in range(self.num_layers) if pattern[i % len(pattern)] == "S")

    def check_memory(self, memory: MemoryConfig) -> None:
        """Raise ``ConfigError`` unless this model's layers fit ``memory``'s pools."""
        windows = self.window_layers
        if memory.is_hybrid and self.attention == "mla":
            raise ConfigError(
                "tiny.attention='mla': MLA has no hybrid SWA pool (unset memory.swa_tokens)"
            )
        if windows and memory.sliding_window is None:
            raise ConfigError(
                f"tiny.attention_pattern={self.attention_pattern!r}: sliding-window "
                "layers need memory.sliding_window"
            )
        if memory.is_hybrid and not windows:
            raise ConfigError(
                f"tiny.attention_pattern={self.attention_pattern!r}: a hybrid SWA "
                "pool (memory.swa_tokens) needs at least one sliding-window "
                "layer ('S')"
            )
