"""Engine configuration: frozen, validated at construction, errors name the field.

Keeps: every config the engine runs with is internally consistent (pools hold at least one
page, windows and page sizes positive, a hybrid pool has a window).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from engine.errors import ConfigError

CacheKind = Literal["radix", "chunk"]


@dataclass(frozen=True, slots=True)
class MemoryConfig:
    """KV memory: pool sizes in tokens, page size, prefix cache, SWA hybrid pools."""

    page_size: int = 1
    max_total_tokens: int = 4096
    max_num_reqs: int = 64
    context_len: int = 2048
    cache: CacheKind = "radix"
    swa_tokens: int | None = None  # a SWA pool of this many tokens makes the pools hybrid
    sliding_window: int | None = None
    strict: bool = True

    def __post_init__(self) -> None:
        _require(self.page_size >= 1, "page_size", self.page_size, "must be >= 1")
        _require(self.max_total_tokens >= self.page_size, "max_total_tokens", self.max_total_tokens,
                 f"must hold at least one page ({self.page_size} tokens)")
        _require(self.max_num_reqs >= 1, "max_num_reqs", self.max_num_reqs, "must be >= 1")
        _require(self.context_len >= 2, "context_len", self.context_len, "must be >= 2")
        _require(self.cache in ("radix", "chunk"), "cache", self.cache, "must be 'radix' or 'chunk'")
        if self.swa_tokens is not None:
            _require(self.swa_tokens >= self.page_size, "swa_tokens", self.swa_tokens,
                     "must hold at least one page")
            _require(self.sliding_window is not None and self.sliding_window >= 1,
                     "sliding_window", self.sliding_window, "a hybrid SWA pool needs a window >= 1")

    @property
    def is_hybrid(self) -> bool:
        return self.swa_tokens is not None


def _require(ok: bool, name: str, value: object, why: str) -> None:
    if not ok:
        raise ConfigError(f"{name}={value!r}: {why}")
