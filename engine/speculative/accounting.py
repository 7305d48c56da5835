"""EAGLE's KV accounting on the memory layer: the decode-step reservation of each version,
the page-aligned trim of the rejected tail, and the v2 overshoot trim at finish.

Keeps: ``kv_committed_len <= kv_allocated_len`` throughout; every free starts at
``ceil(committed)`` (never inside the page that holds committed KV, #22862), so a trimmed
request keeps ``[committed, ceil(committed))`` attached to its row (the next round reuses
those slots) and owns nothing past ``ceil(kv_allocated_len)``; after a trim ``committed ==
allocated`` and ``swa_evicted_seqlen <= committed`` (#22900).

Reservation of one decode step, positions of request r (``c`` = committed, ``A`` = alloc_len,
``n`` = num_draft_tokens):

    v1  [c, c + n)                      the verify window (the draft's steps lie inside it);
                                        after the verify: committed += accepted + 1 (the
                                        bonus), allocated trimmed to committed
    v2  [allocated, c + 2A)             SGLang ``x = c + 2A - allocated``: the window of the
                                        in-flight round plus this one (committed lags the
                                        device by one unresolved round); committed += 1 (the
                                        bonus slot, pre-claimed) now, += accept_len - 1 when
                                        the result resolves
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.errors import KVAccountingError, KVOutOfMemory
from engine.mem import paging
from engine.memory import KVMemory
from engine.request import Req


def reserve_targets(
    reqs: Sequence[Req], version: int, num_draft_tokens: int, alloc_len: int
) -> list[int]:
    """The ``kv_allocated_len`` each request needs before its next verify (never less than
    what it holds)."""
    if version == 1:
        return [max(r.kv_allocated_len, r.kv_committed_len + num_draft_tokens) for r in reqs]
    return [max(r.kv_allocated_len, r.kv_committed_len + 2 * alloc_len) for r in reqs]


def tokens_for_targets(reqs: Sequence[Req], targets: Sequence[int], page_size: int) -> int:
    """Fresh tokens (whole pages) an allocation up to ``targets`` takes (SGLang
    ``_new_tokens_required_next_decode_spec_v2``: Σ ceil(nxt) - ceil(cur))."""
    return sum(
        paging.ceil_align(t, page_size) - paging.ceil_align(r.kv_allocated_len, page_size)
        for r, t in zip(reqs, targets)
    )


def extend_allocation(mem: KVMemory, reqs: Sequence[Req], targets: Sequence[int]) -> None:
    """Allocate positions ``[kv_allocated_len, target)`` of each request (the partial last
    page first, then fresh pages), write them into the rows, raise ``kv_allocated_len``.

        [0, allocated)          held already
        [allocated, target)     reserved now (over-allocation: no KV written yet)
    """
    pool, ps = mem.req_to_token_pool, mem.page_size
    cur = [r.kv_allocated_len for r in reqs]
    rows = [r.req_pool_idx for r in reqs]
    if any(row is None for row in rows):
        raise KVAccountingError("a speculative decode request has no request row")
    last_locs = [int(pool.req_to_token[row, c - 1]) if c > 0 else -1 for row, c in zip(rows, cur)]
    mem.evict_for(tokens_for_targets(reqs, targets, ps))
    out = mem.allocator.alloc_extend(cur, list(targets), last_locs)
    if out is None:
        raise KVOutOfMemory(f"speculative decode reservation for {len(reqs)} requests does not fit")
    cursor = 0
    for req, row, c, t in zip(reqs, rows, cur, targets):
        pool.write(row, c, out[cursor : cursor + t - c])  # type: ignore[arg-type]
        cursor += t - c
        req.kv_allocated_len = t


def trim_allocation(mem: KVMemory, req: Req, new_len: int) -> None:
    """Give back the reservation past ``new_len`` (which becomes committed and allocated):

    [0, new_len)                kept (committed)
    [new_len, ceil(new_len))    kept: same page as committed KV, reused next round
    [ceil(new_len), allocated)  freed (rejected drafts, unused reservation)
    """
    if req.req_pool_idx is None or new_len > req.kv_committed_len:
        raise KVAccountingError(
            f"req {req.rid}: trim to {new_len} beyond committed {req.kv_committed_len}"
        )
    start, end = paging.tail_free_range(new_len, req.kv_allocated_len, mem.page_size)
    if start < end:
        mem.allocator.free(mem.req_to_token_pool.read(req.req_pool_idx, start, end))
    req.kv_committed_len = req.kv_allocated_len = new_len
    req.swa_evicted_seqlen = min(req.swa_evicted_seqlen, new_len)


def commit_appended(mem: KVMemory, req: Req, appended: int) -> None:
    """v1 verify: the round committed the KV of the tokens it appended (the root's and the
    accepted drafts', ``accepted + 1`` unless the request finished first); the reservation is
    trimmed to it."""
    req.kv_committed_len += appended
    trim_allocation(mem, req, req.kv_committed_len)


def trim_overshoot(mem: KVMemory, req: Req) -> None:
    """A v2 request finishes with everything its last verify accepted: cut it back to the
    tokens the API returns (SGLang ``_trim_overshoot``, #22897): ``target = origin +
    finished_len``; KV, output and the SWA cursor (#22900) end there. When the SWA cursor
    already passed the target, the target is floored to a page so the cursor stays page
    aligned (SGLang 0.5.23 refinement; the partial page is simply not cached)."""
    finished_len = req.finished_len if req.finished_len is not None else len(req.output_ids)
    target = len(req.origin_input_ids) + finished_len
    if req.swa_evicted_seqlen > target:
        target = paging.floor_align(target, mem.page_size)
    trim_allocation(mem, req, min(req.kv_committed_len, target))
    del req.output_ids[finished_len:]


def preclaim_bonus(req: Req) -> None:
    """v2 prepare: the round's root KV (the bonus of the round before) is written by this
    round, so its slot counts as committed now, as in normal overlap decode (#22651)."""
    req.kv_committed_len += 1


def resolve_accepted(req: Req, accept_len: int) -> None:
    """v2 resolve (``_resolve_spec_overlap_token_ids``): the round committed the KV of its
    root and its accepted drafts — ``accept_len`` positions (accepted drafts + 1) — and the
    root's slot was pre-claimed at prepare, so ``accept_len - 1`` more."""
    req.kv_committed_len += accept_len - 1


def check_finished_each(req: Req, start: int) -> None:
    """SGLang's ``check_finished(new_accepted_len)``: the finish condition is checked after
    each token of ``output_ids[start:]`` in turn; the tokens after the finishing one stay
    in ``output_ids`` (v2 overshoot, cut by ``trim_overshoot``)."""
    tail = req.output_ids[start:]
    del req.output_ids[start:]
    for i, token in enumerate(tail):
        req.output_ids.append(token)
        req.check_finished()
        if req.finished():
            req.output_ids.extend(tail[i + 1 :])
            return
