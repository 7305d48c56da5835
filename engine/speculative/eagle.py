"""EAGLE speculative decoding, top-1 chain, in SGLang's two versions, as the scheduler's decode
policy (engine/sched/decode.py): the decode step's reservation (``prepare_decode``), draft +
target verify + greedy acceptance (``forward``: the device side) and the commit of the
accepted tokens (``process_decode``: the CPU side, SGLang's ``verify`` bookkeeping in v1
(``EagleV1``), ``_resolve_spec_overlap_token_ids`` in v2 (``EagleV2``)).

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

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from engine.config import EngineConfig, SpecConfig
from engine.mem.allocator import SWAAllocator
from engine.memory import KVMemory
from engine.model.runner import ForwardBatch, ForwardMode, ForwardOutput, ModelRunner
from engine.request import Release, Req
from engine.speculative import accounting
from engine.speculative.drafters import SpecState, make_drafter


@dataclass(slots=True, eq=False)
class SpecOutput(ForwardOutput):
    """A verify's result: ``next_token_ids`` holds each request's bonus token (the next
    root), ``tokens`` every token the round yields (accepted drafts + bonus), ``logprobs``
    the target's logprob of each of them (from the verify's logits, as SGLang returns)."""

    tokens: list[list[int]] = field(default_factory=list)
    logprobs: list[list[float]] = field(default_factory=list)


class EagleWorker(ABC):
    """The speculative worker of one scheduler (SGLang ``EAGLEWorker`` / ``EAGLEWorkerV2``):
    what both versions share. ``make`` picks the version."""

    spec_mode: str  # the version's: v1 | v2
    mixes_chunks = False  # SGLang never mixes a prefill chunk into a speculative decode

    def __init__(self, spec: SpecConfig, mem: KVMemory, runner: ModelRunner) -> None:
        self.spec, self.mem, self.runner = spec, mem, runner
        self.num_draft_tokens, self.alloc_len = spec.num_draft_tokens, spec.alloc_len
        self.drafter = make_drafter(runner, spec)
        self.states: dict[str, SpecState] = {}  # by rid: prefilled requests (finished: pruned)
        self.verifies = [0] * (spec.num_steps + 1)  # by accepted draft count

    @staticmethod
    def make(config: EngineConfig, mem: KVMemory, runner: ModelRunner) -> EagleWorker:
        """The worker of ``config.speculative``'s version (it must be set)."""
        spec = config.speculative
        assert spec is not None
        return (EagleV1 if spec.version == 1 else EagleV2)(spec, mem, runner)

    @property
    def accept_hist(self) -> tuple[int, ...]:
        return tuple(self.verifies)

    # ---- scheduling (CPU) ----

    def decode_tokens(self, reqs: Sequence[Req]) -> int:
        """Tokens the next decode step of ``reqs`` allocates (``check_decode_mem``)."""
        return accounting.tokens_for_targets(reqs, self._targets(reqs), self.mem.page_size)

    def _targets(self, reqs: Sequence[Req]) -> list[int]:
        s = self.spec
        return accounting.reserve_targets(reqs, s.version, s.num_draft_tokens, s.alloc_len)

    def prepare_decode(self, reqs: Sequence[Req], last_tokens: Mapping[Req, int]) -> ForwardBatch:
        """Evict SWA KV that slid out of the window, reserve each request's verify window,
        and build the draft batch (roots at the version's seq_len)."""
        self.mem.maybe_evict_swa(reqs)  # first, as SGLang's _draft_preprocess_decode
        accounting.extend_allocation(self.mem, reqs, self._targets(reqs))
        self._after_reserve(reqs)
        return self._draft_batch(reqs, last_tokens)

    def _after_reserve(self, reqs: Sequence[Req]) -> None:
        return None

    @abstractmethod
    def _root_seq_len(self, req: Req) -> int:
        """The position of a request's root token in the draft batch."""

    def _draft_batch(self, reqs: Sequence[Req], last_tokens: Mapping[Req, int]) -> ForwardBatch:
        """DRAFT_EXTEND: each request's root token at its seq_len."""
        bs = len(reqs)
        seq = np.fromiter((self._root_seq_len(r) for r in reqs), dtype=np.int64, count=bs)
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
        rows = np.fromiter((r.req_pool_idx for r in reqs), dtype=np.int64, count=bs)
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

    def forward(self, batch: ForwardBatch) -> ForwardOutput:
        """Extend: the target forward, then the device state of every sampled request.
        Decode: draft, target verify over ``[root, drafts]``, greedy acceptance."""
        if batch.mode.is_extend:
            return self._extend(batch)
        states = [self.states[r.rid] for r in batch.reqs]
        drafts = self.drafter.propose(batch, states, self.spec.num_steps)
        ids = np.concatenate([batch.input_ids[:, None], drafts], axis=1).ravel()
        verify = self._batch(
            ForwardMode.TARGET_VERIFY, batch.reqs, ids, batch.prefix_lens, self.num_draft_tokens
        )
        return self._accept(drafts, self.runner.forward(verify), states, batch.prefix_lens)

    def _extend(self, batch: ForwardBatch) -> ForwardOutput:
        out = self.runner.forward(batch)
        self.states = {rid: s for rid, s in self.states.items() if not s.req.finished()}
        for i, (req, sample) in enumerate(zip(batch.reqs, batch.sample)):
            if sample:
                hidden = None if out.hidden_states is None else out.hidden_states[i]
                self.states[req.rid] = SpecState(req, int(batch.seq_lens[i]), 0, hidden)
        return out

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
            self.verifies[a] += 1
        rows = np.arange(bs)
        tokens = [preds[i, : a + 1].tolist() for i, a in enumerate(accepted.tolist())]
        every = out.next_token_logprobs.reshape(bs, n)
        logprobs = [every[i, : a + 1].tolist() for i, a in enumerate(accepted.tolist())]
        return SpecOutput(
            preds[rows, accepted], every[rows, accepted], tokens=tokens, logprobs=logprobs
        )

    # ---- results (CPU) ----

    def process_decode(self, reqs: Sequence[Req], out: ForwardOutput, release: Release) -> None:
        """Commit each request's round; release the finished ones."""
        assert isinstance(out, SpecOutput)
        for req, tokens, logprobs in zip(reqs, out.tokens, out.logprobs):
            if req.is_retracted or req.finished():  # v2: retracted or finished meanwhile
                continue
            self._commit(req, tokens, logprobs)
            if req.finished():
                self.states.pop(req.rid, None)
                release(req)

    @abstractmethod
    def _commit(self, req: Req, tokens: list[int], logprobs: list[float]) -> None:
        """Apply one verify's tokens (and their logprobs) to the request and its KV
        lengths."""

    def before_release(self, req: Req) -> None:
        return None  # v1 holds no reservation past committed by then

    def spec_state(self, req: Req) -> tuple[int, int] | None:
        """The worker's verified seq_len and last accept length of a row holder (none for a
        request that finished, or a rid reused later)."""
        state = self.states.get(req.rid)
        if state is None or req.req_pool_idx is None or state.req.finished():
            return None
        return state.seq_len, state.accept_len


