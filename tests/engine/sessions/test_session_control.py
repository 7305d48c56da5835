"""The session controller at the Engine API (docs/sglang.md §2.8, §3, §4.4): non-streaming
sessions (``rid``, ``offset``, ``replace``, ``drop_previous_output``, branching, BOS strip)
give the tokens of the concatenated context sent without a session; every rejection is an
abort with status 400 and SGLang's message; open/close semantics, deferred close, timeouts,
``flush_cache`` only when idle. The strict catalog runs throughout."""

from __future__ import annotations

import pytest
from session_support import BOS, CATALOG, checked_engine, encode, finish, session_config, sp, turn

from engine.engine import Engine
from engine.hooks import SimClock
from engine.sched.sessions import SessionError
from invariants.checking.checker import Checker, CheckerHook, Level

CHUNKS = [
    "Let me tell you something about France.",
    "The capital of France is",
    "The population of the city is",
    "A brief history of the city:",
]


@pytest.fixture(params=[True, False], ids=["streaming-enabled", "streaming-disabled"])
def engine(request: pytest.FixtureRequest) -> Engine:
    """Non-streaming sessions work with and without the streaming flag."""
    return checked_engine(session_config(4, overlap=True, streaming=request.param))[0]


def _plain(engine: Engine, ids: list[int], max_new: int) -> tuple[int, ...]:
    return engine.generate([ids], sp(max_new))[0].output_ids


def test_session_control_offset_replace_backtrack(engine: Engine) -> None:
    """SGLang's test_session_control: each chunk appended to the previous request with
    ``offset=-1, replace=True`` (the last output token dropped), then a backtrack to the
    first request; the removed request's id is rejected afterwards; a closed session rejects.
    Each answer equals plain generation on the concatenated context."""
    sid = engine.open_session(1000)
    with pytest.raises(SessionError, match="Failed to open the session"):
        engine.open_session(1000, session_id=sid)
    context: list[int] = []
    rids, prev = [], None
    for i, text in enumerate(CHUNKS):
        ids, max_new = encode(text), 1 if i == 0 else 12
        res = turn(engine, sid, ids, max_new, prev, offset=-1, replace=True)
        context = (context[:-1] if context else []) + (ids[1:] if context else ids)
        assert res.prompt_tokens == len(context) and res.output_ids == _plain(
            engine, context, max_new
        )
        context += list(res.output_ids)
        rids.append(res.rid)
        prev = res.rid
    first = rids[0]
    back = turn(engine, sid, encode(CHUNKS[-1]), 12, first, offset=-1, replace=True)
    head = encode(
        CHUNKS[0]
    )  # the first request: its prompt and its one output token, minus that token
    assert back.output_ids == _plain(engine, head + encode(CHUNKS[-1], bos=False), 12)
    gone = turn(engine, sid, encode("x"), 4, rids[1])
    assert (
        gone.finish_reason.kind == "abort"
        and gone.finish_reason.message == "Invalid request session id"
    )
    assert engine.close_session(sid)
    closed = turn(engine, sid, encode("x"), 4)
    assert closed.finish_reason.to_json() == {
        "type": "abort",
        "status_code": 400,
        "message": f"Invalid request: session id {sid} does not exist",
    }


def test_session_control_with_branching(engine: Engine) -> None:
    """A root and two branches of two steps each (``offset 0, replace False``): every answer
    equals plain generation on the root + branch text."""
    sid = engine.open_session(1000)
    root = turn(engine, sid, encode("Root: the history of a small town."), 8)
    base = encode("Root: the history of a small town.") + list(root.output_ids)
    for b in range(2):
        prev, context = root.rid, list(base)
        for step in range(2):
            ids = encode(f" Branch {b} step {step}.")
            res = turn(engine, sid, ids, 8, prev, offset=0, replace=False)
            context += ids[1:]
            assert res.output_ids == _plain(engine, context, 8) and res.prompt_tokens == len(
                context
            )
            context += list(res.output_ids)
            prev = res.rid
    assert engine.close_session(sid)
    engine.run_until_idle()


def test_drop_previous_output_and_unfinished_parent(engine: Engine) -> None:
    """``drop_previous_output`` appends to the parent's prompt only; appending to a parent
    still running is rejected with SGLang's message; ``replace`` aborts it instead."""
    sid = engine.open_session(1000)
    first = turn(engine, sid, encode(CHUNKS[0]), 6)
    res = turn(engine, sid, encode(CHUNKS[1]), 6, first.rid, drop_previous_output=True)
    assert res.output_ids == _plain(engine, encode(CHUNKS[0]) + encode(CHUNKS[1], bos=False), 6)
    running = engine.submit(
        encode(CHUNKS[2]), sp(500), session_params={"id": sid, "rid": first.rid}
    )
    engine.step()
    early = engine.submit(encode("y"), sp(4), session_params={"id": sid, "rid": running})
    assert (
        engine.pop_result(early).finish_reason.message
        == "Session request is appending to a request that hasn't finished."
    )
    replacing = engine.submit(
        encode("z"), sp(4), session_params={"id": sid, "rid": running, "replace": True}
    )
    engine.run_until_idle()
    assert engine.pop_result(running).finish_reason.kind == "abort"
    assert engine.pop_result(replacing).finish_reason.kind == "length"
    engine.close_session(sid)
    engine.run_until_idle()


