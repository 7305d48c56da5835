"""Regression tests for the streaming-session abort and finish paths (docs/sglang.md
§5 #22897, #22790) and for the two gaps SGLang 0.5.11 left open (§2.9 U6: a waiting-queue
abort, a retract), named after the behaviour. Each plants the old behaviour as a monkeypatch
mutant; the checker over the shipped catalog names the invariant at the first event that
shows it, and the same scenario on the correct engine violates nothing."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from session_mutants import RETRY, TEXTS, abort_second_turn, first_violations, three_turns
from session_support import CATALOG, encode, sp, turn

from engine.cache.streaming_session import SessionSlot, StreamingSession
from engine.engine import Engine
from engine.request import Req
from invariants.mutants import mutant

INFLIGHT = "sched.inflight_reads_held"

# ---- #22897 / #22900: overshoot trim ----


def test_finish_trims_an_overshooting_turn_to_its_finished_length(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """#22897: a finishing round that commits past ``finished_len`` (planted: the length
    limit is noticed one token late, as when EAGLE v2 resolves a whole accepted run first) is
    trimmed to ``origin + finished_len`` before the slot keeps it. Mutant (the pre-fix save:
    no trim, the request's committed length kept): the slot holds KV of a dropped token —
    session.slot_within_last_turn."""
    real = Req.check_finished

    def one_late(self: Req) -> None:
        limit = self.sampling_params.max_new_tokens
        if self.to_finish is None and len(self.output_ids) == limit:
            return  # the overshoot round: one more token is decoded
        real(self)
        if self.finished_reason is not None and self.finished_reason.kind == "length":
            self.finished_len = limit

    def untrimmed_save(
        self: StreamingSession, session: Any, slot: SessionSlot | None, req: Req
    ) -> None:
        is_first = slot is None
        slot = self.slots[session.session_id] = SessionSlot() if is_first else slot
        slot.take_back(req, is_first)
        req.pop_committed_kv_cache(), req.pop_overallocated_kv_cache()
        req.req_pool_idx = None
        session.finish_req(req)

    monkeypatch.setattr(Req, "check_finished", one_late)
    # the planted state reaches release untrimmed: the scheduler-side rule that EAGLE keeps
    # (trim before release) is not this scenario's subject
    rules = [r for r in CATALOG if r.id != "req.finished_commits_only_returned_tokens"]
    assert first_violations(three_turns, rules, page_size=4, overlap=True) == {}
    monkeypatch.setattr(StreamingSession, "_save", untrimmed_save)
    found = first_violations(three_turns, rules, page_size=4, overlap=True)
    assert found["session.slot_within_last_turn"].event == "step"


# ---- #22790: abort = wipe KV, keep tokens ----


def test_aborted_turn_never_becomes_history() -> None:
    """#22790: only finish_req moves a streaming session's history. Mutant (the pre-fix
    create_req: the new request replaces the history at once): after a mid-decode abort of
    turn 2, turn 3 is built on the aborted turn — response.history_is_last_success."""
    assert first_violations(abort_second_turn, page_size=4) == {}
    with mutant("22790-aborted-turn-is-history").patch():
        found = first_violations(abort_second_turn, page_size=4)
    assert found["response.history_is_last_success"].event == "response"


def test_mid_abort_wipes_the_slot_instead_of_saving_it() -> None:
    """#22790: an aborted turn's KV is freed with the slot (release_session), never saved.
    Mutant (pre-fix: the aborted turn's KV saved into the slot, the history left at turn 1):
    the slot holds KV past the last successful turn — session.slot_within_last_turn."""
    with mutant("22790-abort-saves-slot").patch():
        found = first_violations(abort_second_turn, page_size=4)
    assert found["session.slot_within_last_turn"].event == "step"


def close_under_a_running_turn(engine: Engine) -> None:
    sid = engine.open_session(1000, streaming=True)
    turn(engine, sid, encode(TEXTS[0]), 8)
    rid = engine.submit(encode(TEXTS[1]), sp(40), session_params={"id": sid})
    for _ in range(4):
        engine.step()
    engine.close_session(sid)
    engine.run_until_idle()
    assert (
        engine.pop_result(rid).finish_reason.kind == "length"
        and sid not in engine.sessions.sessions
    )


def test_close_is_deferred_while_a_turn_runs() -> None:
    """#22790: closing a session whose turn is running defers the release until the turn
    ends. Mutant (pre-fix _close: release at once): the running turn's row and KV are freed
    under it — under overlap the decode in flight reads them (sched.inflight_reads_held, at
    the close itself); without that rule, req_pool.no_row_free_and_used and pool.busy_sum at
    the next step."""
    assert first_violations(close_under_a_running_turn, page_size=4) == {}

    others = replace(CATALOG, rules=tuple(r for r in CATALOG if r.id != INFLIGHT))
    with mutant("22790-close-under-running-turn").patch():
        first = first_violations(close_under_a_running_turn, page_size=4)
        found = first_violations(close_under_a_running_turn, others, page_size=4)
    assert set(first) == {INFLIGHT} and "reads full slot" in first[INFLIGHT].message
    assert found["req_pool.no_row_free_and_used"].event == "step" and "pool.busy_sum" in found


# ---- the two gaps of 0.5.11 (U6) ----


def abort_while_waiting(engine: Engine) -> None:
    """Turn 2 is aborted while it waits (restored, turned away by the adder); turn 3 must be
    accepted and still inherit turn 1's KV."""
    sid = engine.open_session(1000, streaming=True)
    turn(engine, sid, encode(TEXTS[0]), 8)
    engine.submit(list(range(1, 61)), sp(8))
    rid = engine.submit(encode(TEXTS[1]), sp(8), session_params={"id": sid})
    engine.step()
    assert engine.requests[rid].req_pool_idx is not None  # restored, waiting
    assert engine.abort(rid) and engine.pop_result(rid).finish_reason.kind == "abort"
    third = turn(engine, sid, encode(TEXTS[2]), 8)
    assert third.finish_reason.kind == "length" and third.cached_tokens > 0
    engine.close_session(sid)


def test_abort_in_the_waiting_queue_ends_the_inflight_turn() -> None:
    """U6 (SGLang's waiting-queue abort never cleared ``_inflight``): here it does, the slot
    it restored is untouched, and the next turn is accepted. Mutant (not cleared):
    session.single_live_request at the abort's session event."""
    assert first_violations(abort_while_waiting, **RETRY) == {}
    with mutant("u6-waiting-abort-keeps-inflight").patch():
        found = first_violations(abort_while_waiting, **RETRY)
    assert found["session.single_live_request"].event == "session"


def concurrent_turns(engine: Engine) -> None:
    sids = [engine.open_session(1000, streaming=True) for _ in range(4)]
    for t in range(3):
        rids = [
            engine.submit(encode(f"S{s} T{t} {TEXTS[t]}"), sp(12), session_params={"id": sid})
            for s, sid in enumerate(sids)
        ]
        engine.run_until_idle()
        assert all(engine.pop_result(rid).finish_reason.kind == "length" for rid in rids)
    assert engine.stats.retracted_reqs > 0
    for sid in sids:
        engine.close_session(sid)


def test_retract_keeps_the_session_checkpoint() -> None:
    """U6 (SGLang 0.5.11's retract saved the slot and called finish_req for a live request):
    here a retracted turn wipes its borrowed slot and stays in flight; history is unchanged.
    Mutant (the 0.5.11 retract): session.single_live_request — in flight cleared while the
    retracted turn still lives."""
    assert first_violations(concurrent_turns, page_size=4, retract=True) == {}
    with mutant("40252-retract-saves-slot").patch():
        found = first_violations(concurrent_turns, page_size=4, retract=True)
    assert "session.single_live_request" in found
