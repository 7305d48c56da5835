"""Retract: SGLang's victim order, exact release of what a victim held, the last request stays."""

from __future__ import annotations

import pytest
from sched_support import check_accounting, prompts

from engine.config import EngineConfig, MemoryConfig
from engine.engine import Engine
from engine.errors import KVAccountingError, KVOutOfMemory
from engine.mem import paging
from engine.request import Req, SamplingParams
from engine.sched.batch import ScheduleBatch
from engine.sched.retract import retract_decode, retract_order


def _req(rid: str, n_in: int, n_out: int, max_new: int = 100) -> Req:
    return Req(rid, [1] * n_in, [2] * n_out, sampling_params=SamplingParams(max_new_tokens=max_new))


def test_victims_are_fewest_outputs_then_longest_prompt() -> None:
    """docs/design.md decision 12: ``pop()`` order = fewest output tokens first, ties broken by
    the longest prompt."""
    reqs = [_req("a", 10, 3), _req("b", 10, 1), _req("c", 30, 1), _req("d", 5, 5)]
    order = retract_order(reqs)
    assert [reqs[order.pop()].rid for _ in range(4)] == ["c", "b", "a", "d"]


def _decoding_engine(page_size: int, cache: str) -> Engine:
    """An engine (no overlap) stopped while four requests decode and nothing is chunked."""
    mem = MemoryConfig(
        page_size=page_size, max_total_tokens=8192, max_num_reqs=8, context_len=1024, cache=cache
    )
    engine = Engine(EngineConfig(memory=mem, enable_overlap=False, chunked_prefill_size=None))
    for i, p in enumerate(prompts(7, 4, 48, 20, 60)):
        engine.submit(p, SamplingParams(max_new_tokens=50 + i))
    for _ in range(6):
        engine.step()
    assert engine.scheduler.running_batch.batch_size() == 4 and engine.scheduler.chunked_req is None
    return engine


@pytest.mark.parametrize(("page_size", "cache"), [(1, "radix"), (16, "radix"), (4, "chunk")])
def test_retract_frees_exactly_what_it_held(page_size: int, cache: str) -> None:
    """Regression (retract leaks, sglang#22862 family): a retracted request frees exactly its
    uncached KV ``[cache_protected_len, ceil(kv_allocated_len))`` — nothing enters the cache,
    its prefix lock is dropped, its row returns — and it comes back with every KV field reset."""
    engine = _decoding_engine(page_size, cache)
    mem, batch = engine.mem, engine.scheduler.running_batch
    victim = batch.reqs[retract_order(batch.reqs)[-1]]
    held = paging.held_len(victim.kv_allocated_len, victim.cache_protected_len, page_size)
    row, free, evicted = victim.req_pool_idx, mem.allocator.available_size(), mem.evicted_tokens
    tree = (mem.tree_cache.evictable_size(), mem.tree_cache.protected_size())
    retracted, _ = retract_decode(batch, mem, engine.scheduler.policy, retract_decode_steps=0)
    assert retracted == [victim] and victim not in batch.reqs
    assert mem.evicted_tokens == evicted
    assert mem.allocator.available_size() - free == held
    unlocked = tree[1] - mem.tree_cache.protected_size()  # its prefix lock dropped ...
    assert mem.tree_cache.evictable_size() - tree[0] == unlocked  # ... nothing inserted or evicted
    assert row in mem.req_to_token_pool.free_rows and victim.req_pool_idx is None
    assert (victim.kv_committed_len, victim.kv_allocated_len, victim.cache_protected_len) == (
        0,
        0,
        0,
    )
    assert victim.is_retracted and victim.retraction_count == 1 and len(victim.prefix_indices) == 0
    check_accounting(engine.state_view("step"))


