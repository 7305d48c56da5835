"""How SGLang 0.5.23's real Scheduler is built and read on a CPU-only box: every shim the
real-scheduler driver needs for this release, each with the reason it exists. Everything not
named here is SGLang's own code running for real.

Keeps: one module per SGLang release (``shim_<version>.py``; the driver picks it by the
installed version): what changed between releases lives here and nowhere else. Runs inside
the sglang venv; imports nothing of kvspec.

Shims (why):
1. ``bootstrap._bind_threads_if_cpu`` → no-op: it asserts NUMA information a CPU VM lacks.
2. ``Scheduler.init_tp_model_worker`` → the fake worker (worker.py): the model forward
   is the one fake on the decision path.
3. ``Scheduler.init_memory_pools`` / ``init_all_attention_backends`` / ``init_all_cuda_graphs``
   → no-ops: the fake worker builds SGLang's own pools itself; attention and CUDA graphs
   belong to the forward, which does not run.
4. ``SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python``: the default Rust TreeCore keeps the same
   counts, but its nodes cannot be listed, and the census needs every node's slots.
5. SGLang's own memory checks are called, not asserted: ``SGLANG_ENABLE_STRICT_MEM_CHECK_*``
   stay off and ``sglang_checks`` evaluates the busy sum (``_check_full_pool``) and the page
   invariants (``_check_kv_page_invariants``) each iteration, recording what they say.
6. Speculative decoding (a config with ``speculative``; EAGLE, topk 1; 0.5.23 runs its spec-v2
   worker with or without the overlap loop, the spec-v1 path is gone): SGLang's
   ``--speculative-*`` flags, the fake EAGLE worker and the torch twins of the scheduler
   side's Triton kernels (drafts.py ``install``: each shim there with its reason). Request
   rows get SGLang's own headroom (``get_req_to_token_extra_context_len``: the spec
   reservation past the context), the plain configuration keeps +8.
"""

from __future__ import annotations

import os
from array import array

import drafts
import shim_common
import torch
from sglang.srt.distributed import bootstrap
from sglang.srt.managers import io_struct
from sglang.srt.managers import scheduler as scheduler_module
from sglang.srt.managers.schedule_batch import ScheduleBatch
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.managers.scheduler_components import invariant_checker
from sglang.srt.managers.utils import GenerationBatchResult
from sglang.srt.mem_cache.allocation_sizing import get_req_to_token_extra_context_len
from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.model_executor.model_runner_components.ngram_embedding_manager import (
    NgramEmbeddingManager,
)
from sglang.srt.runtime_context import SpawnRanks, get_schedule, publish
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import PortArgs, ServerArgs
from sglang.srt.session import session_controller
from sglang.srt.session.session_controller import Session
from shim_common import kv_pools
from worker import FakeRunner, FakeWorker

VERSION = "0.5.23"
# engine features a trace may use on this release beyond the plain ones (kvspec checks a
# trace against them before anything runs; the banner reports them)
SUPPORTS = {"speculative"}
# catalog ids that do not hold by this release's design (not bugs): id -> why. Both rules
# state kvspec's own spec-v2 accounting; with speculation off they hold vacuously.
NOT_APPLICABLE = {
    "spec.overalloc_bounded": "0.5.23 reserves whole pages and pre-claims no bonus: a decode "
    "raises kv_allocated_len to ceil_page(committed + 2 * alloc_len) "
    "(allocation_sizing.page_aligned_decode_alloc_lens), so allocated - committed reaches "
    "2 * alloc_len - 1 + page_size - 1, and 2 * alloc_len + page_size - 1 under overlap",
    "spec.committed_tracks_device": "0.5.23 pre-claims no bonus slot: _resolve_spec_v2_tokens "
    "commits the whole accepted run when the result is processed (committed = the verify's "
    "start under overlap, its end without), not start + 1",
}
MODEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "model")


def environment(cfg: dict) -> dict[str, str]:
    """The environment SGLang reads its test hooks and backend choices from."""
    env = {
        "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND": "python",
        "SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY": "0",
        "SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE": "0",  # recorded, not raised
    }
    if cfg.get("retract_interval"):
        env["SGLANG_TEST_RETRACT"] = "1"
        env["SGLANG_TEST_RETRACT_INTERVAL"] = str(cfg["retract_interval"])
    return env


def set_retract_hook(cfg: dict) -> None:
    """SGLang's test retract hook: scheduler.py reads it into module globals at import, so
    the environment alone (set after the import) would not reach it."""
    interval = int(cfg.get("retract_interval") or 0)
    scheduler_module.TEST_RETRACT = interval > 0
    scheduler_module.TEST_RETRACT_INTERVAL = max(interval, 1)


