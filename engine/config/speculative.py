"""SpecConfig: EAGLE speculative decoding with a top-1 chain draft (SGLang's
``--speculative-algorithm EAGLE --speculative-eagle-topk 1``).

Keeps: a SpecConfig is internally consistent — a top-1 chain of ``num_steps`` draft tokens
verifies ``num_draft_tokens = num_steps + 1`` tokens (the root, i.e. the last sampled token,
plus the drafts; SGLang adjusts the flag to that value for topk 1, here a mismatch is an
error), the version is 1 or 2, the sim draft's acceptance probability lies in (0, 1].
Whether the version fits the scheduler (v2 needs overlap, v1 needs it off) is checked by
``EngineConfig``.

Over-allocation per decode step (SGLang ``get_alloc_len_per_decode`` for topk 1):
``alloc_len = max(num_steps * topk, num_draft_tokens) = num_draft_tokens``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from engine.errors import ConfigError

TOPK = 1  # a chain: one draft token per step (SGLang speculative_eagle_topk)


@dataclass(frozen=True, slots=True)
class SpecConfig:
    """EAGLE, top-1 chain. ``accept_prob`` drives the sim model's seeded draft: each draft
    position proposes the target's own next token with this probability (the tiny model
    ignores it: its draft network decides)."""

    algorithm: Literal["eagle"] = "eagle"
    num_steps: int = 3
    num_draft_tokens: int = 4
    version: Literal[1, 2] = 2
    accept_prob: float = 0.7

    def __post_init__(self) -> None:
        if self.algorithm != "eagle":
            raise ConfigError(
                f"speculative.algorithm={self.algorithm!r}: only 'eagle' is implemented"
            )
        if self.num_steps < 1:
            raise ConfigError(f"speculative.num_steps={self.num_steps}: must be >= 1")
        if self.num_draft_tokens != self.num_steps * TOPK + 1:
            raise ConfigError(
                f"speculative.num_draft_tokens={self.num_draft_tokens}: a top-1 chain of "
                f"{self.num_steps} steps verifies num_steps + 1 = {self.num_steps + 1} tokens"
            )
        if self.version not in (1, 2):
            raise ConfigError(f"speculative.version={self.version!r}: must be 1 or 2")
        if not 0.0 < self.accept_prob <= 1.0:
            raise ConfigError(f"speculative.accept_prob={self.accept_prob}: must be in (0, 1]")

    @property
    def alloc_len(self) -> int:
        """KV one request may allocate in one decode step (``get_alloc_len_per_decode``)."""
        return max(self.num_steps * TOPK, self.num_draft_tokens)

    @property
    def row_reserve(self) -> int:
        """Positions a request row holds past the context: the largest reservation (v2's
        ``committed + 2 * alloc_len``; v1's window is shorter)."""
        return 2 * self.alloc_len

    @property
    def max_overalloc(self) -> int:
        """The largest ``allocated - committed`` a running request may hold: v1 the verify
        window (between prepare and the verify's trim); v2 ``2 * alloc_len - 1`` (prepare
        reserves ``committed + 2 * alloc_len`` and pre-claims one slot as committed)."""
        return self.num_draft_tokens if self.version == 1 else 2 * self.alloc_len - 1
