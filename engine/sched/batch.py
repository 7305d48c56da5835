"""ScheduleBatch: the requests of one forward, and the KV writes that prepare it
(SGLang ``ScheduleBatch.prepare_for_extend / prepare_for_decode / mix_with_running``).

Keeps: the ForwardBatch a batch hands the model names exactly the slots the forward writes —
extend: positions ``[prefix_len, seq_len)`` of each request; decode: the one position
``kv_committed_len - 1``; mixed: the extend part, then one slot per decoding request — and
every request of a prepared batch owns a request row.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain

import numpy as np

from engine.mem.allocator import SWAAllocator
from engine.memory import KVMemory
from engine.model.runner import ForwardBatch, ForwardMode
from engine.request import Req
from engine.view import ReuseView

EXTEND_MODES = (ForwardMode.EXTEND, ForwardMode.MIXED)


@dataclass(slots=True, eq=False)
class ScheduleBatch:
    """A batch as the scheduler sees it. ``chunked_req`` is the request of this batch whose
    prefill is still truncated (it samples nothing); ``decoding_reqs`` the decode part of a
    mixed batch; ``forward`` the model input once prepared."""

    reqs: list[Req] = field(default_factory=list)
    mode: ForwardMode = ForwardMode.DECODE
    chunked_req: Req | None = None
    decoding_reqs: list[Req] | None = None
    batch_is_full: bool = False
    forward: ForwardBatch | None = None
    reused: tuple[ReuseView, ...] = ()  # extend requests that arrived with a row (reuse check)
    truncated_rids: tuple[str, ...] = ()  # extend requests prefilled only in part (a chunk)

    @property
    def is_extend(self) -> bool:
        return self.mode in EXTEND_MODES

    def is_empty(self) -> bool:
        return not self.reqs

    def batch_size(self) -> int:
        return len(self.reqs)

    def copy(self) -> ScheduleBatch:
        """What the overlap result queue keeps: the request list as it was at launch."""
        decoding = None if self.decoding_reqs is None else list(self.decoding_reqs)
        return ScheduleBatch(
            list(self.reqs), self.mode, self.chunked_req, decoding, self.batch_is_full, self.forward
        )

    def filter_batch(self, exclude: Collection[Req] = ()) -> None:
        """Drop finished requests and ``exclude`` (the in-flight chunked request)."""
        self.reqs = [r for r in self.reqs if not r.finished() and r not in exclude]

    def keep(self, indices: Sequence[int]) -> None:
        """Keep the requests at ``indices``, in that order (``filter_batch(keep_indices)``)."""
        self.reqs = [self.reqs[i] for i in indices]

    def merge_batch(self, other: ScheduleBatch) -> None:
        self.reqs = self.reqs + other.reqs

    # ---- preparation: allocate KV, build the model input ----

    def prepare_for_extend(self, mem: KVMemory) -> None:
        """Allocate rows and KV for every request's ``[prefix_len, len(fill_ids))`` and
        build the EXTEND forward (``committed = allocated = seq_len`` afterwards)."""
        self.mode = ForwardMode.EXTEND
        self.reused = tuple(
            ReuseView(r.rid, r.req_pool_idx, r.is_chunked, r.kv_committed_len)
            for r in self.reqs
            if r.req_pool_idx is not None
        )
        self.truncated_rids = tuple(r.rid for r in self.reqs if len(r.fill_ids) < r.seqlen)
        prefix_lens = [len(r.prefix_indices) for r in self.reqs]
        out = mem.alloc_for_extend(self.reqs)
        for req, prefix in zip(self.reqs, prefix_lens):
            req.prepare_for_extend(prefix)
        self.forward = extend_forward(self.reqs, prefix_lens, out, mem, self.chunked_req)

    def prepare_for_decode(self, mem: KVMemory, last_tokens: Mapping[Req, int]) -> None:
        """SWA eviction every ``sliding_window`` decode steps, then one slot per request at
        position ``kv_committed_len`` (committed and allocated +1), the DECODE forward.
        ``last_tokens`` holds each request's latest sampled token, processed or not (the
        overlap future map). With EAGLE the speculative worker prepares the step instead."""
        if mem.spec is not None:
            mem.spec.prepare_for_decode(self, last_tokens)
            return
        self.mode = ForwardMode.DECODE
        self.reused, self.truncated_rids = (), ()  # a running batch may be a former extend batch
        mem.maybe_evict_swa(self.reqs)
        out = mem.alloc_for_decode(self.reqs)
        self.forward = decode_forward(self.reqs, out, mem, last_tokens)

    def mix_with_running(self, running: ScheduleBatch) -> None:
        """Append a prepared decode batch to this prepared extend batch (mixed chunk)."""
        assert self.forward is not None and running.forward is not None
        self.mode = ForwardMode.MIXED
        self.forward = concat_forward(self.forward, running.forward)
        self.decoding_reqs = list(running.reqs)
        self.reqs = self.reqs + running.reqs

    # ---- decode memory ----

    def new_tokens_next_decode(self, page_size: int, selected: Sequence[int] | None = None) -> int:
        """Tokens the next decode step allocates: a page per request whose next position
        ``kv_allocated_len`` opens a page (SGLang ``new_page_count_next_decode`` × page)."""
        reqs = self.reqs if selected is None else [self.reqs[i] for i in selected]
        if page_size == 1:
            return len(reqs)
        return sum(page_size for r in reqs if r.kv_allocated_len % page_size == 0)

    def check_decode_mem(self, mem: KVMemory, selected: Sequence[int] | None = None) -> bool:
        """Evict as needed; whether the next decode step of (the selected) requests fits."""
        need = self.new_tokens_next_decode(mem.page_size, selected)
        if mem.spec is not None:  # EAGLE reserves its own verify window
            need = mem.spec.decode_tokens(
                self.reqs if selected is None else [self.reqs[i] for i in selected]
            )
        mem.evict_for(need)
        return mem.allocator.available_size() >= need


def extend_forward(
    reqs: Sequence[Req],
    prefix_lens: Sequence[int],
    out: np.ndarray,
    mem: KVMemory,
    chunked_req: Req | None,
) -> ForwardBatch:
    """The EXTEND input. Request i contributes tokens ``fill_ids[prefix_i : seq_i]``:

    [0, prefix_i)        cached KV, read only
    [prefix_i, seq_i)    written now at out_cache_loc (request-major)
    """
    seq_lens = [len(r.fill_ids) for r in reqs]
    extend_lens = [s - p for s, p in zip(seq_lens, prefix_lens)]
    total = sum(extend_lens)
    ids = chain.from_iterable(r.fill_ids[p:s] for r, p, s in zip(reqs, prefix_lens, seq_lens))
    positions = [np.arange(p, s, dtype=np.int64) for p, s in zip(prefix_lens, seq_lens)]
    return ForwardBatch(
        mode=ForwardMode.EXTEND,
        reqs=list(reqs),
        input_ids=np.fromiter(ids, dtype=np.int64, count=total),
        positions=np.concatenate(positions) if positions else np.empty(0, dtype=np.int64),
        out_cache_loc=out,
        req_pool_indices=_rows(reqs),
        prefix_lens=np.asarray(prefix_lens, dtype=np.int64),
        extend_lens=np.asarray(extend_lens, dtype=np.int64),
        seq_lens=np.asarray(seq_lens, dtype=np.int64),
        req_to_token=mem.req_to_token_pool.req_to_token,
        swa_out_cache_loc=_swa_loc(mem, out),
        return_logprob=[r.return_logprob for r in reqs],
        logprob_start_lens=[0] * len(reqs),
        sample=[r is not chunked_req for r in reqs],
    )


def decode_forward(
    reqs: Sequence[Req], out: np.ndarray, mem: KVMemory, last_tokens: Mapping[Req, int]
) -> ForwardBatch:
    """The DECODE input: each request's latest token at position ``committed - 1``."""
    seq_lens = np.fromiter((r.kv_committed_len for r in reqs), dtype=np.int64, count=len(reqs))
    tokens = np.fromiter((last_tokens[r] for r in reqs), dtype=np.int64, count=len(reqs))
    return ForwardBatch(
        mode=ForwardMode.DECODE,
        reqs=list(reqs),
        input_ids=tokens,
        positions=seq_lens - 1,
        out_cache_loc=out,
        req_pool_indices=_rows(reqs),
        prefix_lens=seq_lens - 1,
        extend_lens=np.ones(len(reqs), dtype=np.int64),
        seq_lens=seq_lens,
        req_to_token=mem.req_to_token_pool.req_to_token,
        swa_out_cache_loc=_swa_loc(mem, out),
        return_logprob=[r.return_logprob for r in reqs],
        logprob_start_lens=[0] * len(reqs),
        sample=[True] * len(reqs),
    )


