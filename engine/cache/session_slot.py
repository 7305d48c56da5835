"""A streaming session's slot — its KV kept in a request row between turns — and the lending
of that row to the session's next turn (SGLang ``SessionSlot``, ``restore_to_req``,
``save_from_req``); the protocols through which the streaming cache sees sessions.

Keeps: the slot records whom its row is lent to (``lent_to``), and "who owns the row" has one
answer, ``row_owner``: the slot, until the borrowing turn runs on the row (its prefill has
started), then that turn, until the slot takes the row back (``take_back``: the turn
finished), the loan is undone (``forget``: the turn retired without running) or the slot is
released with the turn (abort, retract). A restore is non-destructive and idempotent: the
slot keeps its row and lengths while they are lent (SGLang #20476).

    lend       slot → req: row, lengths, SWA lock handle; lent_to = req
    run        req's prefill starts on the row (already_computed > 0): req owns the row
    take back  req → slot: row and lengths (turn 1: also the tree lock); lent_to = None
    forget     a turn that never ran: the loan undone on req, the slot unchanged
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from engine.errors import KVAccountingError

if TYPE_CHECKING:
    from engine.request import Req


class VirtualNode:
    """The ``last_node`` of a restored turn: locking or unlocking it does nothing."""

    __slots__ = ()


@dataclass(slots=True, eq=False)
class SessionSlot:
    """A streaming session's KV between turns (``req_pool_idx`` None: holds nothing)."""

    req_pool_idx: int | None = None
    kv_committed_len: int = 0
    kv_allocated_len: int = 0
    cache_protected_len: int = 0
    swa_evicted_seqlen: int = 0
    last_node: Any = None  # turn 1's tree lock, held until release_session
    swa_uuid_for_lock: int | None = None
    virtual_node: VirtualNode = field(default_factory=VirtualNode)
    restored_prefix_len: int = -1  # prefix_len of the last restore since the last save
    lent_to: Req | None = None  # the turn the row is lent to (None: not lent)

    @property
    def is_holding_kv(self) -> bool:
        return self.req_pool_idx is not None

    # ---- lending ----

    def lend(self, req: Req) -> None:
        """Lend the row to the session's next turn (a retry lends again)."""
        self.restore_to_req(req)
        self.lent_to = req

    def restore_to_req(self, req: Req) -> None:
        """Lend the row and lengths to the next turn; the slot keeps them (a retry restores
        again: SGLang #20476)."""
        req.req_pool_idx = self.req_pool_idx
        req.kv_committed_len, req.kv_allocated_len = self.kv_committed_len, self.kv_allocated_len
        req.swa_evicted_seqlen = self.swa_evicted_seqlen
        req.swa_uuid_for_lock = self.swa_uuid_for_lock

    def take_back(self, req: Req, is_first: bool) -> None:
        """The finishing turn's row and lengths become the slot's (turn 1: also its tree
        lock); the loan ends."""
        self.save_from_req(req, is_first)
        self.lent_to = None

    def save_from_req(self, req: Req, is_first: bool) -> None:
        """Take over the finishing request's row and lengths (turn 1: also its tree lock)."""
        if is_first:
            self.last_node, self.swa_uuid_for_lock = req.last_node, req.swa_uuid_for_lock
            self.cache_protected_len = req.cache_protected_len
        elif req.cache_protected_len != self.cache_protected_len:
            raise KVAccountingError(
                f"req {req.rid}: cache_protected_len {req.cache_protected_len} moved "
                f"from the session's {self.cache_protected_len}"
            )
        self.req_pool_idx = req.req_pool_idx
        self.kv_committed_len, self.kv_allocated_len = req.kv_committed_len, req.kv_allocated_len
        self.swa_evicted_seqlen = req.swa_evicted_seqlen
        self.restored_prefix_len = -1

    def forget(self, req: Req) -> None:
        """Undo the loan on a turn that never ran on the row (aborted while waiting); the
        slot keeps its row and lengths."""
        req.req_pool_idx = None
        req.kv_committed_len = req.kv_allocated_len = 0
        req.last_node = None
        req.swa_uuid_for_lock = None
        self.lent_to = None

    # ---- who owns the row ----

    def row_owner(self) -> Req | None:
        """The request that owns the slot's row now — the borrowing turn once it runs on it
        — or None: the slot does."""
        req = self.lent_to
        return req if req is not None and self._runs_on(req) else None

    def is_on_loan_to(self, req: Req) -> bool:
        """Whether ``req`` holds the slot's row only on loan (lent, not yet run on: the slot
        still owns it, SGLang counts it session-held)."""
        return self.lent_to is req and req.already_computed == 0 and self._lends_row_to(req)

    def _runs_on(self, req: Req) -> bool:
        return req.already_computed > 0 and self._lends_row_to(req)

    def _lends_row_to(self, req: Req) -> bool:
        row = self.req_pool_idx
        return row is not None and req.req_pool_idx == row and not req.kv_committed_freed


class SessionOf(Protocol):
    """The session a request belongs to, as the cache sees it (engine/sched/sessions.py)."""

    session_id: str
    streaming: bool

    def finish_req(self, req: Req) -> None: ...

    def abort_req(self, req: Req) -> None: ...


class SessionLookup(Protocol):
    """Request → session, and the pre-abort detach (SGLang ``req.session = None``)."""

    def session_of(self, req: Req) -> SessionOf | None: ...

    def slot_dropped(self, session_id: str) -> None: ...

    def detach(self, req: Req) -> None: ...


class HeldSlot(NamedTuple):
    """An idle slot's row range for the pool counters and the census (``label`` names it)."""

    label: str
    req_pool_idx: int
    kv_allocated_len: int
    cache_protected_len: int
    swa_evicted_seqlen: int
