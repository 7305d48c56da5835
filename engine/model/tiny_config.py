"""TinyConfig: the shape, attention kind, numerics and backend of the tiny transformer.

Keeps: a TinyConfig that passes ``check_memory`` builds a model whose KV pools match the
memory layer's pools — sliding-window layers exist iff the memory has a window, a hybrid
(SWA) pool has at least one sliding-window layer, MLA never meets a hybrid pool, and the
Triton backend never meets float64. Imports no torch (EngineConfig imports this file).

Layer kinds come from ``attention_pattern``, tiled over ``num_layers``: ``F`` = full
attention, ``S`` = sliding window (a query at ``q`` sees keys ``[q - W, q]`` with ``W =
memory.sliding_window``, kernels/window.py). ``"FS"`` over 4 layers gives F S F S.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from engine.errors import ConfigError

if TYPE_CHECKING:
    from engine.config import MemoryConfig

AttentionKind = Literal["gqa", "mla"]
DType = Literal["float64", "float32", "float16", "bfloat16"]
Backend = Literal["torch", "triton"]


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
        for name in (
            "num_layers",
            "hidden_size",
            "intermediate_size",
            "num_heads",
            "num_kv_heads",
            "kv_lora_rank",
            "v_head_dim",
            "qk_nope_head_dim",
        ):
            _require(getattr(self, name) >= 1, name, getattr(self, name), "must be >= 1")
        for name in ("head_dim", "qk_rope_head_dim"):
            value = getattr(self, name)
            _require(value >= 2 and value % 2 == 0, name, value, "RoPE needs an even size >= 2")
        _require(
            self.num_heads % self.num_kv_heads == 0,
            "num_kv_heads",
            self.num_kv_heads,
            f"must divide num_heads ({self.num_heads})",
        )
        _require(
            self.attention in ("gqa", "mla"), "attention", self.attention, "must be 'gqa' or 'mla'"
        )
        _require(
            bool(self.attention_pattern) and set(self.attention_pattern) <= {"F", "S"},
            "attention_pattern",
            self.attention_pattern,
            "must be a non-empty string of F and S",
        )
        _require(
            self.dtype in ("float64", "float32", "float16", "bfloat16"),
            "dtype",
            self.dtype,
            "must be float64, float32, float16 or bfloat16",
        )
        _require(
            self.backend in ("torch", "triton"),
            "backend",
            self.backend,
            "must be 'torch' or 'triton'",
        )
        _require(
            self.backend == "torch" or self.dtype != "float64",
            "dtype",
            self.dtype,
            "the Triton kernels take float32/16/bf16 only (use backend='torch' for float64)",
        )
        _require(
            self.attention == "gqa" or "S" not in self.attention_pattern,
            "attention_pattern",
            self.attention_pattern,
            "sliding-window layers are GQA only (no MLA + SWA)",
        )
        _require(
            self.rope_theta > 0 and self.rms_norm_eps > 0,
            "rope_theta",
            self.rope_theta,
            "rope_theta and rms_norm_eps must be > 0",
        )

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


def _require(ok: bool, name: str, value: object, why: str) -> None:
    if not ok:
        raise ConfigError(f"tiny.{name}={value!r}: {why}")
