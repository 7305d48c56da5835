"""SGLang's streaming-session suite (docs/sglang.md §4.1) at the Engine API, over all
pairs of page size {1, 4, 256} × overlap × retract × mixed chunk × cache (radix, chunk,
SWA radix). Every engine runs the whole catalog at level 2 at every event — SGLang's
"strict mem check crashes the scheduler, so a healthy server is an oracle" — and each
method also asserts SGLang's response-level expectations."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import pytest
from session_support import (
    FILLER,
    MATRIX,
    PANGRAM,
    checked_engine,
    encode,
    engine_for,
    finish,
    inherit_offset,
    row_id,
    session_config,
    sp,
    turn,
)

from engine.engine import Engine

ROWS = pytest.mark.parametrize("row", MATRIX, ids=[row_id(r) for r in MATRIX])
CHUNKS = (
    "Let me tell you something about France.",
    "The capital of France is",
    "The population of the city is",
)


@ROWS
def test_kv_cache_inheritance(row: dict[str, Any]) -> None:
    """Turn 1 (after a flush) caches nothing; turn k+1 inherits all of turn k's KV:
    cached_tokens == prompt_k + completion_k + offset (0 with overlap, else -1)."""
    engine, checker = engine_for(row)
    assert engine.flush_cache()
    sid = engine.open_session(1000, streaming=True)
    prev, results = None, []
    for text in CHUNKS:
        results.append(turn(engine, sid, encode(text), 12, prev))
        prev = results[-1].rid
    assert results[0].cached_tokens == 0
    for before, after, text in zip(results, results[1:], CHUNKS[1:]):
        assert (
            after.cached_tokens
            == before.prompt_tokens + before.completion_tokens + inherit_offset(engine)
        )
        assert (
            after.prompt_tokens
            == before.prompt_tokens + before.completion_tokens + len(encode(text)) - 1
        )  # BOS
    assert engine.close_session(sid)
    finish(engine, checker)


def _concurrent_round(engine: Engine, sids: list[str], turns: int, **submit: Any) -> None:
    """``turns`` turns of every session, each turn's requests submitted together."""
    for t in range(turns):
        rids = [
            engine.submit(
                encode(f"S{s} T{t}: {PANGRAM}"), sp(8), session_params={"id": sid}, **submit
            )
            for s, sid in enumerate(sids)
        ]
        engine.run_until_idle()
        for rid in rids:
            assert engine.pop_result(rid).finish_reason.kind == "length"


@ROWS
@pytest.mark.parametrize(
    "logprob",
    [{"return_logprob": True}, {"return_logprob": True, "logprob_start_len": 0}, {}],
    ids=["logprob", "logprob-start0", "none"],
)
def test_leak_logprob_concurrent(row: dict[str, Any], logprob: dict[str, Any]) -> None:
    """Rounds of six concurrent streaming sessions × five turns (logprob flags on or off)
    open, run and close without any accounting violation."""
    engine, checker = engine_for(row)
    for _ in range(2):
        sids = [engine.open_session(1000, streaming=True) for _ in range(6)]
        _concurrent_round(engine, sids, 5, **logprob)
        assert all(engine.close_session(sid) for sid in sids)
    finish(engine, checker)
    assert not engine.sessions.sessions and not engine.mem.tree_cache.slots


@ROWS
def test_stress_concurrent_sessions(row: dict[str, Any]) -> None:
    """Eight sessions × four turns of long (chunked) prompts, with four non-session requests
    per turn; then close, plain cleanup requests, idle."""
    engine, checker = engine_for(row)
    sids = [engine.open_session(1000, streaming=True) for _ in range(8)]
    size = 160 if engine.config.memory.page_size < 256 else 600
    for t in range(4):
        rids = [
            engine.submit(
                encode(FILLER[(s * 7 + t) * 37 % 4000 :][:size]), sp(16), session_params={"id": sid}
            )
            for s, sid in enumerate(sids)
        ]
        rids += [engine.submit(encode(f"plain {t} {i}: {PANGRAM}"), sp(16)) for i in range(4)]
        engine.run_until_idle()
        assert all(engine.pop_result(rid).finish_reason.kind == "length" for rid in rids)
    assert all(engine.close_session(sid) for sid in sids)
    assert all(
        r.finish_reason.kind == "length"
        for r in engine.generate([encode(f"cleanup {i}") for i in range(3)], sp(8))
    )
    assert engine.stats.chunked_prefills > 0
    finish(engine, checker)


def _abort_mid_decode(engine: Engine, rid: str) -> None:
    """Run until the request decodes, then abort everything (SGLang: abort_all after 0.5 s)."""
    for _ in range(200):
        engine.step()
        if len(engine.requests[rid].output_ids) >= 3:
            break
    assert engine.abort(rid)
    engine.run_until_idle()


@ROWS
def test_nth_mid_abort_recovery(row: dict[str, Any]) -> None:
    """Turn 2 is aborted mid-decode: its response is an abort, and turn 3's prompt is turn
    1's tokens plus its own input (the aborted turn contributes nothing)."""
    engine, checker = engine_for(row)
    sid = engine.open_session(1000, streaming=True)
    first = turn(engine, sid, encode(CHUNKS[0]), 16)
    rid = engine.submit(encode(CHUNKS[1]), sp(100000), session_params={"id": sid})
    _abort_mid_decode(engine, rid)
    assert engine.pop_result(rid).finish_reason.kind == "abort"
    ids = encode(CHUNKS[2])
    third = turn(engine, sid, ids, 12)
    assert third.finish_reason.kind == "length"
    assert (
        third.prompt_tokens == first.prompt_tokens + first.completion_tokens + len(ids) - 1
    )  # BOS stripped
    assert engine.close_session(sid)
    finish(engine, checker)


