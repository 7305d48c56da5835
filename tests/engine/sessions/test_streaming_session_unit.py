"""The streaming-session cache case by case (SGLang's unit cases, docs/sglang.md §4.3,
on the real memory stack instead of fakes): pre-abort detach, first and nth mid-abort,
overshoot trim, the page-aligned stale-tail free, idempotent restore, the chunk stash, and
``release_session``. Each test runs a real engine (strict catalog) to set the state up and
ends at idle, so the invariants check the aftermath too."""

from __future__ import annotations

import numpy as np
import pytest
from session_support import checked_engine, encode, finish, session_config, sp, turn

from engine.cache.streaming_session import SessionSlot, StreamingSession, VirtualNode
from engine.engine import Engine
from engine.request import FinishReason, Req
from engine.sched.sessions import SessionParams

PROMPT = encode("Let me tell you something about France, and about Paris.")


def _session_engine(
    page_size: int = 4, cache: str = "radix", **kw: object
) -> tuple[Engine, object, str]:
    engine, checker = checked_engine(session_config(page_size, overlap=False, cache=cache, **kw))
    sid = engine.open_session(1000, streaming=True)
    return engine, checker, sid


def _cache(engine: Engine) -> StreamingSession:
    cache = engine.mem.tree_cache
    assert isinstance(cache, StreamingSession)
    return cache


def _next_turn(engine: Engine, sid: str, text: str) -> Req:
    """Turn 2's request as create_req builds it, not yet queued (``fill_ids`` ready)."""
    req = engine.sessions.create_req(
        "turn-2",
        encode(text),
        SessionParams(id=sid),
        lambda ids: Req("turn-2", ids, sampling_params=sp(8)),
        engine.scheduler.abort,
    )
    req.fill_ids = req.origin_input_ids + req.output_ids
    return req


def _locks(engine: Engine) -> dict[int, int]:
    return {n.id: n.lock_ref for n in engine.mem.tree_cache.tree_view().nodes}


def test_preabort_detaches_session_and_preserves_slot() -> None:
    """A pre-aborted turn (``to_finish`` set before its match) is detached from its session
    (in-flight cleared) and matched as a plain request; the slot is untouched."""
    engine, checker, sid = _session_engine()
    turn(engine, sid, PROMPT, 8)
    slot = _cache(engine).slots[sid]
    before = (
        slot.req_pool_idx,
        slot.kv_committed_len,
        slot.kv_allocated_len,
        slot.cache_protected_len,
    )
    req = _next_turn(engine, sid, "more")
    assert engine.sessions.sessions[sid].inflight
    req.to_finish = FinishReason.of_abort("too long", 400)
    engine.mem.match_prefix(req)
    assert engine.sessions.session_of(req) is None and not engine.sessions.sessions[sid].inflight
    assert not isinstance(req.last_node, VirtualNode) and req.req_pool_idx is None
    assert (
        slot.req_pool_idx,
        slot.kv_committed_len,
        slot.kv_allocated_len,
        slot.cache_protected_len,
    ) == before
    finish(engine, checker)


@pytest.mark.parametrize("page_size", [1, 4])
def test_first_mid_abort_nukes_ephemeral_slot(page_size: int) -> None:
    """Turn 1 aborted mid-decode: no slot remains, its row and every page it allocated are
    free again (each once: the allocator is strict), its tree lock is dropped, and the
    request is marked released."""
    engine, checker, sid = _session_engine(page_size)
    free_before = engine.mem.allocator.available_size()
    rid = engine.submit(PROMPT, sp(1000), session_params={"id": sid})
    while len(engine.requests[rid].output_ids) < 5:
        engine.step()
    engine.abort(rid)
    engine.run_until_idle()
    req = engine.requests[rid]
    assert not _cache(engine).slots and req.req_pool_idx is None
    assert req.kv_committed_freed and req.kv_overallocated_freed
    pool = engine.mem.req_to_token_pool
    assert pool.available_size() == pool.size
    tree = engine.mem.tree_cache
    assert engine.mem.allocator.available_size() + tree.evictable_size() == free_before
    assert all(n.lock_ref == 0 for n in tree.tree_view().nodes[1:])
    assert (
        engine.sessions.sessions[sid].req_nodes == {} and not engine.sessions.sessions[sid].inflight
    )
    finish(engine, checker)


def test_nth_mid_abort_nukes_session_slot() -> None:
    """Turn 2 aborted mid-decode: the slot (widened to the request's allocation) is wiped —
    KV, row and turn 1's tree lock — while turn 1 stays the session's history."""
    engine, checker, sid = _session_engine(4)
    first = turn(engine, sid, PROMPT, 8)
    rid = engine.submit(encode("Tell me more."), sp(1000), session_params={"id": sid})
    while len(engine.requests[rid].output_ids) < 5:
        engine.step()
    assert engine.requests[rid].kv_allocated_len > first.prompt_tokens + first.completion_tokens
    engine.abort(rid)
    engine.run_until_idle()
    assert not _cache(engine).slots
    pool, tree = engine.mem.req_to_token_pool, engine.mem.tree_cache
    assert pool.available_size() == pool.size and tree.protected_size() == 0
    assert (
        engine.mem.allocator.available_size() + tree.evictable_size() == engine.mem.allocator.size
    )
    assert list(engine.sessions.sessions[sid].req_nodes) == [first.rid]
    finish(engine, checker)


