"""The Engine facade: results, request validation, abort, flush, hooks, clock, strict level."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from engine.config import EngineConfig, MemoryConfig, resolve_strict_level
from engine.engine import Engine, SchedulerStall
from engine.errors import ConfigError
from engine.hooks import NullHooks, SimClock
from engine.model.tokenizer import EOS_ID
from engine.request import SamplingParams


def _engine(overlap: bool = True, observers: tuple[Any, ...] = (), **kw: Any) -> Engine:
    mem = MemoryConfig(page_size=4, max_total_tokens=4096, max_num_reqs=8, context_len=512)
    return Engine(EngineConfig(memory=mem, enable_overlap=overlap, **kw), observers=observers)


def _prompt(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 256, n).tolist()


def _assert_pool_whole(engine: Engine) -> None:
    for pool in engine.state_view("idle").pools:
        assert (
            pool.free + pool.evictable == pool.capacity
            and pool.request_owned == pool.protected == 0
        )


def test_generate_returns_results_in_prompt_order_with_usage() -> None:
    """``generate`` blocks until idle and returns one result per prompt, in order, with
    output ids, finish reason and the prompt/completion/cached token counts; a second prompt
    sharing a cached prefix reports cached tokens."""
    engine = _engine()
    head = _prompt(0, 64)
    first = engine.generate([head + [1, 2, 3]], SamplingParams(max_new_tokens=5))[0]
    a, b = engine.generate(
        [head + [9, 9], _prompt(1, 10)],
        [SamplingParams(max_new_tokens=3), SamplingParams(max_new_tokens=4)],
    )
    assert (first.prompt_tokens, first.completion_tokens, len(first.output_ids)) == (67, 5, 5)
    assert first.finish_reason.to_json() == {"type": "length", "length": 5}
    assert (a.completion_tokens, b.completion_tokens) == (3, 4)
    assert a.cached_tokens == 64 and b.cached_tokens == 0
    assert a.meta_info()["cached_tokens"] == 64
    assert engine.is_idle() and not engine.requests
    _assert_pool_whole(engine)


def test_a_fully_cached_prompt_still_recomputes_its_last_token() -> None:
    """The one-token logit reserve: the same prompt again matches at most ``len - 1`` tokens
    (page floored), so its first output token is recomputed — and identical."""
    engine = _engine()
    prompt = _prompt(5, 64)
    first, again = (
        engine.generate([prompt], SamplingParams(max_new_tokens=3))[0] for _ in range(2)
    )
    assert first.cached_tokens == 0 and again.cached_tokens == 60  # floor_align(63, 4)
    assert again.output_ids == first.output_ids


def test_stop_and_eos_tokens_finish_with_stop() -> None:
    """A sampled EOS (unless ignore_eos) or stop token finishes the request with ``stop``."""
    engine = _engine(eos_prob=0.2)
    results = engine.generate([_prompt(i, 20) for i in range(8)], SamplingParams(max_new_tokens=40))
    stops = [r for r in results if r.finish_reason.kind == "stop"]
    assert stops and all(r.output_ids[-1] == EOS_ID == r.finish_reason.matched for r in stops)
    ignore = engine.generate(
        [_prompt(i, 20) for i in range(8)], SamplingParams(max_new_tokens=40, ignore_eos=True)
    )
    assert all(r.completion_tokens == 40 for r in ignore)
    plain = _engine().generate([_prompt(3, 20)], SamplingParams(max_new_tokens=30))[0]
    stop_at = plain.output_ids[4]
    cut = _engine().generate(
        [_prompt(3, 20)], SamplingParams(max_new_tokens=30, stop_token_ids=(stop_at,))
    )[0]
    assert (
        cut.finish_reason.kind == "stop"
        and cut.output_ids == plain.output_ids[: plain.output_ids.index(stop_at) + 1]
    )


def test_prompt_over_the_length_limit_is_aborted_before_memory() -> None:
    """A prompt of ``max_req_input_len`` tokens or more finishes at once — abort, status 400,
    a message naming the maximum allowed length — and no KV or row is touched."""
    engine = _engine()
    limit = engine.config.max_req_input_len
    rid = engine.submit(_prompt(0, limit))
    result = engine.pop_result(rid)
    assert result.finish_reason.kind == "abort" and result.finish_reason.status_code == 400
    assert (
        "maximum allowed length" in (result.finish_reason.message or "")
        and result.completion_tokens == 0
    )
    view = engine.state_view("step")
    assert view.pools[0].free == view.pools[0].capacity and not view.req_pool.rows_in_use
    assert (
        engine.generate([_prompt(0, limit - 1)], SamplingParams(max_new_tokens=2))[
            0
        ].completion_tokens
        == 2
    )


def test_an_empty_input_is_refused_before_any_session_or_memory() -> None:
    """No input tokens — a plain prompt or a session's turn — finishes at once with status
    400 ("input_ids cannot be empty.", SGLang's GenerateReqInput), nothing generated, and the
    session's history and the pools untouched: the next turn continues as if it never came."""
    engine = _engine()
    sid = engine.open_session(1000, "s")
    first = engine.submit(_prompt(0, 6), session_params={"id": sid})
    engine.run_until_idle()
    engine.pop_result(first)
    for params in (None, {"id": sid, "rid": first}):
        result = engine.pop_result(engine.submit([], session_params=params))
        assert (result.finish_reason.status_code, result.finish_reason.message) == (
            400,
            "input_ids cannot be empty.",
        )
        assert result.completion_tokens == 0 and result.prompt_tokens == 0
    view = engine.state_view("step")
    assert not view.req_pool.rows_in_use and not view.reqs
    nxt = engine.submit([7, 8], session_params={"id": sid, "rid": first})
    engine.run_until_idle()
    assert engine.pop_result(nxt).prompt_tokens > 2  # the history came with it


def test_abort_of_a_waiting_request_finishes_it_at_once() -> None:
    engine = _engine()
    rid = engine.submit(_prompt(0, 30))
    assert engine.abort(rid) and not engine.abort(rid) and not engine.abort("nope")
    result = engine.pop_result(rid)
    assert result.finish_reason.kind == "abort" and result.completion_tokens == 0
    assert engine.run_until_idle() == 1


@pytest.mark.parametrize("overlap", [False, True])
def test_abort_of_a_running_request_releases_it_the_normal_way(overlap: bool) -> None:
    """A running request gets ``to_finish``; after its next forward it finishes with the abort
    reason and its KV goes through the normal release (the pool is whole at idle)."""
    engine = _engine(overlap)
    rid = engine.submit(_prompt(0, 30), SamplingParams(max_new_tokens=100))
    other = engine.submit(_prompt(1, 30), SamplingParams(max_new_tokens=10))
    for _ in range(4):
        engine.step()
    assert engine.abort(rid)
    engine.run_until_idle()
    result, done = engine.pop_result(rid), engine.pop_result(other)
    assert result.finish_reason.kind == "abort" and 0 < result.completion_tokens < 100
    assert done.completion_tokens == 10
    _assert_pool_whole(engine)


def test_flush_cache_only_when_idle() -> None:
    """``flush_cache`` is refused while work is pending; when idle it empties the cache."""
    engine = _engine()
    engine.generate([_prompt(0, 40)], SamplingParams(max_new_tokens=4))
    assert engine.mem.tree_cache.evictable_size() > 0
    engine.submit(_prompt(1, 40))
    assert not engine.flush_cache()
    engine.run_until_idle()
    assert engine.flush_cache()
    view = engine.state_view("idle")
    assert view.pools[0].free == view.pools[0].capacity and view.tree.evictable_size == 0


def test_hooks_see_events_in_loop_order_and_none_costs_a_null_object() -> None:
    """Per iteration: schedule → forward → process (overlap: the previous batch's) → step;
    ``response`` once per finished request, after the iteration that finished it; ``idle``
    once on the iteration that finds nothing to do. No observer: a null hook list."""
    assert isinstance(_engine().hooks, NullHooks)
    log: list[str] = []

    class Log:
        def on_event(self, event: str, engine: Any) -> None:
            log.append(event)

    for overlap in (False, True):
        log.clear()
        engine = _engine(overlap, observers=(Log(),))
        engine.generate([_prompt(0, 10)], SamplingParams(max_new_tokens=2))
        text = " ".join(log)
        if overlap:
            assert text == (
                "schedule forward step schedule forward process step "
                "schedule forward process step response process step idle step"
            )
        else:
            assert (
                text
                == "schedule forward process step schedule forward process step response idle step"
            )


def test_state_view_lists_live_requests_and_scheduler() -> None:
    engine = _engine(False)
    engine.submit(_prompt(0, 20), SamplingParams(max_new_tokens=5))
    engine.step()
    view = engine.state_view("step")
    assert [r.rid for r in view.reqs] == ["req-0"] and view.reqs[0].kv_committed_len == 20
    assert view.sched.batch_mode == "extend" and view.sched.num_running == 0 and view.step == 1


def test_simulated_clock_ticks_once_per_step() -> None:
    clock = SimClock(step_s=0.5)
    engine = Engine(EngineConfig(), clock=clock)
    engine.generate([_prompt(0, 10)], SamplingParams(max_new_tokens=3))
    assert clock.now() == pytest.approx(0.5 * engine.step_count)


def test_strict_level_from_config_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine stores the checking level: ``KVSPEC_STRICT`` when set, else the config."""
    monkeypatch.delenv("KVSPEC_STRICT", raising=False)
    assert Engine(EngineConfig(strict_level=1)).strict_level == 1
    monkeypatch.setenv("KVSPEC_STRICT", "2")
    assert Engine(EngineConfig(strict_level=1)).strict_level == 2
    with pytest.raises(ConfigError, match="KVSPEC_STRICT"):
        resolve_strict_level(EngineConfig(), {"KVSPEC_STRICT": "3"})


def test_config_errors_name_the_field() -> None:
    with pytest.raises(ConfigError, match="max_running_requests"):
        EngineConfig(memory=MemoryConfig(max_num_reqs=4), max_running_requests=5)
    with pytest.raises(ConfigError, match="chunked_prefill_size"):
        EngineConfig(memory=MemoryConfig(page_size=16), chunked_prefill_size=8)


def test_duplicate_rid_is_rejected() -> None:
    engine = _engine()
    engine.submit([1, 2, 3], rid="x")
    with pytest.raises(ValueError, match="duplicate"):
        engine.submit([1, 2, 3], rid="x")


def test_a_request_that_can_never_fit_stalls_loudly() -> None:
    """Prompt + decode budget + a page above the pool: SGLang would spin forever; the engine
    raises ``SchedulerStall`` naming the request and the pool."""
    mem = MemoryConfig(page_size=256, max_total_tokens=1024, max_num_reqs=4, context_len=1024)
    engine = Engine(EngineConfig(memory=mem, chunked_prefill_size=512))
    engine.submit(_prompt(0, 900), SamplingParams(max_new_tokens=200))
    with pytest.raises(SchedulerStall, match="req-0"):
        engine.run_until_idle()