def server_args(cfg: dict) -> ServerArgs:
    """The server arguments of one configuration (SGLang's flag names)."""
    return ServerArgs(
        model_path=MODEL,
        device="cpu",
        attention_backend="torch_native",
        skip_tokenizer_init=True,
        load_format="dummy",
        disable_cuda_graph=True,
        disable_overlap_schedule=not cfg["overlap"],
        enable_mixed_chunk=cfg["mixed_chunk"],
        disable_radix_cache=cfg["cache"] == "chunk",
        enable_streaming_session=cfg["streaming_sessions"],
        page_size=cfg["page_size"],
        chunked_prefill_size=cfg["chunked_prefill_size"] or -1,
        max_prefill_tokens=cfg["max_prefill_tokens"],
        max_total_tokens=cfg["pool_tokens"],
        max_running_requests=cfg["max_running_requests"],
        context_length=cfg["max_context"],
        random_seed=cfg["seed"],
        **drafts.server_args(cfg.get("speculative"), MODEL),
    )


def _worker(scheduler: Scheduler, cfg: dict) -> FakeWorker:
    tokens, reqs = cfg["pool_tokens"], cfg["max_reqs"]
    attrs = dict(
        is_hybrid_swa=False,
        sliding_window_size=None,
        mtp_draft_device_pools=(),
        mtp_draft_mamba_pools=None,
        canary_manager=None,
        spec_algorithm=None,
        logical_max_total_num_tokens=tokens,
        effective_logical_max_total_num_tokens=tokens,
        max_running_requests=reqs,
    )
    extra = get_req_to_token_extra_context_len() if cfg.get("speculative") else 8
    pools = kv_pools(
        cfg,
        MHATokenToKVPool,
        TokenToKVPoolAllocator,
        PagedTokenToKVPoolAllocator,
        ReqToTokenPool,
        row_extra=extra,
    )
    runner = FakeRunner(scheduler.model_config, pools, attrs)
    # the real manager, disabled (the scheduler asks it to prepare every batch)
    runner.ngram_embedding_manager = NgramEmbeddingManager.from_model(
        model=runner.model,
        model_config=runner.model_config,
        req_to_token_pool=runner.req_to_token_pool,
        max_running_requests=reqs,
        device="cpu",
    )
    return FakeWorker(runner, _worker_info(runner, cfg), _result, cfg)


def _worker_info(runner: FakeRunner, cfg: dict) -> tuple:
    """What TpModelWorker.get_worker_info returns, from the fake runner's pools."""
    tokens, reqs, ctx = cfg["pool_tokens"], cfg["max_reqs"], cfg["max_context"]
    schedule = get_schedule()
    usable = min(ctx, tokens)
    return (
        tokens,
        schedule.max_prefill_tokens,
        reqs,
        schedule.max_queued_requests,
        usable - 1,
        usable - 6,
        0,
        "cpu",
        runner.forward_stream,
        reqs,
        ctx,
        tokens,
    )


def _result(next_token_ids: torch.Tensor) -> GenerationBatchResult:
    return GenerationBatchResult(next_token_ids=next_token_ids, can_run_cuda_graph=False)


def build(cfg: dict) -> Scheduler:
    """The real Scheduler of one configuration, with only the model worker faked."""
    os.environ.update(environment(cfg))
    set_retract_hook(cfg)
    bootstrap._bind_threads_if_cpu = lambda *, device: None

    def init_tp_model_worker(self: Scheduler) -> None:
        self.tp_worker = _worker(self, cfg)
        self.tp_worker.model_runner.spec_algorithm = self.spec_algorithm

    Scheduler.init_tp_model_worker = init_tp_model_worker
    Scheduler.init_memory_pools = lambda self: None
    Scheduler.init_all_attention_backends = lambda self: None
    Scheduler.init_all_cuda_graphs = lambda self: None
    if cfg.get("speculative"):
        drafts.install(Scheduler, cfg["speculative"])
    args = server_args(cfg)
    ports = PortArgs.init_new(args)
    publish(args, role="scheduler", ranks=SpawnRanks(world_rank=0, dp_rank=None, gpu_id=0))
    return Scheduler(args, ports)


def set_receiver(scheduler: Scheduler, receive) -> None:
    """Route the loop's per-iteration receive (``request_receiver.recv_requests``) to
    ``receive(local_reqs)``: the seam where the driver hands over the trace's ops."""
    # a frozen component: its class is patched (one scheduler per driver process)
    type(scheduler.request_receiver).recv_requests = lambda self, local_reqs=None: receive(
        local_reqs
    )


def set_output(scheduler: Scheduler, record) -> None:
    """Route what the scheduler sends to the detokenizer and the tokenizer to ``record``."""
    channels = scheduler.ipc_channels
    channels.send_to_detokenizer.send_output = lambda out, *a, **k: record(out)
    channels.send_to_tokenizer.send_output = lambda out, *a, **k: record(out)


def req_kv(req):
    """A request's KV record: ``req_pool_idx``, the lengths, ``cache_protected_len``."""
    return req.kv


def fill_len(req) -> int:
    """Tokens of the request's current fill (the prompt and output, cut at this chunk)."""
    return len(req.get_fill_ids())


def swa_evicted(kv) -> int:
    return 0  # no hybrid SWA pool on this target yet