@pytest.mark.parametrize(("page_size", "freed"), [(1, 6), (4, 4)])
def test_trim_overshoot_postcondition(page_size: int, freed: int) -> None:
    """origin 26, finished_len 12 → target 38; committed 40, allocated 44, swa cursor 42 and
    14 outputs are all capped to 38 / 12 outputs, and ``[ceil(38), 44)`` is freed."""
    engine, _, _ = _session_engine(page_size)
    mem = engine.mem
    req = Req("over", list(range(26)), list(range(14)))
    req.req_pool_idx = mem.req_to_token_pool.alloc()
    req.fill_ids = list(range(44))
    req.prefix_indices = np.empty(0, dtype=np.int64)
    mem.alloc_for_extend([req])
    req.kv_committed_len, req.swa_evicted_seqlen = 40, 40 if page_size == 4 else 42
    available = mem.allocator.available_size()
    _cache(engine)._trim_overshoot(req, finished_len=12)
    assert (req.kv_committed_len, req.kv_allocated_len, req.swa_evicted_seqlen) == (38, 38, 38)
    assert len(req.output_ids) == 12
    assert mem.allocator.available_size() - available == freed


def test_free_tail_is_page_aligned_and_idempotent() -> None:
    """An over-allocated slot (committed 50 < allocated 58, page 4) restored for a longer key
    frees ``[ceil(50), 58)`` = two pages — never the page holding committed KV — and caps
    slot and request at 50; a second restore (an adder retry) frees nothing and takes no lock."""
    engine, checker, sid = _session_engine(4)
    turn(engine, sid, PROMPT[:51], 1)
    cache, mem = _cache(engine), engine.mem
    slot = cache.slots[sid]
    assert (slot.kv_committed_len, slot.kv_allocated_len) == (51, 51)
    slot.kv_committed_len = 50  # plant the over-allocation of a speculative tail: [50, 58)
    extra = mem.allocator.alloc(8)
    assert extra is not None
    mem.req_to_token_pool.write(slot.req_pool_idx, 52, extra)
    slot.kv_allocated_len = 58
    req = _next_turn(engine, sid, "and then some more words")
    locks, available = _locks(engine), mem.allocator.available_size()
    engine.mem.match_prefix(req)
    assert mem.allocator.available_size() - available == 8  # pages [52, 56) and [56, 60)
    assert (slot.kv_committed_len, slot.kv_allocated_len, req.kv_allocated_len) == (50, 50, 50)
    assert len(req.prefix_indices) == 50 and isinstance(req.last_node, VirtualNode)
    engine.mem.match_prefix(req)
    assert mem.allocator.available_size() - available == 8 and _locks(engine) == locks
    assert slot.req_pool_idx == req.req_pool_idx and slot.restored_prefix_len == 50
    cache.forget(req)  # the turn never ran: it lets go of the row
    engine.sessions.on_retired(req)
    assert req.req_pool_idx is None and cache.slots[sid] is slot
    finish(engine, checker)


def test_restore_is_non_destructive() -> None:
    """``restore_to_req`` lends row and lengths and keeps them in the slot (SGLang #20476)."""
    slot = SessionSlot(
        req_pool_idx=3,
        kv_committed_len=40,
        kv_allocated_len=40,
        cache_protected_len=16,
        swa_evicted_seqlen=8,
        swa_uuid_for_lock=2,
    )
    req = Req("t2", list(range(50)))
    for _ in range(2):
        slot.restore_to_req(req)
        assert (
            req.req_pool_idx,
            req.kv_committed_len,
            req.kv_allocated_len,
            req.swa_evicted_seqlen,
        ) == (3, 40, 40, 8)
        assert slot.req_pool_idx == 3 and slot.is_holding_kv


def test_chunk_stash_skips_the_inner_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """A streaming request's chunks never touch the inner tree (no insert/lock churn): the
    stash keeps ``req_to_token[row, :len(fill_ids)]`` as the prefix. Turn 2 (long, chunked)
    still runs clean end to end."""
    engine, checker, sid = _session_engine(4, chunk=16)
    turn(engine, sid, PROMPT, 4)
    inner = _cache(engine).inner
    calls: list[bool] = []
    real = inner.cache_unfinished_req
    monkeypatch.setattr(
        inner,
        "cache_unfinished_req",
        lambda req, chunked=False: (calls.append(chunked), real(req, chunked=chunked)),
    )
    second = turn(
        engine, sid, encode("A much longer second turn that needs several chunks of prefill."), 4
    )
    assert engine.stats.chunked_prefills > 0 and calls == [] and second.cached_tokens > 0
    finish(engine, checker)


def test_release_session_frees_slot_and_drops_lock() -> None:
    """``release_session`` returns ``[cache_protected_len, allocated)``, the row and the
    turn-1 lock; an unknown id is a no-op; locks on a virtual node do nothing."""
    engine, checker, sid = _session_engine(4)
    turn(engine, sid, PROMPT, 8)
    cache, mem = _cache(engine), engine.mem
    slot = cache.slots[sid]
    assert (
        slot.cache_protected_len > 0 and mem.tree_cache.protected_size() == slot.cache_protected_len
    )
    assert cache.inc_lock_ref(slot.virtual_node) is None
    cache.dec_lock_ref(slot.virtual_node)
    cache.release_session("nope")
    assert engine.close_session(sid)
    assert not cache.slots and mem.tree_cache.protected_size() == 0
    assert mem.req_to_token_pool.available_size() == mem.req_to_token_pool.size
    finish(engine, checker)
