"""Retract: give decode memory back by sending running requests back to the waiting queue
(SGLang ``ScheduleBatch.retract_decode`` / ``release_req``).

Keeps: a retracted request frees exactly what it held — its uncached KV
``[cache_protected_len, ceil(kv_allocated_len))`` is freed (``is_insert=False``: nothing enters
the cache), its tree lock is dropped, its row returned — through the single release entry
point, once; then every KV field is reset so the next prefill starts from nothing. The last
request of a batch is never retracted.

Deliberate difference from SGLang 0.5.11: with one request left, SGLang asserts
``available_size() > 0``; here the engine fails only if that request's next decode step does
not fit after eviction (a forced retract of a lone request mid-page, with the pool full of
evictable cache, needs nothing and must not crash).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from engine.errors import KVOutOfMemory
from engine.memory import KVMemory
from engine.request import Req
from engine.sched.batch import ScheduleBatch
from engine.sched.decode import DecodePolicy, decode_fits
from engine.sched.estimate import AllocEstimate
from engine.view import ReleasedView


class RetractResult(NamedTuple):
    """The retracted requests (victim order) and the new-token ratio to schedule with."""

    retracted: list[Req]
    new_token_ratio: float


def retract_order(reqs: list[Req]) -> list[int]:
    """Indices sorted so that ``pop()`` yields the next victim: the fewest output tokens
    first, then the longest prompt (docs/design.md decision 12; SGLang sorts by
    ``(len(output_ids), -len(origin_input_ids))`` descending and pops from the end)."""
    order = list(range(len(reqs)))
    order.sort(
        key=lambda i: (len(reqs[i].output_ids), -len(reqs[i].origin_input_ids)), reverse=True
    )
    return order


def retract_decode(
    batch: ScheduleBatch,
    mem: KVMemory,
    policy: DecodePolicy,
    retract_decode_steps: int,
    released: list[ReleasedView] | None = None,
    reclaim: Callable[[], bool] = lambda: False,
    estimate: AllocEstimate | None = None,
) -> RetractResult:
    """Retract at least one request (if more than one runs), then more until the next decode
    step of the rest (as ``policy`` sizes it) fits; the batch keeps the survivors in
    victim-sort order. Each release is recorded in ``released`` (when given). When the last
    request alone does not fit, ``reclaim`` frees memory nothing runs on (idle session
    slots: engine/sched/wedge.py) while it can; SGLang raises there. ``estimate`` takes the
    decode check the survivors pass (sched/estimate.py)."""
    log: list[ReleasedView] = [] if released is None else released
    order = retract_order(batch.reqs)
    retracted: list[Req] = []

    def rest_fits() -> bool:
        return decode_fits(mem, policy, [batch.reqs[i] for i in order], estimate)

    first_iter = True
    while first_iter or not rest_fits():
        if len(order) == 1:
            while not rest_fits() and reclaim():
                pass
            if not rest_fits():
                raise KVOutOfMemory(
                    f"no space left for the only running request {batch.reqs[order[0]].rid}"
                )
            break
        first_iter = False
        req = batch.reqs[order.pop()]
        retracted.append(req)
        release_req(mem, req, len(order) * retract_decode_steps, log)
    batch.keep(order)
    return RetractResult(retracted, _estimate_ratio(batch.reqs, retract_decode_steps))


def release_req(mem: KVMemory, req: Req, evict_tokens: int, released: list[ReleasedView]) -> None:
    """Free the request's KV without caching it (the space is needed now), make the newly
    evictable prefix count at once, and reset the request for its next prefill."""
    release_kv(mem, req, False, released)
    mem.evict_for(evict_tokens)
    mem.reset_retracted(req)


def release_kv(mem: KVMemory, req: Req, is_insert: bool, released: list[ReleasedView]) -> None:
    """The scheduler's one way to release a request's KV: record the request as it stands
    (the view's ``sched.released``), then ``release_kv_cache`` with the same ``is_insert``."""
    released.append(
        ReleasedView(
            rid=req.rid,
            req_pool_idx=-1 if req.req_pool_idx is None else req.req_pool_idx,
            kv_committed_len=req.kv_committed_len,
            kv_allocated_len=req.kv_allocated_len,
            cache_protected_len=req.cache_protected_len,
            origin_len=len(req.origin_input_ids),
            num_output=len(req.output_ids),
            is_insert=is_insert,
            finished=req.finished(),
            finished_len=-1 if req.finished_len is None else req.finished_len,
        )
    )
    mem.release_kv_cache(req, is_insert=is_insert)


def _estimate_ratio(reqs: list[Req], retract_decode_steps: int) -> float:
    """How much of their remaining budget the survivors will decode (SGLang's estimate)."""
    decoded = sum(len(r.output_ids) for r in reqs)
    max_new = sum(r.sampling_params.max_new_tokens for r in reqs)
    return min(1.0, (decoded + retract_decode_steps * len(reqs)) / (max_new + 1))