def test_last_running_request_is_never_retracted() -> None:
    """With one request left, retract stops (SGLang's corner case) and the request stays."""
    engine = _decoding_engine(1, "radix")
    batch = engine.scheduler.running_batch
    batch.keep([0])
    kept = batch.reqs[0]
    retracted, _ = retract_decode(ScheduleBatch([kept]), engine.mem, engine.scheduler.policy, 20)
    assert retracted == [] and kept.req_pool_idx is not None


def test_lone_request_retract_needs_only_room_for_its_next_decode() -> None:
    """Regression (found by the engine stateful test): a forced retract with one request left
    and no free page succeeds — retracting nothing — while that request's next decode step
    needs no new page (its last page has room); SGLang's ``available_size() > 0`` assert would
    stop the engine here."""
    engine = _decoding_engine(16, "chunk")  # the chunk cache holds nothing evictable
    batch = engine.scheduler.running_batch
    kept = next(r for r in batch.reqs if r.kv_allocated_len % 16)
    engine.mem.allocator.alloc(engine.mem.allocator.available_size())  # the pool is now full
    retracted, _ = retract_decode(ScheduleBatch([kept]), engine.mem, engine.scheduler.policy, 20)
    assert retracted == [] and kept.req_pool_idx is not None


def test_lone_request_retract_fails_when_its_next_decode_cannot_fit() -> None:
    """With one request left, no free slot and nothing evictable, the next decode step cannot
    run: retract raises KVOutOfMemory naming the request."""
    engine = _decoding_engine(1, "chunk")
    kept = engine.scheduler.running_batch.reqs[0]
    engine.mem.allocator.alloc(engine.mem.allocator.available_size())
    with pytest.raises(KVOutOfMemory, match=kept.rid):
        retract_decode(ScheduleBatch([kept]), engine.mem, engine.scheduler.policy, 20)


def test_new_token_ratio_after_retract_is_the_survivors_estimate() -> None:
    """new ratio = (decoded + retract_decode_steps × survivors) / (Σ max_new + 1), at most 1."""
    engine = _decoding_engine(1, "radix")
    batch = engine.scheduler.running_batch
    _, ratio = retract_decode(batch, engine.mem, engine.scheduler.policy, retract_decode_steps=20)
    decoded = sum(len(r.output_ids) for r in batch.reqs)
    max_new = sum(r.sampling_params.max_new_tokens for r in batch.reqs)
    assert ratio == pytest.approx(min(1.0, (decoded + 20 * len(batch.reqs)) / (max_new + 1)))


def test_retracted_request_resumes_and_finishes_without_leak() -> None:
    """A retracted request re-prefills ``origin + output`` (matching whatever the cache holds),
    finishes with its full completion, and the pool is whole again at idle."""
    engine = _decoding_engine(4, "radix")
    sched = engine.scheduler
    retracted, _ = retract_decode(sched.running_batch, engine.mem, sched.policy, 20)
    for req in retracted:
        sched.waiting_queue.append(req)
    engine.run_until_idle()
    for req in retracted:
        result = engine.results[req.rid]
        assert result.completion_tokens == req.sampling_params.max_new_tokens
    view = engine.state_view("idle")
    check_accounting(view)
    full = view.pools[0]
    assert (
        full.free + full.evictable == full.capacity
        and full.protected == 0
        and full.request_owned == 0
    )


def test_double_release_is_an_error() -> None:
    """``release_kv_cache`` is the single release entry point and runs once per request: a
    second release (here after a retract) raises instead of freeing twice."""
    engine = _decoding_engine(1, "radix")
    batch = engine.scheduler.running_batch
    victim = batch.reqs[retract_order(batch.reqs)[-1]]
    engine.mem.release_kv_cache(victim, is_insert=False)
    free = engine.mem.allocator.available_size()
    with pytest.raises(KVAccountingError):
        engine.mem.release_kv_cache(victim, is_insert=False)
    with pytest.raises(KVAccountingError):
        victim.pop_committed_kv_cache()
    assert engine.mem.allocator.available_size() == free