class EagleV1(EagleWorker):
    """SGLang's spec v1 (no overlap): the verify window ``[c, c + n)`` is reserved per
    round and trimmed back to what was committed after it."""

    spec_mode = "v1"

    def _root_seq_len(self, req: Req) -> int:
        return req.kv_committed_len  # SGLang's batch.seq_lens

    def _commit(self, req: Req, tokens: list[int], logprobs: list[float]) -> None:
        """SGLang v1 ``verify``: append until finished, commit what was appended (the
        accepted drafts and the root's KV), trim the reservation to it."""
        start = len(req.output_ids)
        for token, logprob in zip(tokens, logprobs):
            req.append_output(token, logprob)
            req.check_finished()
            if req.finished():
                break
        accounting.commit_appended(self.mem, req, len(req.output_ids) - start)


class EagleV2(EagleWorker):
    """SGLang's spec v2 (overlap): two windows reserved, the bonus slot pre-claimed at
    prepare, the round resolved one iteration later, the overshoot trimmed at finish."""

    spec_mode = "v2"

    def _after_reserve(self, reqs: Sequence[Req]) -> None:
        for req in reqs:
            accounting.preclaim_bonus(req)

    def _root_seq_len(self, req: Req) -> int:
        return self.states[req.rid].seq_len  # the GPU's, one round ahead of the CPU

    def _commit(self, req: Req, tokens: list[int], logprobs: list[float]) -> None:
        """SGLang ``_resolve_spec_overlap_token_ids`` (after #22651): the bonus slot was
        pre-claimed, so ``accept_len - 1`` more; every token is appended, then checked."""
        accounting.resolve_accepted(req, len(tokens))
        start = len(req.output_ids)
        for token, logprob in zip(tokens, logprobs):
            req.append_output(token, logprob)
        accounting.check_finished_each(req, start)

    def before_release(self, req: Req) -> None:
        """A finished request gives back what it reserved past its API-visible tokens: the
        overshoot and the extra round."""
        if req.finished():
            accounting.trim_overshoot(self.mem, req)
