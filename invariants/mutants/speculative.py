"""EAGLE bugs: #22651 (bonus lag), #22897 (overshoot trim), #22900 (SWA cursor), #22862's
speculative source, and three accounting slips of the verify round, each as the pre-fix body
of one function of engine/speculative/.

Keeps: each buggy body is the fixed function with exactly the pre-fix behaviour put back.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.mem import paging
from engine.memory import KVMemory
from engine.request import Req
from engine.speculative import accounting
from engine.speculative.eagle import EagleV1
from invariants.mutants.base import Mutant, ids, swap


def no_bonus_preclaim(req: Req) -> None:
    """Pre-#22651 v2 prepare: the window is reserved, the bonus slot not counted."""


def resolve_whole_accept_len(req: Req, accept_len: int) -> None:
    """Pre-#22651 v2 resolve: the whole ``accept_len`` is added when the result is
    processed (the finished request's last round never resolves: committed lags by one)."""
    req.kv_committed_len += accept_len  # fix: accept_len - 1 (the bonus pre-claimed)


def no_overshoot_trim(mem: KVMemory, req: Req) -> None:
    """Pre-#22897: a finishing v2 request keeps everything its last verify accepted —
    committed and allocated past ``origin + finished_len``, output uncut."""


def trim_leaving_swa_cursor(mem: KVMemory, req: Req) -> None:
    """#22897's trim before #22900: free ``[ceil(target), allocated)``, cap committed and
    allocated at ``target`` — and leave the SWA cursor where it was. (No trace puts the
    cursor past the target in kvspec: the zoo plants it, invariants/mutants/planted.py.)"""
    finished_len = req.finished_len if req.finished_len is not None else len(req.output_ids)
    target = min(req.kv_committed_len, len(req.origin_input_ids) + finished_len)
    start, end = paging.tail_free_range(target, req.kv_allocated_len, mem.page_size)
    if start < end:
        mem.allocator.free(mem.req_to_token_pool.read(req.req_pool_idx, start, end))  # type: ignore[arg-type]
    req.kv_committed_len = req.kv_allocated_len = target
    # fix: req.swa_evicted_seqlen = min(req.swa_evicted_seqlen, target)
    del req.output_ids[finished_len:]


def tail_never_freed(committed_len: int, allocated_len: int, ps: int) -> tuple[int, int]:
    """#22862, speculative source: a release under a reservation frees nothing past
    committed (the draft slots leak)."""
    return allocated_len, allocated_len  # fix: (ceil_align(committed_len, ps), allocated_len)


def reserve_one_window(
    reqs: Sequence[Req], version: int, num_draft_tokens: int, alloc_len: int
) -> list[int]:
    """v2 reserving one verify window (``committed + alloc_len``) instead of two: the
    in-flight round's accepted tokens push the next verify past the allocation."""
    return [
        max(r.kv_allocated_len, r.kv_committed_len + alloc_len) for r in reqs
    ]  # fix: 2 * alloc_len


def trim_without_free(mem: KVMemory, req: Req, new_len: int) -> None:
    """A v1 verify trim that lowers ``kv_allocated_len`` without freeing the rejected tail."""
    req.kv_committed_len = req.kv_allocated_len = (
        new_len  # fix: free [ceil(new_len), allocated) first
    )


def commit_v1_ahead(self: EagleV1, req: Req, tokens: list[int], logprobs: list[float]) -> None:
    """A v1 commit that counts the first rejected draft's position as committed: the CPU
    runs one token ahead of the verified KV."""
    start = len(req.output_ids)
    for token, logprob in zip(tokens, logprobs):
        req.append_output(token, logprob)
        req.check_finished()
        if req.finished():
            break
    rejected = not req.finished() and len(tokens) < self.spec.num_draft_tokens
    appended = len(req.output_ids) - start
    accounting.commit_appended(self.mem, req, appended + rejected)  # fix: no "+ rejected"


MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "22651-bonus-lag",
        "sglang#22651",
        "v2 prepare does not pre-claim the bonus slot; resolve adds the whole accept_len",
        lambda: swap(
            accounting,
            "preclaim_bonus",
            no_bonus_preclaim,
            (accounting, "resolve_accepted", resolve_whole_accept_len),
        ),
        "22651-bonus-lag.yaml",
        ids("spec.overalloc_bounded", "spec.committed_tracks_device"),
    ),
    Mutant(
        "22897-overshoot-untrimmed",
        "sglang#22897",
        "a finishing v2 turn keeps the KV of tokens past finished_len",
        lambda: swap(accounting, "trim_overshoot", no_overshoot_trim),
        "22897-overshoot-untrimmed.yaml",
        ids(
            "req.committed_eq_allocated_at_release",
            "req.finished_commits_only_returned_tokens",
            "session.slot_within_last_turn",
        ),
    ),
    Mutant(
        "22862-spec-tail-leak",
        "sglang#22862",
        "a retracted EAGLE request's reservation past committed is never freed",
        lambda: swap(paging, "tail_free_range", tail_never_freed),
        "22862-spec-tail-leak.yaml",
        ids("pool.busy_sum", "census.no_orphans"),
    ),
    Mutant(
        "eagle-v2-one-window",
        "docs/sglang.md §2.4 spec v2 allocation",
        "v2 reserves committed + alloc_len instead of committed + 2 * alloc_len",
        lambda: swap(accounting, "reserve_targets", reserve_one_window),
        "eagle-v2-one-window.yaml",
        ids("spec.verify_window_allocated"),
    ),
    Mutant(
        "eagle-v1-trim-leak",
        "docs/design.md decision 8",
        "the v1 verify trim lowers allocated without freeing the rejected drafts",
        lambda: swap(accounting, "trim_allocation", trim_without_free),
        "eagle-v1-trim-leak.yaml",
        ids("pool.busy_sum"),
    ),
    Mutant(
        "eagle-v1-commit-ahead",
        "docs/design.md decision 8",
        "the v1 commit counts the first rejected draft as committed",
        lambda: swap(EagleV1, "_commit", commit_v1_ahead),
        "eagle-v1-commit-ahead.yaml",
        ids("spec.committed_tracks_device"),
    ),
)
