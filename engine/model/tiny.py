"""The tiny model: a small Llama-style transformer (RMSNorm, RoPE, GQA or MLA, SwiGLU,
sliding-window layers) with seeded weights, over the paged KV pools; greedy sampling.

Keeps: the next token is a function of the seed and the context only: every layer stores
the KV of the tokens it writes at ``out_cache_loc`` (sliding-window layers of a hybrid pool at
the SWA slots) and reads every other position through the request's ``req_to_token`` row —
never recomputing it — so a wrong row, a freed slot or a stale page changes the output, and
the oracle (greedy output with every cache feature on == with every feature off) sees it.
Beside the real KV runs the sim model's fingerprint shadow (``shadow``): every slot a forward
reads is checked against the token its request has there, and a failed read is a
``kv.integrity`` record naming the request, position and slot, as with the sim model.

Computed tokens of request ``b`` (absolute positions)::

    [prefix_len - 1]          the lookback token, only when the forward must return the
                              logprob of the token at ``prefix_len`` (its logits come from
                              position prefix_len - 1): recomputed, its KV is NOT stored
    [prefix_len, seq_len)     batch.input_ids: KV stored at out_cache_loc, then attended

EAGLE: a TARGET_VERIFY forward is an extend whose outputs (next token, logprob, hidden state)
are per input token, not per request; the draft is ``draft`` (engine/model/draft.py).

Logprobs: ``next_token_logprobs[b]`` = log p(sampled token | context); like the sim model,
``input_token_logprobs[b]`` holds log p(token p | tokens [0, p)) for each written position
``p >= logprob_start_len`` (so chunks concatenate to one whole extend); position 0 has no
context and gets NaN (SGLang reports None there).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import torch

from engine.config.model import TinyConfig
from engine.mem.allocator import SWAAllocator
from engine.mem.kv_pool import KVPool, MLAKVPool, SWAKVPool
from engine.model.draft import DraftNetwork, DraftOutput, self_play, self_play_slots
from engine.model.fingerprint import IntegrityFailure, KVFingerprints
from engine.model.penalties import penalties_of, repick
from engine.model.runner import ForwardBatch, ForwardMode, ForwardOutput
from engine.model.scratch import greedy
from engine.model.sim import SimModel, stream_seed
from engine.model.tiny_attn import AttnIndex, build_index, make_backend
from engine.model.tiny_layers import (
    DTYPES,
    GQAWeights,
    MLAWeights,
    TinyWeights,
    WeightInit,
    apply_rope,
    check_batch,
    one_cpu_thread,
    rms_norm,
    rope_tables,
)
from engine.model.tiny_pools import make_kv_pool, plain_kv_pool
from engine.request import Req

if TYPE_CHECKING:
    from engine.memory import KVMemory

_RECORDS = 4096  # last written span per request id, for tokens past the known ids


class _Plan(NamedTuple):
    """The computed tokens of one forward, request-major (see the module docstring)."""

    ids: np.ndarray  # int64 [M]
    positions: np.ndarray  # int64 [M]
    written: np.ndarray  # int64 [N]: index in [0, M) of batch token i (its KV is stored)
    starts: np.ndarray  # int64 [bs]: position of each request's first computed token
    qo: np.ndarray  # int64 [bs + 1]: request b computes tokens [qo[b], qo[b + 1])


class _Step(NamedTuple):
    """What every layer of one forward shares."""

    full: AttnIndex | None  # the table of full-attention layers
    window: AttnIndex | None  # the table of sliding-window layers
    full_loc: torch.Tensor  # int64 [N]: full-pool slots written
    swa_loc: torch.Tensor | None  # int64 [N]: SWA-pool slots written (hybrid pools)
    written: torch.Tensor  # int64 [N]: rows of the computed tokens whose KV is stored
    cos: torch.Tensor  # [M, rope_dim / 2]
    sin: torch.Tensor  # [M, rope_dim / 2]


class TinyModel:
    """docs/design.md §6: ``tiny``. Build with ``for_memory`` to match an engine's pools."""

    def __init__(
        self,
        cfg: TinyConfig,
        seed: int,
        pool: KVPool,
        *,
        page_size: int,
        sliding_window: int | None = None,
        full_to_swa: np.ndarray | None = None,
        shadow: SimModel | None = None,
    ) -> None:
        if cfg.window_layers and sliding_window is None:
            raise ValueError("sliding-window layers need sliding_window")
        if isinstance(pool, SWAKVPool) != (full_to_swa is not None):
            raise ValueError("a SWA pool needs full_to_swa (and only a SWA pool takes it)")
        self.cfg, self.seed, self.dtype = cfg, seed, DTYPES[cfg.dtype]
        init = WeightInit(stream_seed(seed, "tiny"), self.dtype, cfg.device)
        self.weights = TinyWeights.init(cfg, init)
        self._draft: DraftNetwork | None = None  # distilled on the first ``draft`` call
        self.pool, self.backend = pool, make_backend(cfg.backend)
        self.page_size, self.sliding_window = page_size, sliding_window
        self.full_to_swa = full_to_swa
        self.window_layers = cfg.window_layers
        self.swa_pool_layers = pool.swa_layers if isinstance(pool, SWAKVPool) else frozenset()
        self.padding_reads = 0  # table entries that named the padding page (must stay 0)
        # the sim model's fingerprints beside the real KV: every read checked (kv.integrity)
        self.shadow = shadow
        self.kv = shadow.kv if shadow is not None else None
        self._reference: TinyModel | None = None  # the token oracle's scratch twin
        self._reference_slots = 0
        self._last_written: OrderedDict[str, tuple[int, list[int]]] = OrderedDict()

    @classmethod
    def for_memory(cls, cfg: TinyConfig, mem: KVMemory, seed: int) -> TinyModel:
        """The model over fresh KV buffers shaped like ``mem``'s allocator."""
        cfg.check_memory(mem.config)
        alloc = mem.allocator
        full_to_swa = alloc.full_to_swa if isinstance(alloc, SWAAllocator) else None
        window = mem.config.sliding_window if cfg.window_layers else None
        kv = KVFingerprints.for_allocator(
            alloc, mem.config.sliding_window if full_to_swa is not None else None
        )
        return cls(
            cfg,
            seed,
            make_kv_pool(cfg, alloc),
            page_size=alloc.page_size,
            sliding_window=window,
            full_to_swa=full_to_swa,
            shadow=SimModel(seed, kv),
        )

    # -- the forward -----------------------------------------------------------------

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> ForwardOutput:
        """Store the batch's KV, attend over each request's row, sample greedily."""
        if batch.mode is ForwardMode.DRAFT_EXTEND:
            raise ValueError("tiny model: the EAGLE draft runs through draft(), not forward()")
        check_batch(batch)
        if self.shadow is not None:
            self.shadow.shadow(batch)  # the reads checked before this forward writes
        plan = self._plan(batch)
        verify = batch.mode is ForwardMode.TARGET_VERIFY  # an output after every input token
        with one_cpu_thread(self.cfg.device):
            hidden = self._hidden(batch, plan)  # [M, H], after the final norm
            last = torch.as_tensor(
                plan.written if verify else plan.qo[1:] - 1, device=hidden.device
            )
            final = hidden[last]  # [bs, H] ([num_tokens, H] when verifying)
            logp = self._log_softmax(final)  # [bs, V] float64
            best = logp.argmax(dim=-1)
            token_lp = logp.gather(-1, best[:, None])[:, 0]
            input_lps = self._input_logprobs(batch, plan, hidden)
        out = best.cpu().numpy().astype(np.int64), token_lp.cpu().numpy()
        penalties = penalties_of(batch.reqs)
        if penalties is not None:
            repick(batch, penalties, logp.cpu().numpy(), out, lambda i: self._context(batch, i))
        self._remember(batch)
        return ForwardOutput(*out, input_lps, hidden_states=final)

    def reference(self, prompt: Sequence[int], n: int, like: Req | None = None) -> list[int] | None:
        """The token oracle's reference: the ``n`` greedy tokens after ``prompt`` (under the
        penalties of request ``like``) from a scratch run of this model (same weights; torch
        backend) with nothing cached. None
        unless this model computes in float64 on the torch backend (docs/design.md decision 13:
        only then can no reduction order flip a greedy argmax)."""
        if self.cfg.dtype != "float64" or self.cfg.backend != "torch":
            return None
        need = len(prompt) + n + 1  # slot 0 is padding
        if self._reference is None or self._reference_slots < need:
            self._reference_slots = max(need, 2 * self._reference_slots)
            pool = plain_kv_pool(self.cfg, self._reference_slots, 1)
            self._reference = TinyModel(
                self.cfg, self.seed, pool, page_size=1, sliding_window=self.sliding_window
            )
        return greedy(self._reference, prompt, n, "token-oracle", like)

    def take_integrity_failures(self) -> list[IntegrityFailure]:
        """The shadow's failed reads since the last call (none without a shadow)."""
        return self.shadow.take_integrity_failures() if self.shadow is not None else []

    @torch.inference_mode()
    def draft(self, hidden: torch.Tensor, token_ids: np.ndarray | torch.Tensor) -> DraftOutput:
        """The EAGLE draft's next token after ``(hidden [n, H], token_ids [n])``."""
        with one_cpu_thread(self.cfg.device):
            return self.draft_network().draft(hidden, token_ids)

    def draft_network(self) -> DraftNetwork:
        """The draft, distilled once from this model's greedy self-play over a scratch
        pool (torch backend: the same function as any backend)."""
        if self._draft is None:
            cfg = replace(self.cfg, backend="torch")
            scratch = TinyModel(
                cfg,
                self.seed,
                plain_kv_pool(cfg, self_play_slots(), 1),
                page_size=1,
                sliding_window=self.sliding_window,
            )
            play = self_play(scratch, stream_seed(self.seed, "tiny-draft"))
            self._draft = DraftNetwork.distill(cfg, self.weights, play)
        return self._draft

    def _plan(self, batch: ForwardBatch) -> _Plan:
        """Insert each request's lookback token (if any) before its batch tokens."""
        look = self._lookback_mask(batch)  # bool [bs]
        n = len(batch.input_ids)
        written = np.arange(n, dtype=np.int64) + np.repeat(np.cumsum(look), batch.extend_lens)
        qo = np.concatenate([[0], np.cumsum(batch.extend_lens + look)]).astype(np.int64)
        ids = np.empty(n + int(look.sum()), dtype=np.int64)
        positions = np.empty_like(ids)
        ids[written], positions[written] = batch.input_ids, batch.positions
        for b in np.flatnonzero(look).tolist():
            pos = int(batch.prefix_lens[b]) - 1
            ids[qo[b]], positions[qo[b]] = self._token_at(batch.reqs[b], pos), pos
        return _Plan(ids, positions, written, batch.prefix_lens - look, qo)

    def _lookback_mask(self, batch: ForwardBatch) -> np.ndarray:
        """Requests whose first returned input logprob needs position ``prefix_len - 1``."""
        bs = batch.batch_size
        wants = batch.return_logprob or [False] * bs
        starts = batch.logprob_start_lens or [0] * bs
        prefixes = batch.prefix_lens.tolist()
        return np.array(
            [bool(w) and 0 < p and s <= p for w, s, p in zip(wants, starts, prefixes)], dtype=bool
        ).reshape(bs)

    def _token_at(self, req: Req, pos: int) -> int:
        """The token at ``pos``: from the request's ids, else (results not yet processed,
        overlap) the token this model last wrote for it."""
        origin, output = req.origin_input_ids, req.output_ids
        if pos < len(origin):
            return origin[pos]
        if pos < len(origin) + len(output):
            return output[pos - len(origin)]
        first, written = self._last_written.get(req.rid, (0, []))
        if 0 <= pos - first < len(written):
            return written[pos - first]
        raise ValueError(f"req {req.rid}: token at position {pos} is unknown for its lookback")

    def _context(self, batch: ForwardBatch, b: int) -> list[int]:
        """Request ``b``'s tokens ``[0, seq_len)``: known ids, then the batch's inputs."""
        req, prefix = batch.reqs[b], int(batch.prefix_lens[b])
        known = (req.origin_input_ids + req.output_ids)[:prefix]
        known += [self._token_at(req, p) for p in range(len(known), prefix)]
        first = int(batch.extend_lens[:b].sum())
        return known + batch.input_ids[first : first + int(batch.extend_lens[b])].tolist()

    def _remember(self, batch: ForwardBatch) -> None:
        """Each request's last written token and any written past its known ids (a prompt
        is never kept: only what results not yet processed leave unknown — a decode's
        token, a verify's span)."""
        ends, firsts = np.cumsum(batch.extend_lens).tolist(), batch.prefix_lens.tolist()
        for req, first, n, end in zip(batch.reqs, firsts, batch.extend_lens.tolist(), ends):
            known = len(req.origin_input_ids) + len(req.output_ids)
            skip = max(0, min(n - 1, known - first))  # the last token always (a lookback's)
            written = batch.input_ids[end - n + skip : end].tolist()
            self._last_written.pop(req.rid, None)
            self._last_written[req.rid] = (first + skip, written)
        while len(self._last_written) > _RECORDS:
            self._last_written.popitem(last=False)

    # -- layers ----------------------------------------------------------------------

    def _hidden(self, batch: ForwardBatch, plan: _Plan) -> torch.Tensor:
        """Embed, run every layer (storing KV), final norm: ``[M, H]``."""
        step = self._step(batch, plan)
        w, eps = self.weights, self.cfg.rms_norm_eps
        h = w.embed[torch.as_tensor(plan.ids, device=w.embed.device)]  # [M, H]
        for i, layer in enumerate(w.layers):
            h = h + self._attention(i, layer.attn, rms_norm(h, layer.attn_norm, eps), step)
            h = h + layer.mlp(rms_norm(h, layer.mlp_norm, eps))
        return rms_norm(h, w.final_norm, eps)

    def _step(self, batch: ForwardBatch, plan: _Plan) -> _Step:
        """Index tables, write locations and RoPE tables of one forward."""
        dev, cfg = self.cfg.device, self.cfg
        args = (batch.req_to_token, batch.req_pool_indices, plan.starts, batch.seq_lens)
        needs_full = len(self.window_layers) < cfg.num_layers
        full = build_index(*args, None, None, self.page_size, dev) if needs_full else None
        window = None
        if self.window_layers:
            window = build_index(*args, self.sliding_window, self.full_to_swa, self.page_size, dev)
        self.padding_reads += sum(ix.padding_reads for ix in (full, window) if ix is not None)
        swa_loc = None
        if self.swa_pool_layers:
            assert self.full_to_swa is not None
            loc = batch.swa_out_cache_loc
            if loc is None:
                loc = self.full_to_swa[batch.out_cache_loc]
            swa_loc = torch.as_tensor(loc, dtype=torch.int64, device=dev)
        rope_dim = cfg.head_dim if cfg.attention == "gqa" else cfg.qk_rope_head_dim
        positions = torch.as_tensor(plan.positions, device=dev)
        cos, sin = rope_tables(positions, rope_dim, cfg.rope_theta, self.dtype)
        full_loc = torch.as_tensor(batch.out_cache_loc, dtype=torch.int64, device=dev)
        written = torch.as_tensor(plan.written, device=dev)
        return _Step(full, window, full_loc, swa_loc, written, cos, sin)

    def _attention(
        self, layer: int, w: GQAWeights | MLAWeights, x: torch.Tensor, step: _Step
    ) -> torch.Tensor:
        """One attention block on ``x [M, H]`` -> ``[M, H]`` (stores this layer's KV)."""
        idx = step.window if layer in self.window_layers else step.full
        loc = step.swa_loc if layer in self.swa_pool_layers else step.full_loc
        assert idx is not None and loc is not None
        if isinstance(w, GQAWeights):
            return self._gqa(layer, w, x, idx, loc, step)
        return self._mla(layer, w, x, idx, loc, step)

    def _gqa(
        self,
        layer: int,
        w: GQAWeights,
        x: torch.Tensor,
        idx: AttnIndex,
        loc: torch.Tensor,
        step: _Step,
    ) -> torch.Tensor:
        cfg, m = self.cfg, x.shape[0]
        q = apply_rope((x @ w.wq).view(m, cfg.num_heads, cfg.head_dim), step.cos, step.sin)
        k = apply_rope((x @ w.wk).view(m, cfg.num_kv_heads, cfg.head_dim), step.cos, step.sin)
        v = (x @ w.wv).view(m, cfg.num_kv_heads, cfg.head_dim)  # [M, Hkv, D]
        assert not isinstance(self.pool, MLAKVPool)
        k_buf, v_buf = self.pool.get_kv_buffer(layer)
        self.backend.store(k_buf, v_buf, loc, k[step.written], v[step.written])
        o = self.backend.attend(q, k, v, k_buf, v_buf, idx, cfg.head_dim**-0.5)  # [M, Hq, D]
        return o.reshape(m, -1) @ w.wo

    def _mla(
        self,
        layer: int,
        w: MLAWeights,
        x: torch.Tensor,
        idx: AttnIndex,
        loc: torch.Tensor,
        step: _Step,
    ) -> torch.Tensor:
        """Absorbed MLA: attention in latent space, ``k_nope``/``v`` never materialised."""
        cfg, m = self.cfg, x.shape[0]
        r, dn, p = cfg.kv_lora_rank, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim
        q = (x @ w.wq).view(m, cfg.num_heads, dn + p)
        q_pe = apply_rope(q[..., dn:], step.cos, step.sin)  # [M, Hq, P]
        ckv = x @ w.w_dkv  # [M, R + P]
        c = rms_norm(ckv[:, :r], w.kv_norm, cfg.rms_norm_eps)[:, None, :]  # [M, 1, R]
        latent = torch.cat([c, apply_rope(ckv[:, None, r:], step.cos, step.sin)], -1)  # [M, 1, R+P]
        q_cat = torch.cat([torch.einsum("mhd,hdr->mhr", q[..., :dn], w.w_uk), q_pe], -1)
        assert isinstance(self.pool, MLAKVPool)
        kv_buf = self.pool.get_key_buffer(layer)
        self.backend.store_latent(kv_buf, loc, latent[step.written], r)
        o = self.backend.attend_latent(q_cat, latent, kv_buf, idx, (dn + p) ** -0.5, r)
        # o: [M, Hq, R] in latent space; w_uv decompresses each head's value
        return torch.einsum("mhr,hrv->mhv", o, w.w_uv).reshape(m, -1) @ w.wo

    # -- outputs -----------------------------------------------------------------------

    def _log_softmax(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[n, H]`` -> log-probabilities ``[n, V]`` in float64."""
        return torch.log_softmax((hidden @ self.weights.lm_head).to(torch.float64), dim=-1)

    def _input_logprobs(
        self, batch: ForwardBatch, plan: _Plan, hidden: torch.Tensor
    ) -> list[np.ndarray | None]:
        """log p(token p | [0, p)) for written ``p >= max(prefix_len, logprob_start_len)``."""
        bs = batch.batch_size
        wants = batch.return_logprob or [False] * bs
        starts = batch.logprob_start_lens or [0] * bs
        spans: list[tuple[int, np.ndarray] | None] = []
        for b, (want, start) in enumerate(zip(wants, starts)):
            a, seq = max(int(batch.prefix_lens[b]), start), int(batch.seq_lens[b])
            spans.append((b, np.arange(a, max(a, seq))) if want else None)
        live = [s for s in spans if s is not None]
        if not live:
            return [None] * bs
        rows = np.concatenate([plan.qo[b] + p - plan.starts[b] for b, p in live])  # token p
        prev = np.concatenate([plan.qo[b] + p - 1 - plan.starts[b] for b, p in live])  # p - 1
        has_ctx = np.concatenate([p > 0 for _, p in live])
        logp = self._log_softmax(hidden[torch.as_tensor(np.where(has_ctx, prev, 0))])
        toks = torch.as_tensor(plan.ids[rows], device=logp.device)
        vals = logp.gather(-1, toks[:, None])[:, 0].cpu().numpy()
        vals[~has_ctx] = np.nan
        pieces = iter(np.split(vals, np.cumsum([len(p) for _, p in live])[:-1]))
        return [None if s is None else next(pieces) for s in spans]
