"""The model input of a scheduled batch: EXTEND, DECODE and MIXED ``ForwardBatch``es built from
the requests' rows (SGLang ``ScheduleBatch.get_model_worker_batch``).

Keeps: a ForwardBatch names exactly the slots its forward writes — extend: positions
``[prefix_len, seq_len)`` of each request; decode: the one position ``kv_committed_len - 1``;
mixed: the extend part, then one slot per decoding request — request-major.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import chain

import numpy as np

from engine.mem.allocator import SWAAllocator
from engine.memory import KVMemory
from engine.model.runner import ForwardBatch, ForwardMode
from engine.request import Req


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
        logprob_start_lens=[max(r.logprob_start_len, 0) for r in reqs],
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
    return np.fromiter((r.req_pool_idx for r in reqs), dtype=np.int64, count=len(reqs))


def _swa_loc(mem: KVMemory, out: np.ndarray) -> np.ndarray | None:
    alloc = mem.allocator
    return alloc.translate_to_swa(out) if isinstance(alloc, SWAAllocator) else None
