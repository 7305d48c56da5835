"""Engine errors: each names the resource and the offending ids, never a bare assert."""

from __future__ import annotations


class KVAccountingError(RuntimeError):
    """A KV/row accounting rule was broken (double free, out-of-range free, double release);
    ``pages`` (of pool ``pool``) names the pages involved where the raiser knows them."""

    def __init__(self, message: str, *, pool: str = "", pages: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.pool, self.pages = pool, pages


class ConfigError(ValueError):
    """An engine configuration value is invalid; the message names the field."""


class KVOutOfMemory(KVAccountingError):
    """An allocation could not be served even after evicting the cache; the scheduler's
    admission and retract logic exist so that this never happens."""
