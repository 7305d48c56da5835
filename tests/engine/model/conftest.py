"""A minimal scheduler over real allocator slots that drives the sim model.

It builds ForwardBatches exactly as runner.py's contract states (rows written before the
forward, positions prefix_len .. seq_len - 1) so tests can run correct sequences, then plant
one bug (a freed slot, a wrong row entry) and see what the model reports.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from engine.mem.allocator import PagedAllocator, SWAAllocator, TokenAllocator
from engine.mem.req_to_token import ReqToTokenPool
from engine.model.fingerprint import KVFingerprints
from engine.model.runner import ForwardBatch, ForwardMode, ForwardOutput
from engine.model.sim import SimModel
from engine.request import Req


class SimDriver:
    """Requests advance by ``extend`` (chunks) and ``decode``; ``kv_committed_len`` is the
    KV a request holds. Sampled tokens are appended to ``output_ids`` (only by the last
    chunk of an extend)."""

    def __init__(
        self,
        *,
        page_size: int = 1,
        size: int = 512,
        swa_size: int | None = None,
        window: int | None = None,
        seed: int = 0,
        eos_prob: float = 0.0,
        rows: int = 16,
        width: int = 1100,
    ) -> None:
        self.page_size = page_size
        if swa_size is not None:
            self.alloc: PagedAllocator | SWAAllocator = SWAAllocator(size, swa_size, page_size)
        elif page_size == 1:
            self.alloc = TokenAllocator(size)
        else:
            self.alloc = PagedAllocator(size, page_size)
        self.pool = ReqToTokenPool(rows, width)
        self.kv = KVFingerprints.for_allocator(self.alloc, window)
        self.sim = SimModel(seed, self.kv, eos_prob=eos_prob)
        self.logprob_start: dict[str, int] = {}

    def add(self, rid: str, prompt: Sequence[int]) -> Req:
        req = Req(rid, list(prompt))
        req.req_pool_idx = self.pool.alloc()
        return req

    def slot(self, req: Req, position: int) -> int:
        assert req.req_pool_idx is not None
        return int(self.pool.req_to_token[req.req_pool_idx, position])

    def share_prefix(self, req: Req, donor: Req, length: int) -> None:
        """What a prefix-cache hit does: ``req`` reads ``donor``'s first ``length`` slots."""
        assert length % self.page_size == 0 and req.req_pool_idx is not None
        self.pool.write(req.req_pool_idx, 0, self.pool.read(donor.req_pool_idx, 0, length))
        req.kv_committed_len = length

    def extend(self, chunks: Sequence[tuple[Req, int]]) -> ForwardOutput:
        """Extend each request by up to ``n`` tokens of ``origin + output``."""
        reqs = [r for r, _ in chunks]
        prefix = [r.kv_committed_len for r in reqs]
        seq = [min(p + n, r.seqlen) for (r, n), p in zip(chunks, prefix)]
        last = [self.slot(r, p - 1) if p else -1 for r, p in zip(reqs, prefix)]
        out = self.alloc.alloc_extend(prefix, seq, last)
        assert out is not None, "test pool too small"
        ids: list[int] = []
        cursor = 0
        for r, p, s in zip(reqs, prefix, seq):
            self.pool.write(r.req_pool_idx, p, out[cursor : cursor + s - p])
            ids += r.all_ids()[p:s]
            cursor += s - p
        sample = [s == r.seqlen for r, s in zip(reqs, seq)]
        return self._run(ForwardMode.EXTEND, reqs, prefix, seq, ids, out, sample)

    def decode(self, reqs: Sequence[Req], lag: int = 0) -> ForwardOutput:
        """One token per request: the last sampled one. ``lag``: ``output_ids`` misses its
        last ``lag`` tokens during the forward, as when the batch launches before earlier
        results are processed (overlap: 1)."""
        prefix = [r.kv_committed_len for r in reqs]
        assert all(p == r.seqlen - 1 for r, p in zip(reqs, prefix)), "decode needs a sampled token"
        last = [self.slot(r, p - 1) for r, p in zip(reqs, prefix)]
        out = self.alloc.alloc_decode([p + 1 for p in prefix], last)
        assert out is not None, "test pool too small"
        for r, p, loc in zip(reqs, prefix, out.tolist()):
            self.pool.write(r.req_pool_idx, p, np.array([loc]))
        ids = [r.output_ids[-1] for r in reqs]
        held = [r.output_ids[len(r.output_ids) - lag :] if lag else [] for r in reqs]
        for r in reqs:
            del r.output_ids[len(r.output_ids) - lag :]
        try:
            seq = [p + 1 for p in prefix]
            sample = [True] * len(reqs)
            return self._run(ForwardMode.DECODE, list(reqs), prefix, seq, ids, out, sample)
        finally:
            for r, toks in zip(reqs, held):
                r.output_ids[len(r.output_ids) - 1 : len(r.output_ids) - 1] = toks

    def release(self, req: Req) -> None:
        """Free the request's KV and row (finish or retract), keeping its tokens."""
        if req.kv_committed_len:
            self.alloc.free(self.pool.read(req.req_pool_idx, 0, req.kv_committed_len))
        self.pool.free(req.req_pool_idx)
        req.req_pool_idx, req.kv_committed_len = None, 0

    def readmit(self, req: Req) -> None:
        req.req_pool_idx = self.pool.alloc()

    def generate(
        self, rid: str, prompt: Sequence[int], num_tokens: int, chunk: int | None = None
    ) -> Req:
        """Prefill in chunks of ``chunk`` tokens, then decode to ``num_tokens`` outputs."""
        req = self.add(rid, prompt)
        while not req.output_ids:
            self.extend([(req, chunk or len(prompt))])
        while len(req.output_ids) < num_tokens:
            self.decode([req])
        return req

    def _run(
        self,
        mode: ForwardMode,
        reqs: list[Req],
        prefix: list[int],
        seq: list[int],
        ids: list[int],
        out: np.ndarray,
        sample: list[bool],
    ) -> ForwardOutput:
        positions = np.concatenate([np.arange(p, s) for p, s in zip(prefix, seq)])
        batch = ForwardBatch(
            mode=mode,
            reqs=reqs,
            input_ids=np.asarray(ids, dtype=np.int64),
            positions=positions,
            out_cache_loc=np.asarray(out, dtype=np.int64),
            req_pool_indices=np.array([r.req_pool_idx for r in reqs], dtype=np.int64),
            prefix_lens=np.array(prefix, dtype=np.int64),
            extend_lens=np.array(seq, dtype=np.int64) - np.array(prefix, dtype=np.int64),
            seq_lens=np.array(seq, dtype=np.int64),
            req_to_token=self.pool.req_to_token,
            return_logprob=[r.rid in self.logprob_start for r in reqs],
            logprob_start_lens=[self.logprob_start.get(r.rid, 0) for r in reqs],
            sample=sample,
        )
        result = self.sim.forward(batch)
        for r, s, tok, smp in zip(reqs, seq, result.next_token_ids.tolist(), sample):
            r.kv_committed_len = r.kv_allocated_len = s
            if smp:
                r.output_ids.append(tok)
        return result


@pytest.fixture(scope="session")
def driver() -> type[SimDriver]:
    """The driver class (session scope so Hypothesis tests may use it)."""
    return SimDriver
