"""The sim model: no weights; the next token is a pure function of (seed, context), and every
forward verifies, then writes, the KV fingerprints of the tokens it reads and writes.

Keeps: (1) ``next_token(seed, context)`` does not depend on how the context reached the KV
(one extend, chunks, decodes, a cached prefix, retract and re-prefill, overlap); (2) every
slot a request reads holds ``fingerprint(token, position)`` of its own context (see
``engine/model/fingerprint.py``), else an ``IntegrityFailure`` is recorded — never raised.

Context of request i (absolute positions; ``ids = origin_input_ids + output_ids``):

    [0, prefix_len)          ids[p]            KV present before the forward: verified
    [len(ids), prefix_len)   the input_ids of  only while results lag (overlap): the
                             earlier forwards  model's own record of what it wrote there
    [prefix_len, seq_len)    batch.input_ids   KV written now (under overlap, output_ids may
                                               not yet hold the last sampled token)

Hash: ``H[0] = h0(seed)``, ``H[p+1] = H[p] * B + term(token p)`` mod 2**64 — the next token
after ``p`` tokens is ``predict(H[p])``. ``H`` is cached per rid and extended incrementally;
the cache is validated against ``ids`` on every forward (one list comparison) and rebuilt
from the first differing position, so it is an optimisation, never a source of truth.

EAGLE: a TARGET_VERIFY forward is an extend over ``[root, draft_1 .. draft_k]`` that returns
the target's token after *every* input token (``next_token_ids`` is ``[num_tokens]``), so the
caller's greedy acceptance is genuine. ``draft`` is the seeded draft: draft token ``j``
is the target's own next token after ``root, draft_1 .. draft_{j-1}`` when a coin (drawn from
that context's hash and ``stream_seed(seed, "eagle")``, never ``hash()``) falls below
``accept_prob``, else a different token; it writes no KV (the draft pool is not modelled).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from engine.model.fingerprint import (
    U64,
    IntegrityFailure,
    KVFingerprints,
    KVRead,
    fingerprint,
    splitmix64,
    splitmix64_int,
)
from engine.model.penalties import Penalties, penalized_rows, penalties_of
from engine.model.runner import ForwardBatch, ForwardMode, ForwardOutput
from engine.model.sim_context import BASE, TERM_MUL, Context, chain_hashes
from engine.model.sim_kernels import greedy_tokens
from engine.model.tokenizer import EOS_ID, NUM_BYTES, VOCAB_SIZE
from engine.request import Req

_TERM_MUL_INT, _MASK = int(TERM_MUL), (1 << 64) - 1
_LOGPROB_MUL = U64(0x27D4EB2F165667C5)
_FAILURES_PER_FORWARD = 8
_UNIT = 2.0**-53
_EMITTED = np.append(np.arange(NUM_BYTES), EOS_ID)  # the tokens predict() can return


def stream_seed(seed: int, name: str) -> int:
    """A sub-seed for subsystem ``name`` (no ``hash()``: PYTHONHASHSEED-independent)."""
    entropy = [seed, *name.encode("utf-8")]
    return int(np.random.SeedSequence(entropy).generate_state(1, dtype=np.uint64)[0])


class SimModel:
    """Deterministic fingerprinting model (docs/design.md §6: ``sim``)."""

    def __init__(
        self,
        seed: int,
        kv: KVFingerprints,
        eos_prob: float = 0.0,
        vocab_size: int = VOCAB_SIZE,
        context_cache_size: int = 256,
    ) -> None:
        if seed < 0:
            raise ValueError(f"seed={seed}: must be >= 0")
        if not 0.0 <= eos_prob <= 1.0:
            raise ValueError(f"eos_prob={eos_prob}: must be in [0, 1]")
        if vocab_size < VOCAB_SIZE:
            raise ValueError(
                f"vocab_size={vocab_size}: must hold the byte tokenizer ({VOCAB_SIZE})"
            )
        self.seed, self.kv, self.eos_prob, self.vocab_size = seed, kv, eos_prob, vocab_size
        self.context_cache_size = context_cache_size
        keys = np.random.SeedSequence(seed).generate_state(4, dtype=np.uint64)
        self._h0, self._key_token, self._key_eos, self._key_logprob = (U64(k) for k in keys)
        self._key_draft = U64(stream_seed(seed, "eagle"))
        self._contexts: OrderedDict[str, Context] = OrderedDict()  # LRU by rid
        self.integrity_failures: list[IntegrityFailure] = []
        self.num_integrity_failures = 0  # every failing read ever seen (uncapped)

    # -- the pure model ------------------------------------------------------------

    def context_hash(self, token_ids: list[int] | np.ndarray) -> np.uint64:
        """``H`` of a whole context (what ``predict`` takes)."""
        toks = np.asarray(token_ids, dtype=np.int64)
        if len(toks) == 0:
            return self._h0
        return chain_hashes(np.array([self._h0]), np.array([len(toks)]), toks)[-1]

    def predict(self, hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(next token, its logprob) for each context hash: a byte, or EOS with
        probability ``eos_prob`` (both drawn from the hash, so deterministic)."""
        h = np.asarray(hashes, dtype=U64)
        byte = (splitmix64(h ^ self._key_token) % U64(NUM_BYTES)).astype(np.int64)
        coin = (splitmix64(h ^ self._key_eos) >> U64(11)).astype(np.float64) * _UNIT
        tokens = np.where(coin < self.eos_prob, EOS_ID, byte)
        return tokens, self.token_logprobs(h, tokens)

    def reference(self, prompt: Sequence[int], n: int, like: Req | None = None) -> list[int]:
        """The token oracle's reference: the ``n`` greedy tokens after ``prompt`` (under the
        penalties of request ``like``), each a function of the context alone (nothing cached,
        nothing scheduled). ``predict`` and the hash step in Python ints: one token at a
        time, numpy would cost ~50x more."""
        penalties = Penalties.of(like) if like is not None else None
        h = int(self.context_hash(list(prompt)))
        if penalties is None:  # the same loop, compiled (sim_kernels.py)
            keys = (U64(h), U64(self._key_token), U64(self._key_eos))
            return greedy_tokens(*keys, self.eos_prob, n).tolist()
        tokens = list[int]()
        key_token, key_eos = int(self._key_token), int(self._key_eos)
        for _ in range(n):
            coin = float(splitmix64_int(h ^ key_eos) >> 11) * _UNIT
            token = EOS_ID if coin < self.eos_prob else splitmix64_int(h ^ key_token) % NUM_BYTES
            token = penalties.pick(self.scores(U64(h), token), tokens)
            tokens.append(token)
            h = (h * BASE + (token + 1) * _TERM_MUL_INT) & _MASK
        return tokens

    def scores(self, h: np.uint64, top: int) -> np.ndarray:
        """The scores behind ``predict`` after the context hashed ``h``, for the penalizers:
        each token the model emits (a byte, EOS) scores its synthetic logprob (below -1e-3),
        the predicted token ``top`` 0, so unpenalized it is the argmax; the others -inf."""
        out = np.full(self.vocab_size, -np.inf)
        out[_EMITTED] = self.token_logprobs(np.full(len(_EMITTED), h, dtype=U64), _EMITTED)
        out[top] = 0.0
        return out

    def token_logprobs(self, hashes: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """Synthetic logprob of ``tokens[i]`` after the context hashed ``hashes[i]``:
        a deterministic float in ``[-log(vocab_size) - 1e-3, -1e-3]``."""
        mix = np.asarray(tokens).astype(U64) * _LOGPROB_MUL ^ self._key_logprob
        mixed = splitmix64(np.asarray(hashes, dtype=U64) ^ mix)
        unit = (mixed >> U64(11)).astype(np.float64) * _UNIT
        return -(1e-3 + unit * math.log(self.vocab_size))

    # -- the forward -----------------------------------------------------------------

    def forward(self, batch: ForwardBatch) -> ForwardOutput:
        """Verify the KV every request reads, write the new KV, predict the next tokens."""
        contexts = self.shadow(batch)
        hashes = self._output_hashes(batch, contexts)
        tokens, logprobs = self.predict(hashes)
        penalties = penalties_of(batch.reqs)
        if penalties is not None:
            self._penalize(batch, contexts, penalties, hashes, tokens, logprobs)
        return ForwardOutput(tokens, logprobs, self._input_logprobs(batch, contexts))

    def _penalize(
        self,
        batch: ForwardBatch,
        contexts: list[Context],
        penalties: list[Penalties | None],
        hashes: np.ndarray,
        tokens: np.ndarray,
        logprobs: np.ndarray,
    ) -> None:
        """Re-pick each output of a penalized request from its penalized scores, in place
        (a verify's output after input ``p`` sees the drafts before ``p`` as output)."""
        for row, pen, output in penalized_rows(batch, penalties, lambda i: contexts[i].ids):
            tokens[row] = pen.pick(self.scores(hashes[row], int(tokens[row])), output)
            logprobs[row] = self.token_logprobs(hashes[row : row + 1], tokens[row : row + 1])[0]

    def shadow(self, batch: ForwardBatch) -> list[Context]:
        """The KV half of a forward: verify what every request reads, write the fingerprints
        of what it writes, then verify the rows name the slots written. Another model runs
        this beside its own forward to have its KV reads checked (the tiny model does)."""
        if batch.mode is ForwardMode.DRAFT_EXTEND:
            raise ValueError("sim model: a DRAFT_EXTEND batch goes to draft(), not forward()")
        firsts = self._check_batch(batch)
        contexts = self._sync_contexts(batch)
        budget = _FAILURES_PER_FORWARD
        budget -= self._verify(batch, self._reads(batch, contexts, False), budget)  # verify ...
        fps = fingerprint(batch.input_ids, batch.positions)
        self.kv.write(batch.out_cache_loc, fps, batch.swa_out_cache_loc)  # ... then write
        self._append_inputs(batch, contexts, fps, firsts)
        self._verify(batch, self._reads(batch, contexts, True), budget)
        return contexts

    def _output_hashes(self, batch: ForwardBatch, contexts: list[Context]) -> np.ndarray:
        """The context hash each output token is predicted from: after the last input token
        of each request, or (TARGET_VERIFY) after every input token."""
        if batch.mode is not ForwardMode.TARGET_VERIFY:
            return np.array([c.hashes[c.length] for c in contexts], dtype=U64)
        spans = zip(contexts, batch.prefix_lens.tolist(), batch.seq_lens.tolist())
        return np.concatenate([c.hashes[p + 1 : s + 1] for c, p, s in spans]).astype(U64)

    def draft(self, batch: ForwardBatch, num_steps: int, accept_prob: float) -> np.ndarray:
        """EAGLE's seeded draft: ``[bs, num_steps]`` tokens after each request's root token
        (a DRAFT_EXTEND batch: one token per request at ``prefix_len``). Reads and writes no
        KV; the context is the request's (results not yet processed: this model's record)."""
        if batch.mode is not ForwardMode.DRAFT_EXTEND:
            raise ValueError(
                f"sim model: draft() takes a DRAFT_EXTEND batch, not {batch.mode.value}"
            )
        self._check_batch(batch)
        contexts = self._sync_contexts(batch)
        ones = np.ones(batch.batch_size, dtype=np.int64)
        h = chain_hashes(
            np.array([c.hashes[c.length] for c in contexts], dtype=U64),
            ones,
            batch.input_ids[np.cumsum(batch.extend_lens) - 1],
        )
        out = np.empty((batch.batch_size, num_steps), dtype=np.int64)
        for j in range(num_steps):
            target, _ = self.predict(h)
            mixed = splitmix64(h ^ self._key_draft)
            coin = (mixed >> U64(11)).astype(np.float64) * _UNIT
            other = (
                target + 1 + (splitmix64(mixed) % U64(NUM_BYTES - 1)).astype(np.int64)
            ) % NUM_BYTES
            out[:, j] = np.where(coin < accept_prob, target, other)
            h = chain_hashes(h, ones, out[:, j])
        return out

    def take_integrity_failures(self) -> list[IntegrityFailure]:
        """The failures recorded since the last call (first 8 per forward); clears them."""
        failures, self.integrity_failures = self.integrity_failures, []
        return failures

    def _check_batch(self, batch: ForwardBatch) -> np.ndarray:
        """Raise on a batch that breaks the ForwardBatch contract; segment starts."""
        ext, prefix = batch.extend_lens, batch.prefix_lens
        n = int(ext.sum()) if len(ext) else 0
        sizes = {len(batch.input_ids), len(batch.positions), len(batch.out_cache_loc)}
        if sizes != {n} or len(prefix) != batch.batch_size or len(ext) != batch.batch_size:
            raise ValueError(
                f"ForwardBatch: token arrays {sorted(sizes)} long, sum(extend_lens)={n}"
            )
        if not np.array_equal(batch.seq_lens, prefix + ext):
            raise ValueError("ForwardBatch: seq_lens != prefix_lens + extend_lens")
        if n and int(batch.seq_lens.max()) > batch.req_to_token.shape[1]:
            raise ValueError("ForwardBatch: a seq_len exceeds the req_to_token row width")
        firsts = np.cumsum(ext) - ext
        if not np.array_equal(batch.positions, np.arange(n) - np.repeat(firsts - prefix, ext)):
            raise ValueError("ForwardBatch: positions are not prefix_len .. seq_len-1 per request")
        if n and (int(batch.input_ids.min()) < 0 or int(batch.input_ids.max()) >= self.vocab_size):
            raise ValueError(f"ForwardBatch: input id outside [0, {self.vocab_size})")
        return firsts

    def _sync_contexts(self, batch: ForwardBatch) -> list[Context]:
        """Each request's cached context, made exactly ``ids[0:prefix_len]``."""
        contexts: list[Context] = []
        seen: dict[str, Context] = {}
        for req, prefix in zip(batch.reqs, batch.prefix_lens.tolist()):
            ctx = self._contexts.pop(req.rid, None) if req.rid not in seen else None
            ctx = ctx if ctx is not None else Context.empty(self._h0, prefix + 64)
            self._sync(ctx, req, prefix)
            seen[req.rid] = ctx
            contexts.append(ctx)
        self._contexts.update(seen)  # re-inserted last: the least recently used go first
        while len(self._contexts) > max(self.context_cache_size, len(seen)):
            self._contexts.popitem(last=False)
        return contexts

    def _sync(self, ctx: Context, req: Req, prefix_len: int) -> None:
        """Make ``ctx`` exactly ``ids[0:prefix_len]``. Positions past ``len(ids)`` (results
        not yet processed, overlap) keep the tokens this model itself wrote there."""
        ids = req.origin_input_ids + req.output_ids
        keep = ctx.matching_len(ids, min(prefix_len, len(ids)))
        if keep == len(ids) < prefix_len <= ctx.length:
            keep = prefix_len
        elif keep < prefix_len and len(ids) < prefix_len:
            raise ValueError(f"req {req.rid}: prefix_len {prefix_len} > {len(ids)} known tokens")
        ctx.truncate(keep)
        if keep < prefix_len:  # first use, or the context changed: rebuild from ``keep``
            toks = np.asarray(ids[keep:prefix_len], dtype=np.int64)
            hashes = chain_hashes(ctx.hashes[keep : keep + 1], np.array([len(toks)]), toks)
            fps = fingerprint(toks, np.arange(keep, prefix_len))
            ctx.append(toks, fps, hashes, toks.tolist())

    def _append_inputs(
        self, batch: ForwardBatch, contexts: list[Context], fps: np.ndarray, firsts: np.ndarray
    ) -> None:
        h0 = np.array([c.hashes[c.length] for c in contexts], dtype=U64)
        hashes = chain_hashes(h0, batch.extend_lens, batch.input_ids)
        ids = batch.input_ids.tolist()
        for ctx, a, n in zip(contexts, firsts.tolist(), batch.extend_lens.tolist()):
            ctx.append(
                batch.input_ids[a : a + n], fps[a : a + n], hashes[a : a + n], ids[a : a + n]
            )

    def _reads(self, batch: ForwardBatch, contexts: list[Context], written: bool) -> list[KVRead]:
        """What each request reads: its prefix (before the write), or the positions just
        written (after it: the row must name the slots ``out_cache_loc`` filled)."""
        reads = []
        rows, prefixes = batch.req_pool_indices.tolist(), batch.prefix_lens.tolist()
        for req, ctx, row, prefix, seq in zip(
            batch.reqs, contexts, rows, prefixes, batch.seq_lens.tolist()
        ):
            if written:
                reads.append(KVRead(req.rid, row, prefix, seq, prefix, ctx.fps))
            else:
                swa_start = self.kv.swa_read_start(prefix)
                reads.append(KVRead(req.rid, row, 0, prefix, swa_start, ctx.fps))
        return reads

    def _verify(self, batch: ForwardBatch, reads: list[KVRead], budget: int) -> int:
        """Record the failing reads (at most ``budget``); returns the number recorded."""
        failures, total = self.kv.verify(batch.req_to_token, reads, limit=budget)
        self.integrity_failures += failures
        self.num_integrity_failures += total
        return len(failures)

    def _input_logprobs(
        self, batch: ForwardBatch, contexts: list[Context]
    ) -> list[np.ndarray | None]:
        """Logprob of each written token ``p >= logprob_start_len`` given ``[0, p)``;
        concatenated over chunks it equals the logprobs of one whole extend."""
        wants = batch.return_logprob or [False] * batch.batch_size
        starts = batch.logprob_start_lens or [0] * batch.batch_size
        out: list[np.ndarray | None] = []
        spans = zip(batch.prefix_lens.tolist(), batch.seq_lens.tolist())
        for want, start, ctx, (prefix, seq) in zip(wants, starts, contexts, spans):
            a = max(prefix, start)
            out.append(self.token_logprobs(ctx.hashes[a:seq], ctx.tokens[a:seq]) if want else None)
        return out
