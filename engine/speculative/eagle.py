"""EAGLE speculative decoding, top-1 chain, in SGLang's two versions: the decode step's
reservation (``prepare_for_decode``), draft + target verify + greedy acceptance
(``forward``: the device side) and the commit of the accepted tokens (``process``: the CPU
side, SGLang's ``verify`` bookkeeping in v1, ``_resolve_spec_overlap_token_ids`` in v2).

Keeps: lossless greedy decoding — the target decides every token (accepted drafts equal its
own predictions, the bonus is its next token), so output with speculation equals output
without; the accounting of engine/speculative/accounting.py; the device state
(``SpecState.seq_len``) runs ahead of ``kv_committed_len`` by at most the one round in flight
(v2) and never in v1; a finished request holds no over-allocation when it is released.

One round of a request (``L`` = device seq_len, ``n`` = num_draft_tokens):

    [0, L)           accepted KV: read by the verify
    L                the root (the last sampled token; its KV is written now)
    [L + 1, L + n)   drafts d_1 .. d_{n-1}: target KV written now (over-allocation)
    the target predicts p_0 .. p_{n-1}; ``a`` = leading j with d_j == p_{j-1}; the round
    yields p_0 .. p_a (d_1 .. d_a and the bonus p_a); [L + a + 1, L + n) is rejected

v1 (no overlap): prepare reserves [c, c + n); process appends the tokens one by one until
the request finishes (tokens past the finish are dropped), ``committed += appended``
(``accepted + 1``), allocated trimmed to committed (page-aligned free of the rejected tail).
v2 (overlap): prepare reserves up to ``c + 2 * alloc_len`` and pre-claims the bonus slot
(``committed += 1``, #22651); process adds ``accept_len - 1`` and appends every token; a
finishing request (its extra round already ran) is trimmed back to ``origin + finished_len``
before release (#22897, #22900).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from engine.config import EngineConfig
from engine.config.speculative import SpecConfig
from engine.mem.allocator import SWAAllocator
from engine.memory import KVMemory
from engine.model.runner import ForwardBatch, ForwardMode, ForwardOutput, ModelRunner
from engine.request import Req
from engine.sched.batch import ScheduleBatch
from engine.speculative import accounting
from engine.speculative.drafters import SpecState, make_drafter
from engine.view import ReqView, StateView


@dataclass(slots=True, eq=False)
class SpecOutput(ForwardOutput):
    """A verify's result: ``next_token_ids`` holds each request's bonus token (the next
    root), ``tokens`` every token the round yields (accepted drafts + bonus)."""

    tokens: list[list[int]] = field(default_factory=list)


class EagleWorker:
    """The speculative worker of one scheduler (SGLang ``EAGLEWorker`` / ``EAGLEWorkerV2``)."""

    def __init__(
        self,
        spec: SpecConfig,
        mem: KVMemory,
        runner: ModelRunner,
        stats: Any,
        release: Callable[[Req], None],
    ) -> None:
        self.spec, self.mem, self.runner, self.stats, self.release = (
            spec,
            mem,
            runner,
            stats,
            release,
        )
        self.drafter = make_drafter(runner, spec)
        self.states: dict[str, SpecState] = {}  # by rid: prefilled requests (finished: pruned)
        self.accept_hist = [0] * (spec.num_steps + 1)  # verifies by accepted draft count
        mem.spec = self  # ScheduleBatch asks it to size and prepare decode steps
        pool = mem.req_to_token_pool  # rows must hold the reservation past the context
        pool.widen(pool.max_context_len + 2 * spec.alloc_len)

    @classmethod
    def maybe(
        cls,
        config: EngineConfig,
        mem: KVMemory,
        runner: ModelRunner,
        stats: Any,
        release: Callable[[Req], None],
    ) -> EagleWorker | None:
        """The worker when ``config.speculative`` is set (``release``: the scheduler's)."""
        if config.speculative is None:
            return None
        return cls(config.speculative, mem, runner, stats, release)

    @property
    def mode(self) -> str:
        return f"v{self.spec.version}"

    # ---- scheduling (CPU) ----

    def decode_tokens(self, reqs: Sequence[Req]) -> int:
        """Tokens the next decode step of ``reqs`` allocates (``check_decode_mem``)."""
        s = self.spec
        targets = accounting.reserve_targets(reqs, s.version, s.num_draft_tokens, s.alloc_len)
        return accounting.tokens_for_targets(reqs, targets, self.mem.page_size)

    def prepare_for_decode(self, batch: ScheduleBatch, last_tokens: Mapping[Req, int]) -> None:
        """Reserve each request's verify window, pre-claim the bonus (v2), evict SWA KV
        that slid out of the window, and build the draft batch (roots at device seq_len)."""
        s, mem = self.spec, self.mem
        batch.mode = ForwardMode.DECODE
        batch.reused, batch.truncated_rids = (), ()
        reqs = batch.reqs
        mem.maybe_evict_swa(reqs)  # first, as SGLang's _draft_preprocess_decode
        accounting.extend_allocation(
            mem, reqs, accounting.reserve_targets(reqs, s.version, s.num_draft_tokens, s.alloc_len)
        )
        if s.version == 2:
            for req in reqs:
                accounting.preclaim_bonus(req)
        batch.forward = self._draft_batch(reqs, last_tokens)

    def _draft_batch(self, reqs: Sequence[Req], last_tokens: Mapping[Req, int]) -> ForwardBatch:
        """DRAFT_EXTEND: each request's root token at its seq_len — v1: the committed length
        (SGLang's batch.seq_lens); v2: the worker's (the GPU's, one round ahead of the CPU)."""
        bs, v1 = len(reqs), self.spec.version == 1
        seq = np.fromiter(
            (r.kv_committed_len if v1 else self.states[r.rid].seq_len for r in reqs),
            dtype=np.int64,
            count=bs,
        )
        roots = np.fromiter((last_tokens[r] for r in reqs), dtype=np.int64, count=bs)
        return self._batch(ForwardMode.DRAFT_EXTEND, reqs, roots, seq, 1)

    def _batch(
        self,
        mode: ForwardMode,
        reqs: Sequence[Req],
        ids: np.ndarray,
        prefix: np.ndarray,
        width: int,
    ) -> ForwardBatch:
        """``width`` tokens per request at positions ``[prefix, prefix + width)`` (slots from
        the rows: the reservation)."""
        bs, table = len(reqs), self.mem.req_to_token_pool.req_to_token
        rows = np.fromiter((r.req_pool_idx for r in reqs), dtype=np.int64, count=bs)  # type: ignore[misc]
        positions = (prefix[:, None] + np.arange(width)).ravel()
        out = table[np.repeat(rows, width), positions].astype(np.int64)
        alloc = self.mem.allocator
        swa = alloc.translate_to_swa(out) if isinstance(alloc, SWAAllocator) else None
        return ForwardBatch(
            mode=mode,
            reqs=list(reqs),
            input_ids=ids,
            positions=positions,
            out_cache_loc=out,
            req_pool_indices=rows,
            prefix_lens=prefix,
            extend_lens=np.full(bs, width, dtype=np.int64),
            seq_lens=prefix + width,
            req_to_token=table,
            swa_out_cache_loc=swa,
            return_logprob=[False] * bs,
            logprob_start_lens=[0] * bs,
            sample=[True] * bs,
        )

    # ---- device side ----

    def forward(self, batch: ScheduleBatch) -> ForwardOutput:
        """Extend: the target forward, then the device state of every sampled request.
        Decode: draft, target verify over ``[root, drafts]``, greedy acceptance."""
        fb = batch.forward
        assert fb is not None
        if batch.is_extend:
            out = self.runner.forward(fb)
            self.states = {rid: s for rid, s in self.states.items() if not s.req.finished()}
            for i, (req, sample) in enumerate(zip(fb.reqs, fb.sample)):
                if sample:
                    hidden = None if out.hidden_states is None else out.hidden_states[i]
                    self.states[req.rid] = SpecState(req, int(fb.seq_lens[i]), 0, hidden)
            return out
        states = [self.states[r.rid] for r in fb.reqs]
        drafts = self.drafter.propose(fb, states, self.spec.num_steps)
        ids = np.concatenate([fb.input_ids[:, None], drafts], axis=1).ravel()
        batch.forward = self._batch(
            ForwardMode.TARGET_VERIFY, fb.reqs, ids, fb.prefix_lens, self.spec.num_draft_tokens
        )
        return self._accept(drafts, self.runner.forward(batch.forward), states, fb.prefix_lens)

    def _accept(
        self, drafts: np.ndarray, out: ForwardOutput, states: list[SpecState], prefix: np.ndarray
    ) -> SpecOutput:
        """Greedy acceptance: the leading drafts equal to the target's predictions, then
        the bonus (the target's token after the last accepted one)."""
        bs, n = len(states), self.spec.num_draft_tokens
        preds = out.next_token_ids.reshape(bs, n)
        match = np.concatenate([drafts == preds[:, :-1], np.zeros((bs, 1), dtype=bool)], axis=1)
        accepted = np.argmin(match, axis=1)  # index of the first mismatch = accepted drafts
        for i, (state, a, start) in enumerate(zip(states, accepted.tolist(), prefix.tolist())):
            state.seq_len = start + a + 1
            state.accept_len = a + 1
            if out.hidden_states is not None:
                state.hidden = out.hidden_states[i * n + a]
            self.accept_hist[a] += 1
        self.stats.spec_accept_hist = tuple(self.accept_hist)
        rows = np.arange(bs)
        tokens = [preds[i, : a + 1].tolist() for i, a in enumerate(accepted.tolist())]
        logprobs = out.next_token_logprobs.reshape(bs, n)[rows, accepted]
        return SpecOutput(preds[rows, accepted], logprobs, tokens=tokens)

    # ---- results (CPU) ----

    def process(self, batch: ScheduleBatch, out: ForwardOutput) -> None:
        """Commit each request's round; release the finished ones."""
        assert isinstance(out, SpecOutput)
        for req, tokens in zip(batch.reqs, out.tokens):
            if req.is_retracted or req.finished():  # v2: retracted or finished meanwhile
                continue
            if self.spec.version == 1:
                self._commit_v1(req, tokens)
            else:
                self._resolve_v2(req, tokens)
            if req.finished():
                self.states.pop(req.rid, None)
                self.release(req)

    def _commit_v1(self, req: Req, tokens: list[int]) -> None:
        """SGLang v1 ``verify``: append until finished, commit what was appended (the
        accepted drafts and the root's KV), trim the reservation to it."""
        start = len(req.output_ids)
        for token in tokens:
            req.output_ids.append(token)
            req.check_finished()
            if req.finished():
                break
        req.kv_committed_len += len(req.output_ids) - start
        accounting.trim_allocation(self.mem, req, req.kv_committed_len)

    def _resolve_v2(self, req: Req, tokens: list[int]) -> None:
        """SGLang ``_resolve_spec_overlap_token_ids`` (after #22651): the bonus slot was
        pre-claimed, so ``accept_len - 1`` more; every token is appended, then checked."""
        accounting.resolve_accepted(req, len(tokens))
        start = len(req.output_ids)
        req.output_ids.extend(tokens)
        accounting.check_finished_each(req, start)

    def before_release(self, req: Req) -> None:
        """A finished request gives back what it reserved past its API-visible tokens
        (v2: the overshoot and the extra round; v1 holds no reservation by then)."""
        if self.spec.version == 2 and req.finished():
            accounting.trim_overshoot(self.mem, req)

    # ---- view ----

    def annotate(self, view: StateView) -> StateView:
        """The view with the speculative fields: mode and sizes, each row holder's device
        seq_len and last accept length."""
        s = self.spec
        sched = replace(
            view.sched,
            spec_mode=self.mode,
            num_draft_tokens=s.num_draft_tokens,
            spec_alloc_len=s.alloc_len,
        )
        return replace(view, sched=sched, reqs=tuple(self._req_view(r) for r in view.reqs))

    def _req_view(self, r: ReqView) -> ReqView:
        state = self.states.get(r.rid)
        if state is None or r.req_pool_idx < 0 or state.req.finished():  # a rid reused later
            return r
        return r._replace(
            spec_seq_len=state.seq_len, spec_accept_len=state.accept_len
        )  # a NamedTuple
