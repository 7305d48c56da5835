"""Streaming-session cache: a decorator around any prefix cache that keeps each streaming
session's KV in a request row between turns (SGLang ``session/streaming_session.py``).

Keeps: a slot owns ``[cache_protected_len, ceil(kv_allocated_len))`` of its row and, from
turn 1 until ``release_session``, one tree lock on ``last_node`` (the turn-1 prompt the tree
holds, ``[0, cache_protected_len)``); the slot's KV is the KV of the session's last
successful turn (``req_nodes``) — an aborted or retracted turn wipes it (``release_session``)
and never saves into it; a turn borrows the slot's row by an explicit loan (session_slot.py:
a restored request that the adder rejects and retries takes no tree lock, the slot keeps its
row); every free here starts page-aligned (``ceil``), never inside a page that holds
committed KV.

Turn lifecycle (``sid`` = session id, ``P`` = prefix_len = min(committed, len(key))):
    match     lend slot → req (row, lengths); free the stale tail [ceil(P), allocated)
    chunks    prefix_indices = row[:len(fill_ids)], the inner cache is skipped
    finish    trim [ceil(O+F), allocated) (overshoot), take back row + lengths, history advances
    abort     slot (ephemeral on turn 1) widened to the request, release_session; tokens kept
    retract   a borrowed slot is wiped like an abort, the request lives on, checkpoint kept
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from engine.cache.base import MatchResult, PrefixCache, SlotOwner
from engine.cache.session_slot import HeldSlot, SessionLookup, SessionOf, SessionSlot, VirtualNode
from engine.errors import KVAccountingError
from engine.mem import paging
from engine.mem.allocator import PagedAllocator, SWAAllocator
from engine.mem.req_to_token import ReqToTokenPool

if TYPE_CHECKING:
    from engine.request import Req


class StreamingSession:
    """SGLang's ``StreamingSession`` over ``inner``; attributes it lacks come from ``inner``."""

    def __init__(
        self,
        inner: PrefixCache,
        req_to_token_pool: ReqToTokenPool,
        allocator: PagedAllocator | SWAAllocator,
        lookup: SessionLookup,
    ) -> None:
        self.inner = inner
        self.req_to_token_pool = req_to_token_pool
        self.allocator = allocator
        self.page_size = inner.page_size
        self.lookup = lookup
        self.slots: dict[str, SessionSlot] = {}

    def __getattr__(self, name: str) -> Any:  # counters, supports_swa, sliding_window_size …
        if name == "inner":  # not set yet (copy, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    def _streaming(self, req: Req) -> SessionOf | None:
        session = self.lookup.session_of(req)
        return session if session is not None and session.streaming else None

    # ---- match ----

    def find_active_slot(self, req: Req) -> SessionSlot | None:
        """The slot this request continues, or None. A pre-aborted request (``to_finish``
        set) is detached from its session and matched as a plain request; the slot stays."""
        session = self._streaming(req)
        slot = None if session is None else self.slots.get(session.session_id)
        if session is None or slot is None or not slot.is_holding_kv:
            return None
        if req.to_finish is not None:
            session.abort_req(req)
            self.lookup.detach(req)
            return None
        return slot

    def match_request(self, req: Req, key: Sequence[int]) -> MatchResult | None:
        """The slot's prefix for ``key`` (``fill_ids`` minus the logit reserve), or None
        when the request has no active slot (the caller then matches the inner cache).

            [0, cpl)            tree-owned, locked by turn 1
            [cpl, P)            slot KV, lent to this turn (P = min(committed, len(key)))
            [ceil(P), alloc)    stale tail (over-allocation): freed now, page-aligned
        """
        slot = self.find_active_slot(req)
        if slot is None:
            return None
        slot.lend(req)
        prefix_len = min(req.kv_committed_len, len(key))
        if prefix_len < slot.cache_protected_len:  # INV-APPEND-ONLY
            raise KVAccountingError(
                f"req {req.rid}: streaming session prefix shrank: {prefix_len=} < "
                f"cache_protected_len={slot.cache_protected_len}"
            )
        self._free_tail(slot, req, prefix_len)
        slot.restored_prefix_len = prefix_len
        indices = self.req_to_token_pool.read(_row(req), 0, prefix_len)
        return MatchResult(indices, slot.virtual_node, slot.cache_protected_len)

    def match_prefix(self, key: Sequence[int], extra_key: str | None = None) -> MatchResult:
        return self.inner.match_prefix(key, extra_key)

    # ---- finish / checkpoint ----

    def cache_finished_req(self, req: Req, is_insert: bool = True) -> None:
        """A streaming request's release: abort wipes, retract of a borrowed slot wipes,
        a finish saves; anything else goes to the inner cache."""
        session = self._streaming(req)
        if session is None:
            self.inner.cache_finished_req(req, is_insert=is_insert)
            return
        slot = self.slots.get(session.session_id)
        aborted = req.finished_reason is not None and req.finished_reason.kind == "abort"
        if aborted:
            self._wipe(session.session_id, slot, req)
            session.abort_req(req)
        elif not req.finished():  # retracted: the turn lives on, the checkpoint stays
            if slot is not None and slot.is_holding_kv and slot.req_pool_idx == req.req_pool_idx:
                self._wipe(session.session_id, slot, req)
            else:
                self.inner.cache_finished_req(req, is_insert=is_insert)
        else:
            self._save(session, slot, req)

    def _save(self, session: SessionOf, slot: SessionSlot | None, req: Req) -> None:
        finished_len = req.finished_len if req.finished_len is not None else len(req.output_ids)
        target = len(req.origin_input_ids) + finished_len
        self._trim_overshoot(req, finished_len)
        is_first = slot is None or not slot.is_holding_kv
        if slot is None or is_first:
            slot = self.slots[session.session_id] = SessionSlot()
        elif slot.req_pool_idx != req.req_pool_idx:
            raise KVAccountingError(
                f"req {req.rid}: finishes on row {req.req_pool_idx}, "
                f"session {session.session_id} holds row {slot.req_pool_idx}"
            )
        slot.take_back(req, is_first)
        slot.kv_committed_len = min(target, slot.kv_committed_len)  # never claim unwritten KV
        _hand_over(req)
        session.finish_req(req)

    def _wipe(self, session_id: str, slot: SessionSlot | None, req: Req) -> None:
        """Free every KV of the turn and of the session (abort = wipe KV, keep tokens).
        Turn 1 has no slot yet: an ephemeral one from the request drops its tree lock."""
        if slot is None or not slot.is_holding_kv:
            slot = self.slots[session_id] = SessionSlot(
                req.req_pool_idx,
                req.kv_committed_len,
                req.kv_allocated_len,
                req.cache_protected_len,
                req.swa_evicted_seqlen,
                req.last_node,
                req.swa_uuid_for_lock,
            )
        elif slot.req_pool_idx != req.req_pool_idx:
            raise KVAccountingError(
                f"req {req.rid}: wipes row {req.req_pool_idx}, "
                f"session {session_id} holds row {slot.req_pool_idx}"
            )
        slot.kv_allocated_len = max(slot.kv_allocated_len, req.kv_allocated_len)
        self.release_session(session_id)
        _hand_over(req)

    def cache_unfinished_req(self, req: Req, chunked: bool = False, reads_back: int = 0) -> None:
        """A chunk stash keeps the row as the prefix and skips the inner cache (SGLang
        #20476); a later turn skips it too (the slot holds its KV); turn 1's checkpoint
        inserts its prompt into the tree (the lock the slot will hold)."""
        session = self._streaming(req)
        if session is not None and chunked:
            req.prefix_indices = self.req_to_token_pool.read(_row(req), 0, len(req.fill_ids))
            return
        if session is not None and session.session_id in self.slots:
            return
        self.inner.cache_unfinished_req(req, chunked=chunked, reads_back=reads_back)

    # ---- locks, eviction, reset ----

    def inc_lock_ref(self, node: Any) -> Any:
        return None if isinstance(node, VirtualNode) else self.inner.inc_lock_ref(node)

    def dec_lock_ref(self, node: Any, swa_uuid_for_lock: int | None = None) -> None:
        if not isinstance(node, VirtualNode):
            self.inner.dec_lock_ref(node, swa_uuid_for_lock)

    def evict(self, *num_tokens: int) -> int:
        return self.inner.evict(*num_tokens)

    def evictable_size(self) -> int:
        return self.inner.evictable_size()

    def protected_size(self) -> int:
        return self.inner.protected_size()

    def reset(self) -> None:
        """Drop every slot and the inner cache (``flush_cache``: the pools are cleared too)."""
        self.slots.clear()
        self.inner.reset()

    def release_session(self, session_id: str) -> None:
        """Drop the turn-1 lock, free ``[cache_protected_len, kv_allocated_len)`` (a paged
        free takes the partial last page whole) and return the row."""
        slot = self.slots.pop(session_id, None)
        if slot is None:
            return
        if slot.last_node is not None:
            self.inner.dec_lock_ref(slot.last_node, slot.swa_uuid_for_lock)
        if slot.req_pool_idx is not None:
            start, end = slot.cache_protected_len, slot.kv_allocated_len
            if start < end:
                self.allocator.free(self.req_to_token_pool.read(slot.req_pool_idx, start, end))
            self.req_to_token_pool.free(slot.req_pool_idx)

    # ---- the wedge breaker (engine/sched/wedge.py) ----

    def reclaim(self, req: Req) -> bool:
        """Wipe the slot of ``req``'s session if no turn runs on it (``req`` waits: a loan
        it holds is undone first), as an abort's wipe does: its KV and row return to the
        pool, the session's history stays, and the turn re-prefills it. False: nothing to
        reclaim."""
        session = self.lookup.session_of(req)
        slot = None if session is None else self.slots.get(session.session_id)
        if session is None or slot is None or not slot.is_holding_kv:
            return False
        if slot.lent_to is not None and slot.is_on_loan_to(slot.lent_to):
            slot.forget(slot.lent_to)  # ``req``'s loan, or one of a turn that no longer waits
        if slot.row_owner() is not None:
            return False  # a turn runs on the row
        self._drop(session.session_id)
        return True

    def reclaim_idle(self) -> bool:
        """Wipe the oldest slot no request holds (a session with no turn waiting)."""
        for session_id, slot in self.slots.items():
            if slot.is_holding_kv and slot.lent_to is None and slot.row_owner() is None:
                self._drop(session_id)
                return True
        return False

    def _drop(self, session_id: str) -> None:
        self.release_session(session_id)
        self.lookup.slot_dropped(session_id)

    # ---- stale KV ----

    def _free_tail(self, slot: SessionSlot, req: Req, prefix_len: int) -> None:
        """Free ``[ceil(prefix_len), allocated)`` before the extend overwrites the row from
        ``prefix_len`` (over-allocation, a shorter key: SGLang #22862); cap slot and request."""
        self._free_kv_aligned(_row(req), prefix_len, slot.kv_allocated_len)
        for holder in (slot, req):
            holder.kv_allocated_len = prefix_len
            holder.kv_committed_len = min(holder.kv_committed_len, prefix_len)
            holder.swa_evicted_seqlen = min(holder.swa_evicted_seqlen, prefix_len)

    def _trim_overshoot(self, req: Req, finished_len: int) -> None:
        """Cap the finishing request at ``target = origin + finished_len`` (the next turn's
        history): free ``[ceil(target), allocated)``, cap the three lengths, cut the output
        (SGLang #22897, #22900)."""
        target = len(req.origin_input_ids) + finished_len
        self._free_kv_aligned(_row(req), target, req.kv_allocated_len)
        req.kv_allocated_len = min(req.kv_allocated_len, target)
        req.kv_committed_len = min(req.kv_committed_len, target)
        req.swa_evicted_seqlen = min(req.swa_evicted_seqlen, target)
        del req.output_ids[finished_len:]

    def _free_kv_aligned(self, row: int, target: int, end: int) -> None:
        """Free ``row[ceil(target):end)``; ``[target, ceil(target))`` stays attached to the
        row until ``release_session`` (a paged free would take the whole page)."""
        start = paging.ceil_align(target, self.page_size)
        if start < end:
            self.allocator.free(self.req_to_token_pool.read(row, start, end))

    # ---- lending: who owns a slot's row ----

    def is_on_loan(self, req: Req) -> bool:
        """Whether ``req`` holds its session slot's row only on loan (restored by a match,
        not yet run on: the slot still owns the row, SGLang counts it session-held)."""
        slot = self._slot_of(req)
        return slot is not None and slot.is_on_loan_to(req)

    def forget(self, req: Req) -> None:
        """A turn retired without running (aborted while waiting): a loan it holds is undone,
        the slot keeps its row untouched."""
        slot = self._slot_of(req)
        if slot is not None and slot.is_on_loan_to(req):
            slot.forget(req)

    def _slot_of(self, req: Req) -> SessionSlot | None:
        session = self.lookup.session_of(req)
        return None if session is None else self.slots.get(session.session_id)

    def held_slots(self) -> list[HeldSlot]:
        """The slots holding KV whose row no running turn owns (SGLang's ``session_held_*``
        with ``_active_pool_idxs``), in session-id order."""
        return [
            HeldSlot(
                f"slot:{sid}@row{s.req_pool_idx}",
                s.req_pool_idx,
                s.kv_allocated_len,
                s.cache_protected_len,
                s.swa_evicted_seqlen,
            )
            for sid, s in sorted(self.slots.items())
            if s.req_pool_idx is not None and s.row_owner() is None
        ]

    def slot_owners(self) -> Iterator[SlotOwner]:
        """The inner cache's owners (slots join the census through ``held_slots``)."""
        return self.inner.slot_owners()


def _row(req: Req) -> int:
    if req.req_pool_idx is None:
        raise KVAccountingError(f"req {req.rid}: streaming-session operation without a request row")
    return req.req_pool_idx


def _hand_over(req: Req) -> None:
    """The request's row and KV now belong to the slot (or were freed): mark both ranges
    released once and drop the row, so ``release_kv_cache`` stops here."""
    req.pop_committed_kv_cache()
    req.pop_overallocated_kv_cache()
    req.req_pool_idx = None


__all__ = ["HeldSlot", "SessionLookup", "SessionSlot", "StreamingSession", "VirtualNode"]