def concat_forward(extend: ForwardBatch, decode: ForwardBatch) -> ForwardBatch:
    """The MIXED input: the extend requests' tokens, then one token per decoding request."""
    swa = None
    if extend.swa_out_cache_loc is not None and decode.swa_out_cache_loc is not None:
        swa = np.concatenate([extend.swa_out_cache_loc, decode.swa_out_cache_loc])
    cat = np.concatenate
    return ForwardBatch(
        mode=ForwardMode.MIXED,
        reqs=extend.reqs + decode.reqs,
        input_ids=cat([extend.input_ids, decode.input_ids]),
        positions=cat([extend.positions, decode.positions]),
        out_cache_loc=cat([extend.out_cache_loc, decode.out_cache_loc]),
        req_pool_indices=cat([extend.req_pool_indices, decode.req_pool_indices]),
        prefix_lens=cat([extend.prefix_lens, decode.prefix_lens]),
        extend_lens=cat([extend.extend_lens, decode.extend_lens]),
        seq_lens=cat([extend.seq_lens, decode.seq_lens]),
        req_to_token=extend.req_to_token,
        swa_out_cache_loc=swa,
        return_logprob=extend.return_logprob + decode.return_logprob,
        logprob_start_lens=extend.logprob_start_lens + decode.logprob_start_lens,
        sample=extend.sample + decode.sample,
    )


def _rows(reqs: Sequence[Req]) -> np.ndarray:
    return np.fromiter((r.req_pool_idx for r in reqs), dtype=np.int64, count=len(reqs))  # type: ignore[misc]


def _swa_loc(mem: KVMemory, out: np.ndarray) -> np.ndarray | None:
    alloc = mem.allocator
    return alloc.translate_to_swa(out) if isinstance(alloc, SWAAllocator) else None
