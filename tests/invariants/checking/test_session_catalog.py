"""The session catalog (invariants/checking/catalog/session.yaml) and the view fields it reads:
every rule holds on views without session fields, the engine fills slots, sessions and responses
from real runs, the pools' session-held counters and the census see idle slots (owner
``slot:<sid>@row<r>``), and the KV check (U5) catches a slot whose row no longer names its turn's KV
although every sum and the census still balance. (Every rule's pass/fail fixtures run in
test_memory_catalog.py, parametrized over the whole shipped catalog.)"""

from __future__ import annotations

from typing import Any

import pytest

from engine.config import EngineConfig, MemoryConfig
from engine.engine import Engine
from engine.request import SamplingParams
from engine.view import SessionView, StateView
from invariants.checking.checker import Checker, CheckerHook, InvariantViolation, Level
from invariants.checking.loader import CATALOG_DIR, load_catalog

CATALOG = load_catalog()
SESSION = load_catalog([CATALOG_DIR / "session.yaml"])
REQUIRED = {
    "session.held_nonneg",
    "session.slot_committed_le_allocated",
    "session.slot_protected_page_aligned",
    "session.slot_swa_cursor",
    "session.append_only",
    "session.protected_prefix_locked",
    "session.slot_rows_exclusive",
    "session.slot_has_open_session",
    "session.idle_req_pool",
    "session.slot_within_last_turn",
    "session.slot_kv_is_last_turn",
    "session.single_live_request",
    "response.inherits_last_turn_kv",
    "response.history_is_last_success",
    "response.cached_within_prompt",
    "response.rejection_is_400",
}
PROMPT = [256] + list(b"Let me tell you something about France.")


def _engine(
    page_size: int = 4, swa: bool = False, overlap: bool = False, *observers: Any
) -> Engine:
    mem = MemoryConfig(
        page_size=page_size,
        max_total_tokens=2048,
        max_num_reqs=8,
        context_len=512,
        swa_tokens=1024 if swa else None,
        sliding_window=32 if swa else None,
    )
    config = EngineConfig(
        memory=mem, enable_overlap=overlap, chunked_prefill_size=64, enable_streaming_session=True
    )
    return Engine(config, observers=observers)


class ViewLog:
    """Keeps the view of every event it is given."""

    def __init__(self) -> None:
        self.views: list[StateView] = []

    def on_event(self, event: str, engine: Any) -> None:
        self.views.append(engine.state_view(event))


def _turn(engine: Engine, sid: str, ids: list[int], n: int = 6) -> str:
    rid = engine.submit(ids, SamplingParams(max_new_tokens=n), session_params={"id": sid})
    engine.run_until_idle()
    return rid


def test_catalog_has_the_session_invariants() -> None:
    """Every session invariant of the brief is in session.yaml, with a title and an origin."""
    assert REQUIRED <= set(SESSION.ids) and set(SESSION.ids) <= set(CATALOG.ids)
    assert all(
        rule.title and rule.origin and set(rule.fixtures) == {"pass", "fail"} for rule in SESSION
    )


@pytest.mark.parametrize("rule_id", SESSION.ids)
def test_rule_holds_on_a_view_without_session_fields(rule_id: str) -> None:
    """Views built without sessions (memory_view alone, an adapter) pass every session rule."""
    rule = SESSION.get(rule_id)
    for event in sorted(rule.events):
        assert Checker([rule]).check(event, StateView(event=event)) == ()


