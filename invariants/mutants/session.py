"""Streaming-session bugs of docs/sglang.md §5 (#20070, #20476, #22862, #22790) and the
0.5.11 gaps of §2.9 (U6), each as the pre-fix body of one engine function, in kvspec's names.

Keeps: each buggy body below is the fixed function with exactly the pre-fix behaviour put
back (the comment on each says which line the fix added or changed); nothing else differs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engine.cache.base import MatchResult
from engine.cache.streaming_session import SessionSlot, StreamingSession
from engine.request import Req
from engine.sched.sessions import Session, SessionController, SessionReqNode
from invariants.mutants.base import Mutant, ids, swap

# the fixed methods, for buggy bodies that change one branch and keep the rest
REAL_CACHE_FINISHED = StreamingSession.cache_finished_req
REAL_CREATE_REQ = Session.create_req

# ---- match: #20070, #22862 ----


def match_without_protected_len(
    self: StreamingSession, req: Req, key: Sequence[int]
) -> MatchResult | None:
    """Pre-#20070: the match result carries no ``cache_protected_len``, so the request takes
    ``len(prefix_indices)`` (the slot's committed length, off a page boundary) instead of the
    slot's page-aligned turn-1 prefix."""
    slot = self.find_active_slot(req)
    if slot is None:
        return None
    slot.lend(req)
    prefix_len = min(req.kv_committed_len, len(key))
    self._free_tail(slot, req, prefix_len)
    indices = self.req_to_token_pool.read(req.req_pool_idx, 0, prefix_len)  # type: ignore[arg-type]
    return MatchResult(indices, slot.virtual_node)  # fix: + slot.cache_protected_len


def match_with_double_logit_reserve(
    self: StreamingSession, req: Req, key: Sequence[int]
) -> MatchResult | None:
    """Pre-#22862: ``prefix_len = min(committed, max(len(token_ids) - 1, 0))`` applies the
    one-token logit reserve a second time (``key`` already drops it), and nothing frees
    ``[prefix_len, allocated)`` before the extend overwrites the row there."""
    slot = self.find_active_slot(req)
    if slot is None:
        return None
    slot.lend(req)
    prefix_len = min(req.kv_committed_len, max(len(key) - 1, 0))  # fix: min(committed, len(key))
    # fix: self._free_tail(slot, req, prefix_len)
    indices = self.req_to_token_pool.read(req.req_pool_idx, 0, prefix_len)  # type: ignore[arg-type]
    return MatchResult(indices, slot.virtual_node, slot.cache_protected_len)


def free_no_tail(self: StreamingSession, slot: SessionSlot, req: Req, prefix_len: int) -> None:
    """Pre-#22862: the stale tail ``[ceil(prefix_len), allocated)`` stays allocated while
    the extend writes fresh slots over its row entries (they leak)."""


# ---- restore / stash: #20476 ----


def destructive_restore(self: SessionSlot, req: Req) -> None:
    """Pre-#20476: the restore hands the row to the request and clears the slot's, so a
    request the adder rejects falls through to the tree on its retry."""
    req.req_pool_idx = self.req_pool_idx
    req.kv_committed_len, req.kv_allocated_len = self.kv_committed_len, self.kv_allocated_len
    req.swa_evicted_seqlen = self.swa_evicted_seqlen
    req.swa_uuid_for_lock = self.swa_uuid_for_lock
    self.req_pool_idx = None  # fix: the slot keeps its row (idempotent retries)


def stash_through_inner(
    self: StreamingSession, req: Req, chunked: bool = False, reads_back: int = 0
) -> None:
    """Pre-#20476: a chunk stash is short-circuited only after the slot check, so a turn-1
    chunk goes through the inner cache's insert and lock."""
    session = self._streaming(req)
    if session is not None and session.session_id in self.slots:
        if chunked:
            req.prefix_indices = self.req_to_token_pool.read(req.req_pool_idx, 0, len(req.fill_ids))  # type: ignore[arg-type]
        return
    # fix: chunks never reach the inner cache
    self.inner.cache_unfinished_req(req, chunked=chunked, reads_back=reads_back)


# ---- release: #22790, #40252 ----


def abort_saves_slot(self: StreamingSession, req: Req, is_insert: bool = True) -> None:
    """Pre-#22790: an aborted turn is saved into the slot like a finished one (its
    ``prepare_for_extend``-inflated lengths included); the history stays at the last turn."""
    session = self._streaming(req)
    aborted = req.finished_reason is not None and req.finished_reason.kind == "abort"
    if not isinstance(session, Session) or not aborted:  # the engine's (the cache: a protocol)
        REAL_CACHE_FINISHED(self, req, is_insert)
        return
    history = session.req_nodes
    self._save(session, self.slots.get(session.session_id), req)  # fix: self._wipe(...)
    session.req_nodes = history


def retract_saves_slot(self: StreamingSession, req: Req, is_insert: bool = True) -> None:
    """SGLang 0.5.11 (fixed by #40252): a retracted turn is saved into its slot and
    ``finish_req`` runs for a request that is still alive (clears the in-flight flag)."""
    session = self._streaming(req)
    if session is not None and not req.finished():
        self._save(session, self.slots.get(session.session_id), req)  # fix: wipe, keep in flight
        return
    REAL_CACHE_FINISHED(self, req, is_insert)


def eager_history(self: Session, rid: str, *args: Any) -> Any:
    """Pre-#22790 ``create_req``: the new request replaces ``req_nodes`` at once, so an
    aborted turn becomes the history of the next one."""
    req, record = REAL_CREATE_REQ(self, rid, *args)
    if self.streaming and not record.rejected:
        self.req_nodes = {rid: SessionReqNode(req)}  # fix: only finish_req writes req_nodes
    return req, record


def eager_close(self: SessionController, session_id: str) -> bool:
    """Pre-#22790 ``_close``: looks only at ``req_nodes`` and closes at once — the slot is
    released under a turn that is still running on its row."""
    self.closed.append(session_id)  # fix: defer (close_on_finish) while a turn is in flight
    del self.sessions[session_id]
    return True


def retire_keeps_inflight(self: SessionController, req: Req) -> Any:
    """SGLang 0.5.11 (U6): a request retired without a release (aborted in the waiting
    queue) never clears its session's in-flight flag."""
    self.owner.pop(req, None)  # fix: + session.abort_req(req)
    return self.records.pop(req, None)


def pre_abort_restores(self: StreamingSession, req: Req) -> SessionSlot | None:
    """Pre-#22790 ``find_active_slot``: a pre-aborted request (too long: ``to_finish`` set)
    still continues the slot, which it then saves or releases as its own. (No trace queues
    such a turn in kvspec: the zoo plants it, invariants/mutants/planted.py.)"""
    session = self._streaming(req)
    slot = None if session is None else self.slots.get(session.session_id)
    if session is None or slot is None or not slot.is_holding_kv:
        return None
    return slot  # fix: to_finish set → session.abort_req(req); detach; match as a plain request


MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "20070-unaligned-protected",
        "sglang#20070",
        "turn >= 2 takes cache_protected_len = len(prefix_indices), off a page boundary",
        lambda: swap(StreamingSession, "match_request", match_without_protected_len),
        "20070-unaligned-protected.json",
        ids("req.cache_protected_page_aligned"),
    ),
    Mutant(
        "20476-destructive-restore",
        "sglang#20476",
        "the restore clears the slot's row; a rejected turn's retry falls through to the tree",
        lambda: swap(SessionSlot, "restore_to_req", destructive_restore),
        "20476-destructive-restore.json",
        ids("sched.busy_set_covers_live"),
    ),
    Mutant(
        "20476-chunk-stash-through-tree",
        "sglang#20476",
        "a streaming turn's chunk stash goes through the inner cache's insert and lock",
        lambda: swap(StreamingSession, "cache_unfinished_req", stash_through_inner),
        "20476-chunk-stash-through-tree.json",
        ids("probe.streaming_chunk_unpublished"),
        probe_rules="20476-chunk-stash-through-tree.rules.yaml",
    ),
    Mutant(
        "22862-stale-tail-leak",
        "sglang#22862",
        "the restore leaves [ceil(prefix_len), allocated) allocated under the extend",
        lambda: swap(StreamingSession, "_free_tail", free_no_tail),
        "22862-stale-tail-leak.json",
        ids("pool.busy_sum", "census.no_orphans"),
    ),
    Mutant(
        "22862-double-logit-reserve",
        "sglang#22862",
        "prefix_len = min(committed, len(key) - 1): the logit reserve twice, the slot leaks",
        lambda: swap(StreamingSession, "match_request", match_with_double_logit_reserve),
        "22862-double-logit-reserve.json",
        ids("pool.busy_sum", "census.no_orphans"),
    ),
    Mutant(
        "22790-aborted-turn-is-history",
        "sglang#22790",
        "create_req makes the new request the history at once; an aborted turn is inherited",
        lambda: swap(Session, "create_req", eager_history),
        "22790-aborted-turn-is-history.json",
        ids("response.history_is_last_success"),
    ),
    Mutant(
        "22790-abort-saves-slot",
        "sglang#22790",
        "a mid-decode abort saves the turn's KV into the slot instead of wiping it",
        lambda: swap(StreamingSession, "cache_finished_req", abort_saves_slot),
        "22790-abort-saves-slot.json",
        ids("session.slot_within_last_turn"),
    ),
    Mutant(
        "22790-close-under-running-turn",
        "sglang#22790",
        "close releases the slot at once, under the turn still running on its row",
        lambda: swap(SessionController, "_close", eager_close),
        "22790-close-under-running-turn.json",
        # under overlap the decode in flight reads the KV the close freed: named first
        ids("req_pool.no_row_free_and_used", "sched.inflight_reads_held"),
    ),
    Mutant(
        "u6-waiting-abort-keeps-inflight",
        "docs/sglang.md §2.9 U6",
        "an abort in the waiting queue never clears the session's in-flight flag",
        lambda: swap(SessionController, "on_retired", retire_keeps_inflight),
        "u6-waiting-abort-keeps-inflight.json",
        ids("session.single_live_request"),
    ),
    Mutant(
        "40252-retract-saves-slot",
        "sglang#40252",
        "a retracted turn is saved into its slot and ends the in-flight turn while alive",
        lambda: swap(StreamingSession, "cache_finished_req", retract_saves_slot),
        "40252-retract-saves-slot.json",
        ids("session.single_live_request"),
    ),
)