def session_slots(scheduler: Scheduler, refused: frozenset = frozenset()) -> dict:
    """Session id → (KV record, the node its turn-1 tree lock holds, or None); a turn runs on
    its slot's record itself (the same object), so ``refused`` plays no part."""
    session = getattr(scheduler.tree_cache, "session", None)
    slots = {} if session is None else session.slots
    return {
        sid: (slot.kv, None if slot.lock is None else slot.lock.node) for sid, slot in slots.items()
    }


def record_checks(scheduler: Scheduler, sink: list) -> None:
    """What SGLang's own checkers report (its idle pool check, its request-pool check, its
    page invariants) goes to ``sink`` instead of a log line or an exception."""
    real = invariant_checker.raise_error_or_warn

    def recording(obj, strict, counter_name, message, log_interval=1000):
        sink.append(str(message).strip())
        real(obj, False, counter_name, message, log_interval)

    invariant_checker.raise_error_or_warn = recording


def record_refusals(refused: set) -> None:
    shim_common.record_refusals(Session, refused)


def busy_check(scheduler: Scheduler) -> str | None:
    """SGLang's busy check (``self_check_during_busy``) without its assert: its pool sum over
    the rows it counts as request-owned, then its page invariants; the message of a leak."""
    checker = scheduler.invariant_checker
    uncached, _ = checker._get_total_uncached_sizes()
    leak, message = checker._check_full_pool(
        scheduler.pool_stats_observer.get_pool_stats(), uncached=uncached
    )
    try:
        checker._check_kv_page_invariants()  # reports through record_checks' sink
    except AssertionError as exc:
        return f"page invariants: {exc}"
    return f"Full Pool Mem Leak Detected! {message}" if leak else None


def sessions(scheduler: Scheduler) -> list:
    """The open sessions (SGLang's ``Session`` objects)."""
    return list(scheduler.session_controller.sessions.values())


def session_state(session, live: list) -> tuple[bool, bool]:
    """(a streaming turn is in flight, the close waits for it): the session's own flags
    (``live``, the session's unfinished requests, is for releases without them)."""
    return session._inflight, session.close_on_finish


def set_clock(now) -> None:
    shim_common.set_clock([scheduler_module, session_controller], now)


def retracted(scheduler: Scheduler) -> int:
    return RETRACTS.count


RETRACTS = shim_common.RetractCounter(ScheduleBatch)


# ---- the trace's ops as this release's inputs ----


def generate_input(op: dict) -> io_struct.TokenizedGenerateReqInput:
    params = shim_common.sampling_params(op, SamplingParams)
    session = op.get("session")
    return io_struct.TokenizedGenerateReqInput(
        rid=op["rid"],
        input_text=None,
        input_ids=array("q", op["input_ids"]),
        input_embeds=None,
        mm_inputs=None,
        token_type_ids=None,
        sampling_params=params,
        return_logprob=False,
        logprob_start_len=-1,
        top_logprobs_num=0,
        token_ids_logprob=None,
        stream=False,
        session_params=None if session is None else io_struct.SessionParams(**session),
    )


def session_input(op: dict):
    return shim_common.session_input(op, io_struct)


def abort_input(rid: str) -> io_struct.AbortReq:
    return io_struct.AbortReq(rid=rid)


def flush_input() -> io_struct.FlushCacheReqInput:
    return io_struct.FlushCacheReqInput()


def counters(scheduler: Scheduler) -> dict:
    """The allocator's and the tree's own counters, and the pool's capacity."""
    tree = scheduler.tree_cache
    return dict(
        free=scheduler.token_to_kv_pool_allocator.available_size(),
        evictable=tree.evictable_size(),
        protected=tree.protected_size(),
        capacity=scheduler.max_total_num_tokens,
    )


def sglang_terms(scheduler: Scheduler) -> dict:
    """The two terms SGLang's busy check adds itself (reported beside kvspec's own)."""
    return dict(
        session_held=scheduler.pool_stats_observer.session_held_tokens(),
        request_owned=scheduler.invariant_checker._get_total_uncached_sizes()[0],
    )


def tree_nodes(scheduler: Scheduler) -> list:
    """(id, parent id or -1, key length, value slots, lock_ref) of every node, root first;
    empty for a cache without a tree (the chunk cache)."""
    core = getattr(scheduler.tree_cache, "tree_core", None)
    if core is None:
        return []
    from sglang.srt.mem_cache.unified_cache.components import ComponentType

    found, stack = [], [core.root_node]
    while stack:
        node = stack.pop()
        data = node.component_data[ComponentType.FULL]
        value = [] if data.value is None else torch.as_tensor(data.value).long().tolist()
        parent = -1 if node.parent is None else node.parent.id
        found.append(
            (node.id, parent, 0 if node.key is None else len(node.key), value, data.lock_ref)
        )
        stack.extend(node.children.values())
    return found


def free_pages(scheduler: Scheduler) -> list[int]:
    return scheduler.token_to_kv_pool_allocator.get_all_free_pages().long().tolist()
