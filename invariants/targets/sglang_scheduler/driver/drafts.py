"""EAGLE speculative decoding on the real scheduler: the fake of SGLang's spec-v2 worker
(``EAGLEWorkerV2``, topk 1: draft, target verify and draft extend in one call) and the torch
twins of the scheduler-side Triton kernels a CPU build cannot launch.

Keeps: only model execution is faked. What the scheduler does around the worker is SGLang's
own code — the decode reservation (``eagle_prepare_for_decode`` → ``alloc_for_spec_decode``),
the commit at resolve (``_resolve_spec_v2_tokens``: ``kv_committed_len += accept_len``), the
FutureMap relay under overlap, retract, release, sessions. The worker returns what
``EAGLEWorkerV2.forward_batch_generation`` returns, built from seeded draws: one seed gives
the same accept lengths and tokens run after run, and the accepted tokens are the ones the
plain fake worker samples at those positions (``token_at``). Runs inside the sglang venv;
imports nothing of kvspec.

    a verify at s (the request's KV length before this round; n = num_draft_tokens):
    [s, s + n)        the target forward writes KV for its inputs: the bonus at s, then the
                      drafts; draft j (position s + j) is the target's own token while j < a
    [s + a, s + n)    rejected drafts: their KV is another token's (the shadow writes one)
    s + a             the new bonus's position: no KV until the next verify feeds it
    tokens returned   token_at(s + 1) .. token_at(s + a), padded to n; new_seq_lens = s + a
"""

from __future__ import annotations

import hashlib
from types import SimpleNamespace

import torch
from reader import trace_rid
from sglang.srt.arg_groups import speculative_hook
from sglang.srt.managers import overlap_utils
from sglang.srt.managers.utils import GenerationBatchResult
from sglang.srt.mem_cache import allocation
from sglang.srt.mem_cache.allocation_sizing import get_alloc_len_per_decode
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
from sglang.srt.speculative.base_spec_worker import BaseSpecWorker
from sglang.srt.speculative.eagle_info import EagleDraftInput
from worker import FakeWorker, KVShadow

TOPK = 1  # a chain draft: the tree kernels and the KV moves of topk > 1 are not modelled


def accept_len_at(seed: int, rid: str, seq_len: int, num_steps: int, accept_prob: float) -> int:
    """Accepted drafts + the bonus of a verify at ``seq_len``: draft j matches the target with
    ``accept_prob`` (a seeded draw per (seed, rid, seq_len, j)); the run stops at a miss."""
    accepted = 1
    for j in range(num_steps):
        # blake2b, not crc32: crc32 is linear, so draws that differ only in j correlate
        key = hashlib.blake2b(f"{seed}:{rid}:{seq_len}:{j}".encode(), digest_size=8).digest()
        if int.from_bytes(key, "little") / 2**64 >= accept_prob:
            break
        accepted += 1
    return accepted


