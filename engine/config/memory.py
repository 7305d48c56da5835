"""MemoryConfig: the KV memory the engine is built with, and the validation every config of
this package shares.

Keeps: a MemoryConfig is internally consistent — pools hold at least one page, page sizes
and context positive, a hybrid (SWA) pool has a window; an invalid config never exists (the
constructor raises ``ConfigError`` naming the field, its value and the rule).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Literal

from engine.errors import ConfigError

CacheKind = Literal["radix", "chunk"]
Problem = tuple[str, str]  # (field, why), the first one found is raised


def check_fields(config: object, problems: Iterable[Problem], prefix: str = "") -> None:
    """Raise ``ConfigError`` for the first problem (``prefix + field=value: why``); the
    problems are produced lazily, so a check may rely on the ones before it."""
    for name, why in problems:
        raise ConfigError(f"{prefix}{name}={getattr(config, name)!r}: {why}")


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
    session_radix_cache: bool = False  # --enable-session-radix-cache: sessions tag the tree
    strict: bool = True

    def __post_init__(self) -> None:
        check_fields(self, self._problems())

    def _problems(self) -> Iterator[Problem]:
        if self.page_size < 1:
            yield "page_size", "must be >= 1"
        if self.max_total_tokens < self.page_size:
            yield "max_total_tokens", f"must hold at least one page ({self.page_size} tokens)"
        if self.max_num_reqs < 1:
            yield "max_num_reqs", "must be >= 1"
        if self.context_len < 2:
            yield "context_len", "must be >= 2"
        if self.cache not in ("radix", "chunk"):
            yield "cache", "must be 'radix' or 'chunk'"
        if self.swa_tokens is not None and self.swa_tokens < self.page_size:
            yield "swa_tokens", "must hold at least one page"
        if self.swa_tokens is not None and (self.sliding_window is None or self.sliding_window < 1):
            yield "sliding_window", "a hybrid SWA pool needs a window >= 1"
        if self.session_radix_cache and (self.cache != "radix" or self.swa_tokens is not None):
            yield (
                "session_radix_cache",
                "needs the full-attention radix cache (cache radix, no SWA)",
            )

    @property
    def is_hybrid(self) -> bool:
        return self.swa_tokens is not None
