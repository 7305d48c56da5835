"""The fake worker's side of a real Scheduler, built from the release's own classes: the KV
pools as a model runner builds them, what the runner and ``get_worker_info`` hand the
scheduler, and the paged allocator's Triton kernels routed to torch code.

Keeps: one place builds the pools for every era (a hybrid SWA or MLA pool would be built
here, beside ``kv_pools``); what differs between releases is a probe's answer passed in
(probes.py), never a version. Runs inside the sglang venv; imports nothing of kvspec.

Shims (why):
1. The paged allocator launches Triton kernels even on CPU where the release has no CPU path
   (``alloc_extend_kernel``, ``alloc_decode_kernel``): routed, in the module that binds them
   for the allocator, to SGLang's own ``alloc_extend_naive`` and to a twin of the
   ``alloc_decode_naive`` later releases ship — a fidelity caveat: the GPU kernels themselves
   are not what runs.
2. ``FakeRunner`` attributes the scheduler reads off a model runner, the union of what any
   release reads (setting one a release never reads is harmless).
3. The n-gram embedding manager, where the scheduler prepares one every batch: SGLang's own,
   built disabled.
"""

from __future__ import annotations

import importlib
import os

import torch
from worker import FakeRunner, FakeWorker

MODEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "model")
SRT = "sglang.srt."
NGRAM = SRT + "model_executor.model_runner_components.ngram_embedding_manager"


def kv_pools(cfg: dict, row_extra: int = 8) -> dict:
    """SGLang's own KV pool, allocator and request rows for one tiny layer, as its model
    runner builds them; a row holds ``max_context + row_extra`` positions."""
    from sglang.srt.mem_cache import allocator as allocators
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool

    page, tokens = cfg["page_size"], cfg["pool_tokens"]
    kv = MHATokenToKVPool(
        size=tokens,
        page_size=page,
        dtype=torch.float16,
        head_num=1,
        head_dim=4,
        layer_num=1,
        device="cpu",
        enable_memory_saver=False,
    )
    paged = page > 1
    allocator_cls = (
        allocators.PagedTokenToKVPoolAllocator if paged else allocators.TokenToKVPoolAllocator
    )
    extra = {"page_size": page} if paged else {}
    allocator = allocator_cls(
        size=tokens, dtype=torch.float16, device="cpu", kvcache=kv, need_sort=False, **extra
    )
    rows = ReqToTokenPool(
        size=cfg["max_reqs"],
        max_context_len=cfg["max_context"] + row_extra,
        device="cpu",
        enable_memory_saver=False,
    )
    return dict(token_to_kv_pool=kv, token_to_kv_pool_allocator=allocator, req_to_token_pool=rows)


# ---- the paged allocator's kernels ----


class _Launch:
    """``kernel[grid](...)`` -> ``fn(...)``: a Triton launch routed to torch code."""

    def __init__(self, fn) -> None:
        self.fn = fn

    def __getitem__(self, grid):
        return self.fn


def decode_twin(seq_lens, last_loc, free_pages, out_indices, page_size) -> None:
    """``alloc_decode_naive`` as later releases ship it: a new page where the next token
    starts one, else the slot after the last."""
    need_new_page = ((seq_lens - 1) % page_size == 0).to(torch.int64)
    count = int(need_new_page.sum())
    if count == 0:
        out_indices.copy_(last_loc + 1)
        return
    rank = (torch.cumsum(need_new_page, 0) - need_new_page).clamp_(max=count - 1)
    new_slot = free_pages[rank] * page_size
    out_indices.copy_(torch.where(need_new_page.bool(), new_slot, last_loc + 1))


def route_allocator_kernels(module_name: str) -> None:
    """Shim 1: the kernels the module binds, launched with the kernel's arguments
    ``(..., out, bs_pow2, page_size)``, run naive torch code instead (a release with its own
    CPU path never launches them: routing them there changes nothing)."""
    module = importlib.import_module(module_name)
    extend_naive = module.alloc_extend_naive

    def extend(prefix_lens, seq_lens, last_loc, free_pages, out, _bs_pow2, page_size):
        extend_naive(prefix_lens, seq_lens, last_loc, free_pages, out, page_size, "cpu")

    def decode(seq_lens, last_loc, free_pages, out, _bs_pow2, page_size):
        decode_twin(seq_lens, last_loc, free_pages, out, page_size)

    module.alloc_extend_kernel = _Launch(extend)
    module.alloc_decode_kernel = _Launch(decode)


