"""The session parts of the state view: one record per streaming slot, per open session, and
the response record of a finished request (engine/view.py ``SessionSlotView``,
``SessionView``, ``ResponseView``).

Keeps: the records are plain data read from the controller, the streaming cache and the
scheduler's requests; nothing here changes them. A slot's KV check compares the fingerprints
its row names with those of the last successful turn's tokens (``kv_mismatches``) — the KV
↔ tokens law (docs/sglang.md §2.9 U5) — and runs only where the caller asks (session and idle
events) and a fingerprinting model (the sim) is there.

    positions          full pool              SWA pool
    [0, cpl)           tree nodes (locked)    not checked (the tree may have tombstoned it)
    [cpl, n)           the slot's own KV      from max(cpl, swa_evicted_seqlen); lent: none
    (n = min(committed, tokens of the last turn))
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

import numpy as np

from engine.cache.session_slot import SessionSlot
from engine.cache.streaming_session import StreamingSession
from engine.mem.req_to_token import ReqToTokenPool
from engine.model.fingerprint import KVFingerprints, KVRead, fingerprint
from engine.request import Req
from engine.sched.sessions import Session, SessionController, TurnRecord
from engine.view import ResponseView, SessionSlotView, SessionView, TreeView


def last_turn_tokens(session: Session | None) -> list[int] | None:
    """Tokens of a streaming session's last successful turn (prompt + finished output)."""
    if session is None or not session.streaming or len(session.req_nodes) != 1:
        return None
    req = next(iter(session.req_nodes.values())).req
    n = req.finished_len if req.finished_len is not None else len(req.output_ids)
    return req.origin_input_ids + req.output_ids[:n]


def kv_mismatches(
    kv: KVFingerprints,
    pool: ReqToTokenPool,
    slot: SessionSlot,
    tokens: Sequence[int],
    borrowed: bool = False,
) -> int:
    """Positions of the slot's committed KV whose fingerprint is not the token's. A lent
    slot's SWA cursor is the borrower's (it evicts as it decodes): only the full pool."""
    n = min(slot.kv_committed_len, len(tokens))
    if n <= 0 or slot.req_pool_idx is None:
        return 0
    expected = fingerprint(np.asarray(tokens[:n], dtype=np.int64), np.arange(n, dtype=np.int64))
    swa_start = n if borrowed else max(slot.cache_protected_len, slot.swa_evicted_seqlen)
    read = KVRead("slot", slot.req_pool_idx, 0, n, swa_start, expected)
    return kv.verify(pool.req_to_token, [read], limit=0)[1]


def slot_views(
    controller: SessionController,
    cache: StreamingSession,
    pool: ReqToTokenPool,
    kv: KVFingerprints | None,
) -> tuple[SessionSlotView, ...]:
    """One record per slot, in session-id order; ``kv`` given: the KV check runs."""
    views = []
    for sid, slot in sorted(cache.slots.items()):
        tokens = last_turn_tokens(controller.sessions.get(sid))
        checked = kv is not None and tokens is not None
        node, borrowed = slot.last_node, slot.row_owner() is not None
        views.append(
            SessionSlotView(
                session_id=sid,
                req_pool_idx=-1 if slot.req_pool_idx is None else slot.req_pool_idx,
                kv_committed_len=slot.kv_committed_len,
                kv_allocated_len=slot.kv_allocated_len,
                cache_protected_len=slot.cache_protected_len,
                swa_evicted_seqlen=slot.swa_evicted_seqlen,
                borrowed=borrowed,
                holds_lock=node is not None and getattr(node, "parent", None) is not None,
                last_turn_len=-1 if tokens is None else len(tokens),
                restored_prefix_len=slot.restored_prefix_len,
                kv_checked=checked,
                kv_mismatches=kv_mismatches(kv, pool, slot, tokens, borrowed) if checked else 0,  # type: ignore[arg-type]
            )
        )
    return tuple(views)


def session_views(
    controller: SessionController, unfinished: Iterable[Req], cache: StreamingSession | None
) -> tuple[SessionView, ...]:
    """One record per open session, in id order, with its live request count."""
    live: dict[str, int] = {}
    for req in unfinished:
        session = controller.session_of(req)
        if session is not None:
            live[session.session_id] = live.get(session.session_id, 0) + 1
    slots = cache.slots if cache is not None else {}
    return tuple(
        SessionView(
            session_id=sid,
            streaming=s.streaming,
            inflight=s.inflight,
            live_reqs=live.get(sid, 0),
            close_on_finish=s.close_on_finish,
            has_slot=sid in slots,
            num_req_nodes=len(s.req_nodes),
        )
        for sid, s in sorted(controller.sessions.items())
    )


def response_view(
    req: Req, record: TurnRecord | None, prompt: int, completion: int
) -> ResponseView:
    """The response record of one finished request (a plain request: no session fields)."""
    reason = req.finished_reason
    assert reason is not None
    matched = reason.matched if reason.kind == "stop" else None
    base = ResponseView(
        rid=req.rid,
        prompt_tokens=prompt,
        completion_tokens=completion,
        cached_tokens=req.cached_tokens,
        finish_type=reason.kind,
        stop_token=matched if isinstance(matched, int) else -1,
        min_new_tokens=req.sampling_params.min_new_tokens,
        status_code=reason.status_code or 0,
        output_ids=tuple(req.output_ids[:completion]),
    )
    if record is None:
        return base
    return replace(
        base,
        session_id=record.session_id,
        streaming=record.streaming,
        turn=record.turn,
        rejected=record.rejected,
        appended_tokens=record.appended,
        parent_turn=record.parent_turn,
        parent_prompt_tokens=record.parent_prompt,
        parent_completion_tokens=record.parent_completion,
        cache_flushed=record.cache_flushed,
    )


def with_session_locks(view: TreeView, cache: StreamingSession) -> TreeView:
    """The tree's view, each node carrying the locks the sessions' turn-1 locks put on it."""
    full, swa = session_lock_counts(cache)
    if not full:
        return view
    nodes = tuple(
        n._replace(session_lock_ref=full.get(n.id, 0), session_swa_lock_ref=swa.get(n.id, 0))
        if n.id in full
        else n
        for n in view.nodes
    )
    return replace(view, nodes=nodes)


def session_lock_counts(cache: StreamingSession) -> tuple[dict[int, int], dict[int, int]]:
    """Per node id, how many full and SWA locks the slots hold on it: a lock covers the path
    from ``last_node`` to the root; its SWA part stops at the node whose ``swa_uuid`` is the
    slot's (to the root when None)."""
    full: dict[int, int] = {}
    swa: dict[int, int] = {}
    swa_tree = cache.inner.supports_swa() and hasattr(cache.inner, "root_node")
    for slot in cache.slots.values():
        node, swa_on = slot.last_node, swa_tree
        while node is not None and getattr(node, "parent", None) is not None:
            full[node.id] = full.get(node.id, 0) + 1
            if swa_on:
                swa[node.id] = swa.get(node.id, 0) + 1
                swa_on = slot.swa_uuid_for_lock is None or node.swa_uuid != slot.swa_uuid_for_lock
            node = node.parent
    return full, swa