def test_engine_fills_slot_session_and_response_views() -> None:
    """After turn 1 the slot is idle (held, not lent) and counted in session_held and in the
    rows in use; during turn 2 it is lent (borrowed) and the pool counts it as the request's;
    the response views carry turns, parents and the inherited KV."""
    log = ViewLog()
    engine = _engine(4, False, False, log, CheckerHook(Checker(CATALOG, Level.STRICT)))
    sid = engine.open_session(1000, streaming=True)
    first = _turn(engine, sid, PROMPT)
    idle = engine.state_view("idle")
    (slot,) = idle.slots
    assert (
        slot.session_id,
        slot.kv_committed_len,
        slot.cache_protected_len,
        slot.last_turn_len,
    ) == (sid, 45, 40, 46)
    assert not slot.borrowed and slot.holds_lock and slot.kv_checked and slot.kv_mismatches == 0
    assert idle.pools[0].session_held == 48 - 40 and idle.req_pool.rows_in_use == (
        slot.req_pool_idx,
    )
    (session,) = idle.sessions
    assert (
        session.streaming
        and not session.inflight
        and session.has_slot
        and session.num_req_nodes == 1
    )
    log.views.clear()
    second = _turn(engine, sid, PROMPT[:9])
    lent = [v for v in log.views if v.event == "step" and v.slots and v.slots[0].borrowed]
    assert lent and all(v.pools[0].session_held == 0 and v.sessions[0].live_reqs == 1 for v in lent)
    (response,) = [v.response for v in log.views if v.event == "response"]
    assert (response.rid, response.turn, response.parent_turn, response.parent_prompt_tokens) == (
        second,
        2,
        1,
        40,
    )
    assert response.cached_tokens == 45 and response.appended_tokens == 8 and first != second


def test_census_names_an_idle_slot_as_owner() -> None:
    """A page an idle slot owns that is put back on the free list is dangling, and the census
    names the slot (U3/U4)."""
    engine = _engine(4)
    sid = engine.open_session(1000, streaming=True)
    _turn(engine, sid, PROMPT)
    slot = engine.mem.tree_cache.slots[sid]
    engine.mem.allocator.free(engine.mem.req_to_token_pool.read(slot.req_pool_idx, 40, 44))
    (found,) = [
        v
        for v in Checker(CATALOG).check("idle", engine.state_view("idle"))
        if v.invariant == "census.no_dangling"
    ]
    assert f"slot:{sid}@row{slot.req_pool_idx}" in found.message


def test_kv_check_catches_a_slot_row_naming_other_kv() -> None:
    """Two entries of an idle slot's row swapped: the same pages are owned (every sum and the
    census balance), but the slot's KV is no longer its last turn's — session.slot_kv_is_last_turn
    at the next session event."""
    engine = _engine(1, True, True, CheckerHook(Checker(CATALOG, Level.STRICT)))
    sid = engine.open_session(1000, streaming=True)
    _turn(engine, sid, PROMPT)
    pool, slot_row = engine.mem.req_to_token_pool, engine.mem.tree_cache.slots[sid].req_pool_idx
    pool.write(slot_row, 41, pool.req_to_token[slot_row, [42, 41]].copy())
    with pytest.raises(InvariantViolation) as caught:
        engine.open_session(10)
    assert caught.value.violation.invariant == "session.slot_kv_is_last_turn"
    assert (
        "4 KV reads (full and SWA pools) of its first 46 positions"
        in caught.value.violation.message
    )


def test_single_live_request_message_names_the_session() -> None:
    """A streaming session in flight with no live request is named with both facts."""
    view = StateView(
        event="session", sessions=(SessionView(session_id="a", streaming=True, inflight=True),)
    )
    found = Checker(CATALOG).check("session", view)
    assert [v.message for v in found] == [
        "streaming session a: inflight=True with 0 live request(s)"
    ]


def test_idle_slots_do_not_count_as_running_requests() -> None:
    """Five sessions hold rows between turns while at most three requests run at once:
    sched.running_within_limit counts requests, not idle slots; the rows in use are the
    requests' and the idle slots'."""
    mem = MemoryConfig(page_size=4, max_total_tokens=2048, max_num_reqs=12, context_len=512)
    config = EngineConfig(memory=mem, max_running_requests=3, enable_streaming_session=True)
    checker = Checker(CATALOG, Level.STRICT)
    engine = Engine(config, observers=[CheckerHook(checker)])
    sids = [engine.open_session(10, streaming=True) for _ in range(5)]
    for t in range(3):
        for s, sid in enumerate(sids):
            engine.submit(
                PROMPT[: 10 + s + t], SamplingParams(max_new_tokens=6), session_params={"id": sid}
            )
        engine.run_until_idle()
    view = engine.state_view("idle")
    assert (
        len(view.req_pool.rows_in_use) == 5
        and checker.stats()["sched.running_within_limit"].evaluations > 0
    )