class FakeEagleWorker(BaseSpecWorker):
    """Stands in for ``EAGLEWorkerV2`` (the scheduler's ``draft_worker`` and ``model_worker``);
    ``rows``: rid → (the KV length its last verify verified, that verify's accept length),
    which the views report as ``spec_seq_len`` / ``spec_accept_len``."""

    def __init__(self, target: FakeWorker, spec: dict, hidden_size: int) -> None:
        super().__init__()
        self._target_worker, self._draft_worker = target, None  # no draft model runners
        self.topk, self.speculative_num_steps = TOPK, spec["num_steps"]
        self.speculative_num_draft_tokens = spec["num_draft_tokens"]
        self.accept_prob, self.hidden_size = spec["accept_prob"], hidden_size
        self.rows: dict[str, tuple[int, int]] = {}
        runner = target.model_runner
        allocator = runner.token_to_kv_pool_allocator  # slot ids < size + one page (page 0 kept)
        slots = allocator.size + allocator.page_size
        target.shadow = KVShadow(runner.req_to_token_pool.req_to_token, slots)

    # ---- what the scheduler reads off a spec worker ----

    @property
    def spec_v2_attn_backends(self) -> tuple:
        return (self._target_worker.model_runner.attn_backend,)

    def on_verify_complete_cpu(self, *args, **kwargs) -> None:
        return None  # the adaptive-steps controller's feed: no controller here

    def clear_cache_pool(self) -> None:
        return None

    # ---- what the views report ----

    def sched_fields(self) -> dict:
        """The view's ``sched`` speculative fields: the accounting is spec v2's whether or
        not the overlap loop runs (the speculative probe: spec v2 is the only EAGLE worker)."""
        return dict(
            spec_mode="v2",
            num_draft_tokens=self.speculative_num_draft_tokens,
            spec_alloc_len=get_alloc_len_per_decode(),
        )

    def req_fields(self, req) -> dict:
        """A request's ``spec_seq_len`` / ``spec_accept_len`` (-1, 0: no verify stands)."""
        seq_len, accept_len = self.rows.get(trace_rid(req), (-1, 0))
        return dict(spec_seq_len=seq_len, spec_accept_len=accept_len)

    # ---- the forward ----

    def forward_batch_generation(self, batch, on_publish=None, grammar_barrier=None, **kwargs):
        """Prefill: the target's token, ``new_seq_lens = seq_lens`` (spec v2's convention).
        Decode: one verify per request (module docstring). ``on_publish`` gets the new
        sequence lengths before the result returns, as the real worker publishes them."""
        if batch.forward_mode.is_extend() or batch.is_extend_in_batch:
            result = self._target_worker.forward_batch_generation(batch)
            result.new_seq_lens = batch.seq_lens
            bonus = result.next_token_ids
            for req in batch.reqs:  # a (re-)prefill: no verify of this request stands yet
                self.rows.pop(trace_rid(req), None)
        else:
            result, bonus = self.verify(batch)
        if on_publish is not None:
            on_publish(result.new_seq_lens)
        result.next_draft_input = self.draft_input(bonus)
        return result

    def verify(self, batch) -> tuple[GenerationBatchResult, torch.Tensor]:
        """The decode round of every request: tokens, accept lengths, new lengths, bonuses."""
        n, target = self.speculative_num_draft_tokens, self._target_worker
        target.forwards += 1
        seq = [int(s) for s in batch.seq_lens.tolist()]
        rows = batch.req_pool_indices.tolist()
        tokens, accepts = [], []
        for req, row, s in zip(batch.reqs, rows, seq):
            rid = trace_rid(req)
            a = accept_len_at(target.seed, rid, s, self.speculative_num_steps, self.accept_prob)
            self.write_verify(req, row, s, a)
            tokens += [target.token(rid, s + j) for j in range(1, n + 1)]
            accepts.append(a)
            self.rows[rid] = (s + a, a)
        accept_lens = torch.tensor(accepts, dtype=torch.int32)
        new_seq_lens = batch.seq_lens + accept_lens.to(batch.seq_lens.dtype)
        grid = torch.tensor(tokens, dtype=torch.int64).view(len(seq), n)
        bonus = grid[torch.arange(len(seq)), accept_lens.long() - 1]
        result = GenerationBatchResult(
            next_token_ids=grid.reshape(-1),
            can_run_cuda_graph=False,
            speculative_num_draft_tokens=n,
            accept_lens=accept_lens,
            new_seq_lens=new_seq_lens,
        )
        return result, bonus

    def write_verify(self, req, row: int, s: int, a: int) -> None:
        """The verify attends to ``[0, s)`` and writes its window ``[s, s + n)``: the right
        tokens up to the last accepted draft, another token at each rejected one."""
        target, n = self._target_worker, self.speculative_num_draft_tokens
        tokens = target.tokens(req, s + n)
        wrong = [wrong_token(t) for t in tokens[s + a : s + n]]
        target.shadow.read(trace_rid(req), row, tokens[:s])
        target.shadow.write(row, s, tokens[s : s + a] + wrong)

    def draft_input(self, bonus: torch.Tensor) -> EagleDraftInput:
        """What the draft extend leaves for the next round: the bonus tokens, a top-1 draft
        distribution, one hidden state per request."""
        bs = bonus.shape[0]
        return EagleDraftInput(
            bonus_tokens=bonus.to(torch.int32),
            topk_p=torch.ones((bs, TOPK), dtype=torch.float32),
            topk_index=bonus.to(torch.int64).view(bs, 1),
            hidden_states=torch.zeros((bs, self.hidden_size), dtype=torch.float32),
            capture_hidden_mode=CaptureHiddenMode.LAST,
        )


def wrong_token(token: int) -> int:
    """A rejected draft's token at a position: never the target's own."""
    return token + 1


# ---- the scheduler side's Triton kernels, in torch ----


class AssignTwin:
    """``allocation.assign_req_to_token_pool[grid](req_pool_indices, req_to_token, start, end,
    out_cache_loc, pool_len, bs_upper)``: row ``req_pool_indices[i]``, columns
    ``[start[i], end[i])`` ← the next ``end - start`` entries of ``out_cache_loc``. Why: the
    Triton kernel has no CPU launch, and SGLang's CPU alternative
    (``sgl_kernel.assign_req_to_token_pool_cpu``, under ``SGLANG_USE_CPU_ENGINE``) is a C++ op
    of sgl-kernel's CPU build, which is not installed."""

    def __getitem__(self, grid):
        return self.launch

    @staticmethod
    def launch(req_pool_indices, req_to_token, start, end, out_cache_loc, pool_len, bs_upper):
        offset = 0
        for row, lo, hi in zip(req_pool_indices.tolist(), start.tolist(), end.tolist()):
            if hi > lo:
                chunk = out_cache_loc[offset : offset + hi - lo]
                req_to_token[row, lo:hi] = chunk.to(req_to_token.dtype)
            offset += max(hi - lo, 0)


