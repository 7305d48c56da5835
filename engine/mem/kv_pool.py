"""KV buffers: the only tensor-owning file of engine/mem.

Keeps: buffer row ``s`` holds the KV of slot ``s`` for every layer; rows ``[0, page_size)``
(page 0) are the padding write target. MHA/GQA keep k and v per layer; MLA keeps one latent
buffer of ``kv_lora_rank + rope_dim`` per layer whose first ``kv_lora_rank`` columns are the
value; the SWA pool keeps separate, smaller buffers for the sliding-window layers, indexed
by SWA slot ids (translate full → SWA ids with the allocator's mapping first).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class KVShape:
    """Per-layer KV geometry shared by the pools."""

    num_layers: int
    num_kv_heads: int = 1
    head_dim: int = 16
    v_head_dim: int | None = None  # defaults to head_dim
    dtype: torch.dtype = torch.float32
    device: str = "cpu"


class MHAKVPool:
    """k and v buffers per layer: ``[num_slots, num_kv_heads, head_dim]``."""

    def __init__(self, num_tokens: int, page_size: int, shape: KVShape) -> None:
        rows = num_tokens + page_size
        v_dim = shape.v_head_dim or shape.head_dim

        def make(dim: int) -> torch.Tensor:
            return torch.zeros(
                rows, shape.num_kv_heads, dim, dtype=shape.dtype, device=shape.device
            )

        self.k_buffer = [make(shape.head_dim) for _ in range(shape.num_layers)]
        self.v_buffer = [make(v_dim) for _ in range(shape.num_layers)]

    def get_kv_buffer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k_buffer[layer], self.v_buffer[layer]

    def set_kv_buffer(
        self, layer: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> None:
        """Store ``k``/``v`` of shape ``[len(loc), heads, dim]`` at slots ``loc``."""
        self.k_buffer[layer][loc] = k.to(self.k_buffer[layer].dtype)
        self.v_buffer[layer][loc] = v.to(self.v_buffer[layer].dtype)


class MLAKVPool:
    """One latent buffer per layer: ``[num_slots, 1, kv_lora_rank + rope_dim]``."""

    def __init__(
        self,
        num_tokens: int,
        page_size: int,
        num_layers: int,
        kv_lora_rank: int,
        rope_dim: int,
        dtype: torch.dtype = torch.float32,
        device: str = "cpu",
    ) -> None:
        self.kv_lora_rank = kv_lora_rank
        width = kv_lora_rank + rope_dim
        self.kv_buffer = [
            torch.zeros(num_tokens + page_size, 1, width, dtype=dtype, device=device)
            for _ in range(num_layers)
        ]

    def get_key_buffer(self, layer: int) -> torch.Tensor:
        return self.kv_buffer[layer]

    def get_value_buffer(self, layer: int) -> torch.Tensor:
        """The value aliases the latent part of the key (no copy)."""
        return self.kv_buffer[layer][..., : self.kv_lora_rank]

    def set_kv_buffer(self, layer: int, loc: torch.Tensor, latent: torch.Tensor) -> None:
        """Store ``latent`` of shape ``[len(loc), 1, kv_lora_rank + rope_dim]`` at ``loc``."""
        self.kv_buffer[layer][loc] = latent.to(self.kv_buffer[layer].dtype)


class SWAKVPool:
    """Hybrid pool: full-attention layers index by full slot, sliding-window layers by SWA
    slot. ``swa_layers`` lists which model layers use the window."""

    def __init__(
        self,
        num_tokens: int,
        swa_num_tokens: int,
        page_size: int,
        shape: KVShape,
        swa_layers: frozenset[int],
    ) -> None:
        self.swa_layers = swa_layers
        full_ids = [i for i in range(shape.num_layers) if i not in swa_layers]
        swa_ids = [i for i in range(shape.num_layers) if i in swa_layers]
        self._slot = {layer: n for n, layer in enumerate(full_ids)} | {
            layer: n for n, layer in enumerate(swa_ids)
        }

        def sub(num_layers: int) -> KVShape:
            return KVShape(
                num_layers,
                shape.num_kv_heads,
                shape.head_dim,
                shape.v_head_dim,
                shape.dtype,
                shape.device,
            )

        self.full = MHAKVPool(num_tokens, page_size, sub(len(full_ids)))
        self.swa = MHAKVPool(swa_num_tokens, page_size, sub(len(swa_ids)))

    def is_swa_layer(self, layer: int) -> bool:
        return layer in self.swa_layers

    def get_kv_buffer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        pool = self.swa if layer in self.swa_layers else self.full
        return pool.get_kv_buffer(self._slot[layer])

    def set_kv_buffer(
        self, layer: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> None:
        """``loc`` must already be SWA slot ids for a sliding-window layer."""
        pool = self.swa if layer in self.swa_layers else self.full
        pool.set_kv_buffer(self._slot[layer], loc, k, v)


KVPool = MHAKVPool | SWAKVPool | MLAKVPool  # what a model reads and writes
