"""Sessions cannot wedge the scheduler (engine/sched/wedge.py; SGLang #27024): streaming
sessions whose pinned KV leaves no room for any waiting turn have idle slots reclaimed — the
turns re-prefill and return the same tokens as on a pool large enough never to wedge — and
without the breaker, ``sched.no_wedge`` names the wedge (a request the pool can never hold
is refused at submit: tests/engine/sched). Checked at level 2 throughout."""

from __future__ import annotations

import random

import pytest

import engine.sched.scheduler as scheduler_module
import engine.sched.wedge as wedge
from engine.engine import Engine
from engine.request import SamplingParams
from invariants.checking.checker import InvariantViolation

SESSIONS, TURNS = 16, 4


def _load(engine: Engine, seed: int = 0) -> dict[str, list[tuple[int, ...]]]:
    """SESSIONS streaming sessions × TURNS turns, every session's next turn sent as soon as
    its last one ends; each session's outputs in order."""
    rng = random.Random(seed)
    sids = [engine.open_session(1000, f"s{i}", True, None) for i in range(SESSIONS)]
    turns = {
        sid: [
            ([rng.randrange(256) for _ in range(rng.randint(40, 120))], rng.randint(8, 32))
            for _ in range(TURNS)
        ]
        for sid in sids
    }
    outputs: dict[str, list[tuple[int, ...]]] = {sid: [] for sid in sids}
    live: dict[str, str] = {}
    while any(len(out) < TURNS for out in outputs.values()):
        for sid in sids:
            if sid not in live and len(outputs[sid]) < TURNS:
                ids, max_new = turns[sid][len(outputs[sid])]
                params = SamplingParams(max_new_tokens=max_new)
                live[sid] = engine.submit(ids, params, session_params={"id": sid})
        engine.step()
        for sid, rid in list(live.items()):
            if rid in engine.results:
                result = engine.pop_result(rid)
                assert result.finish_reason.kind == "length", result.finish_reason
                outputs[sid].append(result.output_ids)
                del live[sid]
    return outputs


def _engine(checked_engine, total: int) -> Engine:
    return checked_engine(
        page_size=4, max_total_tokens=total, context_len=1024, enable_streaming_session=True
    )


def test_pinned_sessions_have_idle_slots_reclaimed_and_answer_the_same(checked_engine) -> None:
    small = _engine(checked_engine, 2048)
    outputs = _load(small)
    assert small.scheduler.stats.wedge_reclaims > 0  # the load did wedge the small pool
    large = _engine(checked_engine, 65536)
    assert _load(large) == outputs
    assert large.scheduler.stats.wedge_reclaims == 0


def test_without_the_breaker_the_wedge_is_named(checked_engine, monkeypatch) -> None:
    """The breaker switched off: the first wedged iteration fails ``sched.no_wedge``, which
    names the waiting requests (SGLang's state in #27024: all waiting, none running)."""
    monkeypatch.setattr(wedge, "reclaim_slot", lambda s: False)
    monkeypatch.setattr(scheduler_module, "reclaim_slot", lambda s: False)
    with pytest.raises(InvariantViolation) as found:
        _load(_engine(checked_engine, 2048))
    assert "[sched.no_wedge]" in str(found.value) and "with nothing running" in str(found.value)
