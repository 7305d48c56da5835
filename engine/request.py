"""Req: one generation request and the KV fields SGLang's accounting is written in.

Keeps: ``kv_committed_len <= kv_allocated_len``; each of the two KV ranges is released at
most once (``pop_*`` flags). Field names are SGLang's so invariants and bug reports transfer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.errors import KVAccountingError

EMPTY_INDICES = np.empty(0, dtype=np.int64)


@dataclass(slots=True, eq=False)
class Req:
    """A request: its tokens, its request row and the lengths of its KV ranges."""

    rid: str
    origin_input_ids: list[int]
    output_ids: list[int] = field(default_factory=list)
    fill_ids: list[int] = field(default_factory=list)
    extra_key: str | None = None
    # KV ownership
    prefix_indices: np.ndarray = field(default_factory=lambda: EMPTY_INDICES)
    req_pool_idx: int | None = None
    kv_committed_len: int = 0
    kv_allocated_len: int = 0
    kv_committed_freed: bool = False
    kv_overallocated_freed: bool = False
    cache_protected_len: int = 0
    last_node: Any = None
    swa_uuid_for_lock: int | None = None
    swa_evicted_seqlen: int = 0
    is_chunked: int = 0

    @property
    def seqlen(self) -> int:
        return len(self.origin_input_ids) + len(self.output_ids)

    def all_ids(self) -> list[int]:
        return self.origin_input_ids + self.output_ids

    def pop_committed_kv_cache(self) -> int:
        """The committed length, marking the committed range released (once)."""
        if self.kv_committed_freed:
            raise KVAccountingError(f"req {self.rid}: committed KV released twice ({self.kv_committed_len=})")
        self.kv_committed_freed = True
        return self.kv_committed_len

    def pop_overallocated_kv_cache(self) -> tuple[int, int]:
        """(committed, allocated), marking the over-allocated tail released (once)."""
        if self.kv_overallocated_freed:
            raise KVAccountingError(f"req {self.rid}: over-allocated KV released twice")
        self.kv_overallocated_freed = True
        return self.kv_committed_len, self.kv_allocated_len