def gather_spec_extras(indices, topk_p_buf, topk_index_buf, output_tokens_buf, hidden_buf):
    """``overlap_utils.gather_spec_extras`` (one fused Triton row gather of the FutureMap's
    relay buffers by ``future_indices``) as ``buf[indices]`` per buffer. Why: no CPU launch,
    and it is a copy of relay rows, no accounting in it."""
    idx = indices.long()
    hidden = None if hidden_buf is None else hidden_buf[idx]
    return topk_p_buf[idx], topk_index_buf[idx], output_tokens_buf[idx], hidden


def guard_record_stream() -> None:
    """``torch.Tensor.record_stream`` as a no-op on a CPU tensor, in the trace's child. Why:
    under overlap the FutureMap relay records each index tensor on the forward stream, and
    torch rejects a CPU tensor there; releases that skip it for CPU tensors themselves
    (``FutureMap._resolve_spec_extras``, 0.5.22 on) never call it here, and a device tensor
    still reaches the real method."""
    real = torch.Tensor.record_stream

    def record_stream(tensor, stream) -> None:
        if tensor.device.type != "cpu":
            real(tensor, stream)

    torch.Tensor.record_stream = record_stream


def keep_overlap(server_args) -> None:
    """``speculative_hook._disable_overlap_schedule_for_cpu`` as a no-op. Why: SGLang turns the
    overlap loop off for speculative decoding on device ``cpu`` because its CPU *worker*
    kernels lack it; the scheduler's overlap path (FutureMap relay, results processed one
    iteration late) is device-agnostic torch code, and the worker here is the fake."""
    return None


# ---- wiring (called by the adapter before the Scheduler is built) ----


def server_args(spec: dict | None, draft_model: str) -> dict:
    """SGLang's ``--speculative-*`` flags for EAGLE, topk 1 (the draft path may be any model
    dir: the fake worker loads nothing); none without ``spec``."""
    if not spec:
        return {}
    return dict(
        speculative_algorithm="EAGLE",
        speculative_draft_model_path=draft_model,
        speculative_num_steps=spec["num_steps"],
        speculative_eagle_topk=TOPK,
        speculative_num_draft_tokens=spec["num_draft_tokens"],
    )


def draft_stand_in(scheduler) -> SimpleNamespace:
    """A draft worker with one draft runner that holds no KV pool, for a release whose
    scheduler reads the draft runner at start (the spec_draft_runner probe: the PD wire
    schema's hidden-state width from ``get_draft_recurrent_hidden_state_spec(runner)``, the
    draft KV pool for disaggregation, both unused here). Why: the fake has no draft model; the
    width it reads is the target's own (the draft model path is the target's)."""
    runner = SimpleNamespace(
        token_to_kv_pool=None,
        spec_algorithm=scheduler.spec_algorithm,
        model_config=scheduler.model_config,
    )
    usage = dict(weight_load_time=0.0, graph_memory_usage={}, graph_time_usage={})
    return SimpleNamespace(draft_runner=runner, draft_runners=[runner], **usage)


def install(scheduler_cls, spec: dict, draft_runner_read: bool = False) -> None:
    """The shims speculative decoding needs, each with its reason:
    ``maybe_init_draft_worker`` → ``FakeEagleWorker`` (the real ``EAGLEWorkerV2.__init__``
    builds draft model runners: weights, a draft KV pool, attention backends, CUDA graphs),
    with ``draft_stand_in`` where ``draft_runner_read``;
    ``allocation.assign_req_to_token_pool`` → ``AssignTwin`` and
    ``overlap_utils.gather_spec_extras`` → ``gather_spec_extras`` (Triton kernels, no CPU
    launch); the CPU overlap gate → ``keep_overlap``; ``guard_record_stream``."""

    def maybe_init_draft_worker(self) -> None:
        hidden = self.model_config.hf_config.hidden_size
        self.draft_worker = FakeEagleWorker(self.tp_worker, spec, hidden)
        if draft_runner_read:
            self.draft_worker._draft_worker = draft_stand_in(self)
        self.external_corpus_manager = None

    scheduler_cls.maybe_init_draft_worker = maybe_init_draft_worker
    allocation.assign_req_to_token_pool = AssignTwin()
    overlap_utils.gather_spec_extras = gather_spec_extras
    speculative_hook._disable_overlap_schedule_for_cpu = keep_overlap
    guard_record_stream()
