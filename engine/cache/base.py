"""The prefix-cache protocol every cache implements, and its match result.

Keeps: a cache owns exactly the slots stored in its nodes; ``evictable_size() +
protected_size()`` equals the token count of its non-root nodes, split by lock state.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import numpy as np

if TYPE_CHECKING:
    from engine.request import Req
    from engine.view import TreeView


class MatchResult(NamedTuple):
    """What ``match_prefix`` found: the cached slots, the node to lock, and (when the cache
    knows better than ``len(prefix_indices)``) the page-aligned prefix the cache owns."""

    prefix_indices: np.ndarray
    last_node: Any
    cache_protected_len: int | None = None


class SlotOwner(NamedTuple):
    """One owner of KV slots for the census: a label and the full-pool slot ids it holds.
    ``holds_swa`` is False for a tombstoned SWA node (its SWA slots are already freed)."""

    label: str
    slots: np.ndarray
    holds_swa: bool = True


class PrefixCache(Protocol):
    """SGLang's ``BasePrefixCache`` surface, as the scheduler and the session cache use it."""

    page_size: int

    def match_prefix(self, key: Sequence[int], extra_key: str | None = None) -> MatchResult: ...

    def cache_finished_req(self, req: Req, is_insert: bool = True) -> None: ...

    def cache_unfinished_req(self, req: Req, chunked: bool = False, reads_back: int = 0) -> None:
        """``reads_back``: tokens of the request's chunk still in flight (overlap), whose
        window an SWA tree keeps locked too; a full-attention cache ignores it."""

    def evict(self, num_tokens: int, swa_num_tokens: int = 0) -> int: ...

    def supports_swa(self) -> bool: ...  # whether it holds SWA KV (a hybrid's tree)

    def inc_lock_ref(self, node: Any) -> Any: ...

    def dec_lock_ref(self, node: Any, swa_uuid_for_lock: int | None = None) -> None: ...

    def evictable_size(self) -> int: ...

    def protected_size(self) -> int: ...

    def swa_evictable_size(self) -> int: ...  # 0 for caches without SWA KV

    def swa_protected_size(self) -> int: ...

    def reset(self) -> None: ...

    def tree_view(self) -> TreeView: ...

    def slot_owners(self) -> Iterator[SlotOwner]: ...