# ---- the fake worker ----

RUNNER_ATTRS = dict(  # shim 2: what some release reads off a runner, where None will not do
    is_hybrid_swa=False,
    sliding_window_size=None,
    mtp_draft_device_pools=(),
    mtp_draft_mamba_pools=None,
    canary_manager=None,
    hybrid_gdn_config=None,
    spec_algorithm=None,
)


def fake_worker(scheduler, cfg: dict, probes, make_result, row_extra: int = 8) -> FakeWorker:
    """The worker the Scheduler gets: SGLang's own pools in a fake runner, the release's
    worker info, the n-gram manager where the release prepares one."""
    tokens, reqs = cfg["pool_tokens"], cfg["max_reqs"]
    attrs = dict(
        RUNNER_ATTRS,
        logical_max_total_num_tokens=tokens,
        effective_logical_max_total_num_tokens=tokens,
        max_running_requests=reqs,
    )
    runner = FakeRunner(scheduler.model_config, kv_pools(cfg, row_extra), attrs)
    if probes["ngram"] != "none":  # shim 3: the scheduler prepares it every batch
        runner.ngram_embedding_manager = _ngram_manager(runner, scheduler, probes, reqs)
    info = worker_info(runner, scheduler, cfg, probes["worker_info"])
    return FakeWorker(runner, info, make_result, cfg)


def _ngram_manager(runner: FakeRunner, scheduler, probes, reqs: int):
    manager = importlib.import_module(NGRAM).NgramEmbeddingManager
    extra = {"server_args": scheduler.server_args} if probes["ngram"] == "server_args" else {}
    return manager.from_model(
        model=runner.model,
        model_config=runner.model_config,
        req_to_token_pool=runner.req_to_token_pool,
        max_running_requests=reqs,
        device="cpu",
        **extra,
    )


def worker_info(runner: FakeRunner, scheduler, cfg: dict, source: str) -> tuple:
    """What ``TpModelWorker.get_worker_info`` returns, from the fake runner's pools; the
    schedule limits from where the release keeps them (``source``: the worker_info probe)."""
    tokens, reqs, ctx = cfg["pool_tokens"], cfg["max_reqs"], cfg["max_context"]
    if source == "schedule":
        schedule = importlib.import_module(SRT + "runtime_context").get_schedule()
        prefill, queued = schedule.max_prefill_tokens, schedule.max_queued_requests
    else:
        prefill, queued = cfg["max_prefill_tokens"], scheduler.server_args.max_queued_requests
    usable = min(ctx, tokens)
    limits = (tokens, prefill, reqs, queued, usable - 1, usable - 6)
    return (*limits, 0, "cpu", runner.forward_stream, reqs, ctx, tokens)


def batch_result_maker(logits: str):
    """The release's ``GenerationBatchResult`` of one plain forward; ``logits``: the
    batch_logits probe's answer (``empty``: an empty logits output, one per result, for the
    overlap loop's copy; ``none``: no logits, which the loop then reads only for logprobs
    and hidden states, which no trace asks for)."""
    from sglang.srt.managers.utils import GenerationBatchResult

    def make(next_token_ids: torch.Tensor) -> GenerationBatchResult:
        extra = {}
        if logits == "empty":
            from sglang.srt.layers.logits_processor import LogitsProcessorOutput

            extra["logits_output"] = LogitsProcessorOutput(next_token_logits=None)
        return GenerationBatchResult(
            next_token_ids=next_token_ids, can_run_cuda_graph=False, **extra
        )

    return make


def row_headroom(cfg: dict, server_args, probes) -> int:
    """Row positions past the context: SGLang's own spec reservation under speculation
    (``get_req_to_token_extra_context_len``; the spec_headroom probe says whether it takes
    the server args), else 8."""
    if not cfg.get("speculative"):
        return 8
    from sglang.srt.mem_cache.allocation_sizing import get_req_to_token_extra_context_len as extra

    return extra(server_args) if probes["spec_headroom"] == "server_args" else extra()
