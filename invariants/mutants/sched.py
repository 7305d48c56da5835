"""Scheduler and memory-path bugs: the retract and abort leaks of the scheduler's regression
tests (#22273), the paged over-free of #22862 and an SWA window off by a page (§2.9 U13),
each as the pre-fix body of one engine function; and an SWA slide that forgets the batch
still in flight under overlap. (The single-chunked-request rule is a zoo
entry of its own: #20476's pool assert, a checker false positive, in
invariants/mutants/__init__.py.)

Keeps: each buggy body is the fixed function with exactly the pre-fix behaviour put back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engine.mem import paging
from engine.request import Req
from engine.sched import retract, wedge
from engine.sched.decode import PlainDecode
from engine.sched.scheduler import Scheduler
from invariants.mutants.base import Mutant, ids, swap

REAL_RELEASE_KV = retract.release_kv
REAL_EVICT_CURSOR = paging.swa_evict_cursor
REAL_SCHED_RELEASE = Scheduler._release


def retract_inserting(mem: Any, req: Req, is_insert: bool, released: list[Any]) -> None:
    """A retract that releases with ``is_insert=True``: the unfinished request's KV goes
    into the tree as if it had finished (the sums stay balanced, the tree just grows)."""
    REAL_RELEASE_KV(mem, req, True, released)  # fix: is_insert as given (False)


def abort_not_released(self: Scheduler, req: Req) -> None:
    """#22273: a running request finished by an abort is retired without releasing its
    row and KV."""
    if req.finished_reason is not None and req.finished_reason.kind == "abort":
        self._retire(req)  # fix: release_kv first, like every other finish
        return
    REAL_SCHED_RELEASE(self, req)


def tail_free_from_floor(committed_len: int, allocated_len: int, ps: int) -> tuple[int, int]:
    """#22862's paged hazard: the over-allocated tail freed from ``floor(committed)``, which
    frees the page that still holds committed KV."""
    return committed_len // ps * ps, allocated_len  # fix: ceil_align(committed_len, ps)


def cursor_into_window(
    swa_evicted_len: int, protected_len: int, seq_len: int, window: int, ps: int
) -> int:
    """§2.9 U13's off-by-one window, on the eviction side: the cursor slides one page further
    than SGLang's ``floor(seq_len - window - ps)``, so the page holding position
    ``seq_len - window`` — the first key the next query reads — is freed at every page size."""
    return REAL_EVICT_CURSOR(swa_evicted_len, protected_len, seq_len + 2 * ps, window, ps)


def slide_on_next_length(
    swa_evicted_len: int, protected_len: int, seq_len: int, window: int, ps: int
) -> int:
    """The window slid on the length the next batch will have (``seq_len + 1``), as if the
    batch in flight were done: at page size 1 the page slack is gone and the first key the
    launched, unprocessed batch still reads is freed under it (overlap only; without overlap
    no read ever touches it, so every other rule passes)."""
    return REAL_EVICT_CURSOR(swa_evicted_len, protected_len, seq_len + 1, window, ps)


def decode_pages_floored(self: PlainDecode, reqs: Sequence[Req]) -> int:
    """The decode estimate one page short at the exact page boundary (the reuse-aware
    scheduler of TensorRT-LLM once was): the pages the next token needs counted as
    ``(len + 1) // ps - len // ps`` — floor for ceil — so a page is charged when the token
    fills one, not when it opens one. At page size 1 nothing changes."""
    ps = self.mem.page_size
    return sum(ps * ((r.kv_allocated_len + 1) // ps - r.kv_allocated_len // ps) for r in reqs)


def reclaim_claimed(s: Any) -> bool:
    """A wedge breaker that reports a relief it did not make (#27024's wedge behind a breaker
    that only says it acted): no slot is reclaimed, yet every wedged iteration counts as
    progress, so the engine's own stall bound (two empty iterations) never trips and the
    scheduler spins with every turn waiting."""
    return s.mem.streaming is not None and bool(s.waiting_queue)


MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "retract-inserts-kv",
        "docs/sglang.md §2.4 release order",
        "a retract releases with is_insert=True: unfinished KV is cached as if finished",
        lambda: swap(retract, "release_kv", retract_inserting),
        "retract-inserts-kv.yaml",
        ids("req.release_insert_iff_finished"),
    ),
    Mutant(
        "22273-abort-not-released",
        "sglang#22273",
        "a running request finished by an abort is retired without a release",
        lambda: swap(Scheduler, "_release", abort_not_released),
        "22273-abort-not-released.json",
        ids("req.finished_released"),
    ),
    Mutant(
        "22862-tail-free-from-floor",
        "sglang#22862",
        "the over-allocated tail is freed from floor(committed): the committed page twice",
        lambda: swap(paging, "tail_free_range", tail_free_from_floor),
        "22862-tail-free-from-floor.yaml",
        ids("pool.busy_sum", "census.free_list_unique"),
    ),
    Mutant(
        "u13-swa-cursor-into-window",
        "docs/sglang.md §2.9 U13",
        "the SWA eviction cursor slides one page into the window the next query reads",
        lambda: swap(paging, "swa_evict_cursor", cursor_into_window),
        "u13-swa-cursor-into-window.yaml",
        ids("kv.integrity", "req.swa_evicted_outside_window"),
    ),
    Mutant(
        "overlap-swa-slide-next-length",
        "issue 17 item 6 (a batch in flight is an owner)",
        "the SWA window slides on the next batch's length while the launched batch still reads",
        lambda: swap(paging, "swa_evict_cursor", slide_on_next_length),
        "overlap-swa-slide-next-length.yaml",
        ids("sched.inflight_reads_held"),
    ),
    Mutant(
        "decode-estimate-page-short",
        "issue 32 item 3 (TensorRT-LLM's reuse-aware scheduler, one page short)",
        "the decode estimate counts a page when the next token fills one, not when it opens one",
        lambda: swap(PlainDecode, "decode_tokens", decode_pages_floored),
        "decode-estimate-page-short.yaml",
        ids("sched.allocation_within_estimate"),
    ),
    Mutant(
        "wedge-relief-claimed",
        "sglang#27024 (issue 32 item 2: a stalled run named in bounded time)",
        "the wedge breaker counts a relief without reclaiming a slot: the scheduler spins",
        lambda: swap(wedge, "reclaim_slot", reclaim_claimed),
        "wedge-relief-claimed.yaml",
        ids("engine.stall"),
    ),
)