@ROWS
def test_first_mid_abort_recovery(row: dict[str, Any]) -> None:
    """The very first turn is aborted mid-decode: turn 2 has no history (no BOS strip)."""
    engine, checker = engine_for(row)
    sid = engine.open_session(1000, streaming=True)
    rid = engine.submit(encode(CHUNKS[0]), sp(100000), session_params={"id": sid})
    _abort_mid_decode(engine, rid)
    assert engine.pop_result(rid).finish_reason.kind == "abort"
    ids = encode(CHUNKS[1])
    second = turn(engine, sid, ids, 12)
    assert second.finish_reason.kind == "length" and second.prompt_tokens == len(ids)
    assert engine.close_session(sid)
    finish(engine, checker)


@ROWS
def test_preabort_recovery(row: dict[str, Any]) -> None:
    """Turn 2 with ``offset=1`` is rejected in create_req (400); the slot is intact, so turn 3
    appends to turn 1 and inherits its KV."""
    engine, checker = engine_for(row)
    sid = engine.open_session(1000, streaming=True)
    first = turn(engine, sid, encode(CHUNKS[0]), 16)
    second = turn(engine, sid, encode(CHUNKS[1]), 12, offset=1)
    assert second.finish_reason.kind == "abort" and second.finish_reason.status_code == 400
    ids = encode(CHUNKS[2])
    third = turn(engine, sid, ids, 12)
    assert third.prompt_tokens == first.prompt_tokens + first.completion_tokens + len(ids) - 1
    assert third.cached_tokens == first.prompt_tokens + first.completion_tokens + inherit_offset(
        engine
    )
    assert engine.close_session(sid)
    finish(engine, checker)


def test_abort_heavy_chunked_prefill_does_not_leak() -> None:
    """SGLang's AbortLeakRepro: context 512, page 256, chunk 4096, 32 running; four sessions
    through rounds of concurrent turns and plain requests, too-long turns (aborted, 400,
    "maximum allowed length"), and recovery turns that still inherit their slot's KV."""
    config = session_config(
        256, True, total=256 * 64, chunk=4096, context_len=512, max_running_requests=32
    )
    engine, checker = checked_engine(config)
    sids = [engine.open_session(50000, streaming=True) for _ in range(4)]
    for s, sid in enumerate(sids):
        assert (
            turn(engine, sid, encode(f"warm {s}: {PANGRAM[: 16 + s]}"), 4).finish_reason.kind
            == "length"
        )
    for rnd in range(8):
        rids = [
            engine.submit(
                encode(f"R{rnd} S{s} {PANGRAM[: 10 + s]}"), sp(4), session_params={"id": sid}
            )
            for s, sid in enumerate(sids)
        ]
        rids += [engine.submit(encode(f"plain {rnd} {i} {PANGRAM[:12]}"), sp(4)) for i in range(2)]
        engine.run_until_idle()
        assert all(engine.pop_result(rid).finish_reason.kind == "length" for rid in rids)
        for sid in sids:
            long = turn(engine, sid, encode(FILLER[: 600 + rnd]), 4)
            assert long.finish_reason.kind == "abort" and long.finish_reason.status_code == 400
            assert "maximum allowed length" in (long.finish_reason.message or "")
        for sid in sids:
            assert turn(engine, sid, encode(f"recover {rnd}", bos=False), 4).cached_tokens > 0
    assert all(engine.close_session(sid) for sid in sids)
    assert all(
        r.finish_reason.kind == "length"
        for r in engine.generate([encode(f"after {i}") for i in range(3)], sp(4))
    )
    finish(engine, checker)


@pytest.mark.parametrize(("version", "page_size"), [(1, 1), (1, 256), (2, 4), (2, 256)])
def test_kv_cache_inheritance_with_eagle(version: int, page_size: int) -> None:
    """SGLang's Eagle / EagleV2 classes: speculative turns inherit KV too — v1 (no overlap)
    with offset -1, v2 (overlap, bonus pre-claim) with offset 0."""
    from engine.config.speculative import SpecConfig

    engine, checker = checked_engine(
        session_config(page_size, overlap=version == 2, speculative=SpecConfig(version=version))
    )
    sid = engine.open_session(1000, streaming=True)
    results = [turn(engine, sid, encode(text), 12) for text in CHUNKS]
    for before, after in pairwise(results):
        assert after.cached_tokens == before.prompt_tokens + before.completion_tokens + (
            0 if version == 2 else -1
        )
    assert engine.close_session(sid)
    finish(engine, checker)


def test_a_streaming_turn_ignores_its_logprob_start() -> None:
    """A streaming turn reuses its slot's KV, so SGLang ignores its ``logprob_start_len``
    (0.5.11 ``init_next_round_input``): only the output's logprobs come back, as with -1,
    and the history is not recomputed (cached_tokens as without logprobs). A non-streaming
    turn recomputes its prompt from the start it asked for."""
    engine, checker = checked_engine(session_config())
    results = {}
    for streaming in (True, False):
        sid = engine.open_session(1000, streaming=streaming)
        first = turn(engine, sid, encode(CHUNKS[0]), 6)
        rid = engine.submit(
            encode(CHUNKS[1]),
            sp(6),
            session_params={"id": sid, "rid": first.rid},
            return_logprob=True,
            logprob_start_len=0,
        )
        engine.run_until_idle()
        results[streaming] = engine.pop_result(rid)
        assert engine.close_session(sid)
    streamed, plain = results[True], results[False]
    assert streamed.input_token_ids == () and streamed.input_token_logprobs == ()
    assert len(streamed.output_token_logprobs) == 6 and streamed.cached_tokens > 0
    assert len(plain.input_token_logprobs) == plain.prompt_tokens and plain.cached_tokens == 0
    finish(engine, checker)
