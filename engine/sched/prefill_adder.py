"""PrefillAdder: which waiting requests join the next prefill batch, and how much of each
(SGLang ``managers/schedule_policy.py::PrefillAdder``).

Keeps: the admitted requests fit the memory that is free or evictable, minus what the running
requests are still expected to decode (``new_token_ratio`` × their remaining tokens) and one
page of slack per request; a truncated chunk is page aligned (``paging.chunk_len``); at most
one request of a batch is a truncated chunked prefill, and none is started while another is
in flight (INV-CHUNKED-SINGLE).

Budgets (all in tokens):
    rem_total_tokens = free + evictable − rem_total_token_offset   (prompt + decode headroom)
    cur_rem_tokens   = free + evictable − cur_rem_token_offset     (this batch's prompts)
    rem_input_tokens = max_prefill_tokens − (mixed decode tokens) − admitted prompts
    rem_chunk_tokens = chunked_prefill_size − (mixed decode tokens) − admitted prompts
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from engine.mem import paging
from engine.memory import KVMemory
from engine.request import Req


class AddReqResult(enum.Enum):
    CONTINUE = "continue"  # admitted (or not), budget remains: try the next request
    NO_TOKEN = "no_token"  # out of KV memory: stop, the running batch is full
    OTHER = "other"  # prefill budget spent (or a chunk cannot be started): stop


class PrefillAdder:
    """One scheduling round's admission state; ``can_run_list`` is the result."""

    def __init__(
        self,
        mem: KVMemory,
        running_reqs: Sequence[Req],
        new_token_ratio: float,
        rem_input_tokens: int,
        rem_chunk_tokens: int | None,
        mixed_with_decode_tokens: int = 0,
        clip_max_new_tokens: int = 4096,
    ) -> None:
        self.mem = mem
        self.page_size = mem.page_size
        self.new_token_ratio = new_token_ratio
        self.clip = clip_max_new_tokens
        self.rem_input_tokens = rem_input_tokens - mixed_with_decode_tokens
        self.rem_chunk_tokens = (
            None if rem_chunk_tokens is None else rem_chunk_tokens - mixed_with_decode_tokens
        )
        self.rem_total_token_offset: float = mixed_with_decode_tokens
        self.cur_rem_token_offset: float = mixed_with_decode_tokens
        self.rem_total_token_offset += sum(self._running_headroom(r) for r in running_reqs)
        self.can_run_list: list[Req] = []
        self.new_chunked_req: Req | None = None
        self.deferred = False  # the in-flight chunk could not continue this round
        self.log_hit_tokens = 0
        self.log_input_tokens = 0
        self.charged_tokens = 0  # what the admitted prompts may allocate (sched/estimate.py)

    def _running_headroom(self, req: Req) -> float:
        remaining = req.sampling_params.max_new_tokens - len(req.output_ids)
        return min(remaining, self.clip) * self.new_token_ratio

    def _max_new(self, req: Req) -> int:
        return min(req.sampling_params.max_new_tokens, self.clip)

    @property
    def rem_total_tokens(self) -> float:
        return self.mem.admittable_size() - self.rem_total_token_offset

    @property
    def cur_rem_tokens(self) -> float:
        return self.mem.admittable_size() - self.cur_rem_token_offset

    def budget_state(self) -> AddReqResult:
        if self.rem_total_tokens <= 0 or self.cur_rem_tokens <= 0:
            return AddReqResult.NO_TOKEN
        if self.rem_input_tokens <= 0 or (
            self.rem_chunk_tokens is not None and self.rem_chunk_tokens <= 0
        ):
            return AddReqResult.OTHER
        return AddReqResult.CONTINUE

    def _update_prefill_budget(
        self, prefix_len: int, extend_input_len: int, max_new_tokens: int
    ) -> None:
        """Charge one admitted (part of a) prompt: page-ceiled tokens, decode headroom, a page
        of slack (``alloc_extend`` may open a page per request)."""
        extend = paging.ceil_align(extend_input_len, self.page_size)
        self.rem_total_token_offset += extend + max_new_tokens + self.page_size
        self.cur_rem_token_offset += extend + self.page_size
        self.charged_tokens += extend + self.page_size
        self.rem_input_tokens -= extend
        if self.rem_chunk_tokens is not None:
            self.rem_chunk_tokens -= extend
        self.log_hit_tokens += prefix_len
        self.log_input_tokens += extend

    def add_chunked_req(self, req: Req) -> Req | None:
        """Continue the in-flight chunked request; returns it while it stays truncated.
        With no budget left it still takes a full chunk (its KV is released only when it
        finishes) — but never more than the pool can give it now (the rest of its last page,
        then page-floored free plus evictable): SGLang asserts a continuing chunk fits; where
        nothing would, the chunk is ``deferred`` a round (it keeps its row and KV) while the
        decode step runs, retracts or finishes requests."""
        assert self.rem_chunk_tokens is not None, (
            "a chunked request exists only with chunked prefill on"
        )
        rem = min(self.rem_chunk_tokens, int(self.rem_total_tokens))
        if rem <= 0:
            rem = self.rem_chunk_tokens
        prefix, ps = len(req.prefix_indices), self.page_size
        room = (
            paging.ceil_align(prefix, ps)
            - prefix
            + paging.floor_align(self.mem.admittable_size(), ps)
        )  # the rest of its last page, then whole free or evictable pages
        rem = min(rem, room)
        if rem <= 0:
            self.deferred = True
            req.fill_ids = req.fill_ids[:prefix]  # what its KV holds
            return req
        truncated = req.extend_input_len > rem
        req.extend_input_len = min(req.extend_input_len, rem)
        req.fill_ids = req.fill_ids[: len(req.prefix_indices) + req.extend_input_len]
        self.can_run_list.append(req)
        self._update_prefill_budget(0, req.extend_input_len, 0 if truncated else self._max_new(req))
        return req if truncated else None

    @contextmanager
    def _lock_node(self, req: Req) -> Iterator[None]:
        """Pin the matched prefix while the budget is re-read: it must not count as evictable."""
        cache = self.mem.tree_cache
        handle = cache.inc_lock_ref(req.last_node)
        try:
            yield
        finally:
            cache.dec_lock_ref(req.last_node, handle)

    def add_one_req(self, req: Req, has_chunked_req: bool) -> AddReqResult:
        """Admit ``req`` whole, or its first page-aligned chunk, if the budgets allow (a
        request row included: streaming-session slots hold rows between turns)."""
        if (
            req.req_pool_idx is None
            and self._rows_needed() >= self.mem.req_to_token_pool.available_size()
        ):
            return AddReqResult.OTHER
        ps = self.page_size
        total_tokens = req.extend_input_len + self._max_new(req) + ps
        input_tokens = paging.ceil_align(req.extend_input_len, ps)
        if total_tokens >= self.rem_total_tokens:
            return AddReqResult.NO_TOKEN
        if input_tokens >= self.rem_input_tokens and self.can_run_list:
            return AddReqResult.OTHER
        with self._lock_node(req):
            if total_tokens >= self.rem_total_tokens:  # the lock may have shrunk the evictable part
                return AddReqResult.NO_TOKEN
            if self.rem_chunk_tokens is None or input_tokens <= self.rem_chunk_tokens:
                self._admit(req, req.extend_input_len, self._max_new(req))
                return self.budget_state()
            # INV-CHUNKED-SINGLE: one truncated prefill per batch and in flight
            if has_chunked_req or self.new_chunked_req is not None:
                return AddReqResult.OTHER
            trunc_len = paging.chunk_len(self.rem_chunk_tokens, ps)
            if trunc_len <= 0:
                return AddReqResult.OTHER
            req.extend_input_len = trunc_len
            req.fill_ids = req.fill_ids[: len(req.prefix_indices) + trunc_len]
            self.new_chunked_req = req
            self._admit(req, trunc_len, 0)
        return self.budget_state()

    def _rows_needed(self) -> int:
        """Rows the admitted requests take at prefill (a restored turn brings its own)."""
        return sum(r.req_pool_idx is None for r in self.can_run_list)

    def _admit(self, req: Req, extend_len: int, max_new_tokens: int) -> None:
        self.can_run_list.append(req)
        self.mem.lock(req)
        self._update_prefill_budget(len(req.prefix_indices), extend_len, max_new_tokens)