def test_streaming_rejections_have_sglang_messages() -> None:
    """Streaming sessions refuse a second in-flight turn, replace, drop_previous_output and a
    non-zero offset (status 400, nothing changes); unknown and closing sessions are refused;
    streaming needs the flag; unknown session_params keys are an error."""
    engine, checker = checked_engine(session_config(4))
    sid = engine.open_session(1000, streaming=True)
    cases = {
        "Streaming sessions do not support replace.": {"replace": True},
        "Streaming sessions do not support drop_previous_output.": {"drop_previous_output": True},
        "Streaming sessions do not support offset.": {"offset": 3},
    }
    for message, extra in cases.items():  # checked in SGLang's order: in flight first
        rid = engine.submit(encode("x"), sp(4), session_params={"id": sid, **extra})
        reason = engine.pop_result(rid).finish_reason
        assert (reason.kind, reason.message, reason.status_code) == ("abort", message, 400)
    first = engine.submit(encode(CHUNKS[0]), sp(50), session_params={"id": sid})
    busy = engine.submit(encode("x"), sp(4), session_params={"id": sid, "replace": True})
    assert (
        engine.pop_result(busy).finish_reason.message
        == "Streaming session already has an active request."
    )
    engine.close_session(sid)  # deferred: the turn is in flight
    rid = engine.submit(encode("x"), sp(4), session_params={"id": sid})
    assert (
        engine.pop_result(rid).finish_reason.message
        == f"Invalid request: close was requested for session {sid}"
    )
    engine.run_until_idle()
    assert (
        engine.pop_result(first).finish_reason.kind == "length"
        and sid not in engine.sessions.sessions
    )
    with pytest.raises(SessionError, match="unknown session_params keys"):
        engine.submit(encode("x"), sp(4), session_params={"id": sid, "streaming": True})
    plain, _ = checked_engine(session_config(4, streaming=False))
    with pytest.raises(SessionError, match="Streaming sessions are disabled"):
        plain.open_session(1000, streaming=True)
    finish(engine, checker)


def test_bos_is_stripped_only_when_appending() -> None:
    """The appended input's leading BOS is dropped when the session has history, kept on turn 1."""
    engine, checker = checked_engine(session_config(1))
    sid = engine.open_session(1000, streaming=True)
    one = turn(engine, sid, encode("abc"), 3)
    two = turn(engine, sid, encode("de"), 3)
    assert one.prompt_tokens == 4 and two.prompt_tokens == 4 + 3 + 2
    three = turn(engine, sid, [BOS, BOS, 7], 3)
    assert three.prompt_tokens == two.prompt_tokens + two.completion_tokens + 2
    engine.close_session(sid)
    finish(engine, checker)


def test_timeout_closes_idle_sessions_and_defers_busy_ones() -> None:
    """A session idle past its timeout is closed at the next loop iteration (its slot
    released); one with a turn in flight is closed when that turn ends."""
    clock = SimClock(step_s=1.0)
    config = session_config(4)
    checker = Checker(CATALOG, Level.STRICT)
    engine = Engine(config, clock=clock, observers=[CheckerHook(checker)])
    idle_sid = engine.open_session(1000, streaming=True, timeout=5.0)
    busy_sid = engine.open_session(1000, streaming=True, timeout=5.0)
    turn(engine, idle_sid, encode("hello"), 2)
    rid = engine.submit(encode("a long one"), sp(40), session_params={"id": busy_sid})
    for _ in range(12):
        engine.step()
    assert (
        idle_sid not in engine.sessions.sessions
        and engine.sessions.sessions[busy_sid].close_on_finish
    )
    engine.run_until_idle()
    engine.step()
    assert busy_sid not in engine.sessions.sessions and not engine.mem.tree_cache.slots
    assert engine.pop_result(rid).finish_reason.kind == "length"
    finish(engine, checker)


def test_flush_cache_drops_slots_only_when_idle() -> None:
    """``flush_cache`` is refused while a turn runs; at idle it drops every slot (the history
    stays: the next turn re-prefills it and caches nothing)."""
    engine, checker = checked_engine(session_config(4))
    sid = engine.open_session(1000, streaming=True)
    first = turn(engine, sid, encode(CHUNKS[0]), 8)
    rid = engine.submit(encode(CHUNKS[1]), sp(8), session_params={"id": sid})
    engine.step()
    assert not engine.flush_cache()
    engine.run_until_idle()
    second = engine.pop_result(rid)
    assert second.cached_tokens == first.prompt_tokens + first.completion_tokens
    assert engine.flush_cache() and not engine.mem.tree_cache.slots
    third = turn(engine, sid, encode(CHUNKS[2]), 8)
    assert (
        third.cached_tokens == 0
        and third.prompt_tokens == second.prompt_tokens + 8 + len(encode(CHUNKS[2])) - 1
    )
    engine.close_session(sid)
    finish(engine, checker)
