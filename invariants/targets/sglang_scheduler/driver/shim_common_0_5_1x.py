"""How SGLang 0.5.10.post1's and 0.5.11's real Scheduler is built and read on a CPU-only box:
the shims the two releases share (their scheduler, allocator and checker are the same code
where the driver touches them, and the session controller differs in its module path only),
each with the reason it exists. Their streaming sessions differ (0.5.10.post1:
``SessionAwareCache``; 0.5.11: ``StreamingSession``, with the fix of #22862) and live in each
release's own shim, which re-exports this one.

Keeps: everything not named here or in the release's shim is SGLang's own code running for
real. Runs inside the sglang venv; imports nothing of kvspec.

Shims (why):
1. ``Scheduler.init_tp_model_worker`` → the fake worker (worker.py), after what
   ``ModelRunner.init_torch_distributed`` did (one gloo rank, model and DP-attention groups):
   the model forward is the one fake on the decision path. The scheduler builds its own
   tree cache over the pools the worker hands it (``init_cache_with_memory_pool``, real).
2. The paged allocator launches Triton kernels even on CPU (``alloc_extend_kernel``,
   ``alloc_decode_kernel``): routed to SGLang's own ``alloc_extend_naive`` and to the decode
   twin of it that 0.5.23 ships as ``alloc_decode_naive`` (these releases lack it) — a
   fidelity caveat: the GPU kernels themselves are not what runs.
3. ``set_global_server_args_for_scheduler``: the release reads its server arguments from a
   module global (0.5.23: ``runtime_context.publish``).
4. SGLang's own memory checks are called, not asserted: the busy check
   (``self_check_during_busy``) is evaluated each iteration and its assertion recorded; the
   idle checks report through ``raise_error_or_warn``, recorded.
"""

from __future__ import annotations

import contextlib
import importlib
import os

import reader
import shim_common
import torch
from sglang.srt.distributed import init_distributed_environment, initialize_model_parallel
from sglang.srt.layers.dp_attention import initialize_dp_attention
from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.managers import io_struct, scheduler_runtime_checker_mixin
from sglang.srt.managers import scheduler as scheduler_module
from sglang.srt.managers.schedule_batch import ScheduleBatch
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.managers.utils import GenerationBatchResult
from sglang.srt.mem_cache import allocator as allocator_module
from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import PortArgs, ServerArgs, set_global_server_args_for_scheduler
from worker import FakeRunner, FakeWorker

MODEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "model")


def _session_controller():
    """The release's session controller module: the one path the two releases differ in
    (0.5.11 moved it to ``sglang.srt.session``)."""
    for where in (
        "sglang.srt.session.session_controller",
        "sglang.srt.managers.session_controller",
    ):
        with contextlib.suppress(ModuleNotFoundError):
            return importlib.import_module(where)
    raise ImportError("no session_controller under sglang.srt.session or sglang.srt.managers")


session_controller = _session_controller()


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
    )


class _Launch:
    """``kernel[grid](...)`` → ``fn(...)``: a Triton launch routed to torch code."""

    def __init__(self, fn) -> None:
        self.fn = fn

    def __getitem__(self, grid):
        return self.fn


def _alloc_extend(prefix_lens, seq_lens, last_loc, free_pages, out_indices, _bs_pow2, page_size):
    allocator_module.alloc_extend_naive(
        prefix_lens, seq_lens, last_loc, free_pages, out_indices, page_size, "cpu"
    )


def _alloc_decode(seq_lens, last_loc, free_pages, out_indices, _bs_pow2, page_size):
    """0.5.23's ``alloc_decode_naive``: a new page where the next token starts one."""
    need_new_page = ((seq_lens - 1) % page_size == 0).to(torch.int64)
    count = int(need_new_page.sum())
    if count == 0:
        out_indices.copy_(last_loc + 1)
        return
    rank = (torch.cumsum(need_new_page, 0) - need_new_page).clamp_(max=count - 1)
    new_slot = free_pages[rank] * page_size
    out_indices.copy_(torch.where(need_new_page.bool(), new_slot, last_loc + 1))


def _worker(scheduler: Scheduler, cfg: dict) -> FakeWorker:
    tokens, reqs, ctx = cfg["pool_tokens"], cfg["max_reqs"], cfg["max_context"]
    pools = shim_common.kv_pools(
        cfg, MHATokenToKVPool, TokenToKVPoolAllocator, PagedTokenToKVPoolAllocator, ReqToTokenPool
    )
    runner = FakeRunner(scheduler.model_config, pools, dict(hybrid_gdn_config=None))
    args = scheduler.server_args
    info = (
        tokens,
        cfg["max_prefill_tokens"],
        reqs,
        args.max_queued_requests,
        min(ctx, tokens) - 1,
        min(ctx, tokens) - 6,
        0,
        "cpu",
        runner.forward_stream,
        reqs,
        ctx,
        tokens,
    )
    return FakeWorker(runner, info, _result, cfg)


def _result(next_token_ids: torch.Tensor) -> GenerationBatchResult:
    """The overlap loop copies the logits output to the CPU: an empty one."""
    logits = LogitsProcessorOutput(next_token_logits=None)
    return GenerationBatchResult(
        logits_output=logits, next_token_ids=next_token_ids, can_run_cuda_graph=False
    )


def build(cfg: dict) -> Scheduler:
    """The real Scheduler of one configuration, with only the model worker faked."""
    interval = int(cfg.get("retract_interval") or 0)
    scheduler_module.TEST_RETRACT = interval > 0  # read into globals at import
    scheduler_module.TEST_RETRACT_INTERVAL = max(interval, 1)
    allocator_module.alloc_extend_kernel = _Launch(_alloc_extend)
    allocator_module.alloc_decode_kernel = _Launch(_alloc_decode)
    args = server_args(cfg)
    set_global_server_args_for_scheduler(args)
    ports = PortArgs.init_new(args)

    def init_tp_model_worker(self: Scheduler) -> None:
        init_distributed_environment(
            backend="gloo",
            world_size=1,
            rank=0,
            local_rank=0,
            distributed_init_method=f"tcp://127.0.0.1:{ports.nccl_port}",
        )
        initialize_model_parallel(tensor_model_parallel_size=1)
        initialize_dp_attention(server_args=self.server_args, model_config=self.model_config)
        self.tp_worker = _worker(self, cfg)

    Scheduler.init_tp_model_worker = init_tp_model_worker
    return Scheduler(args, ports, 0, 0, 0, 0, 0, 0, None)


def set_receiver(scheduler: Scheduler, receive) -> None:
    """Route the loop's per-iteration receive (``Scheduler.recv_requests``) to ``receive``."""
    Scheduler.recv_requests = lambda self: receive(None)


def set_output(scheduler: Scheduler, record) -> None:
    """Route what the scheduler sends to the detokenizer and the tokenizer to ``record``."""
    scheduler.send_to_detokenizer.send_output = lambda out, *a, **k: record(out)
    scheduler.send_to_tokenizer.send_output = lambda out, *a, **k: record(out)


def req_kv(req):
    """A request's KV fields live on the request itself in this release."""
    return req


def fill_len(req) -> int:
    return len(req.fill_ids)


def swa_evicted(kv) -> int:
    return 0  # no hybrid SWA pool on this target yet


def session_slots(scheduler: Scheduler, refused: frozenset = frozenset()) -> dict:
    """Session id → (its record, the node its turn-1 tree lock holds, or None). A slot copies a
    turn's lengths at finish and back at the next turn's match; a slot whose row an accepted
    live turn shares has that turn as its record (the turn's lengths are the row's); a request
    its session refused is never the slot's turn, even when 0.5.10.post1 restores the slot
    into it (then both own the row, and the census says so)."""
    tree = scheduler.tree_cache
    slots = getattr(getattr(tree, "session", tree), "slots", {})  # 0.5.11 radix: embedded
    live = [r for r in reader.live_requests(scheduler) if reader.trace_rid(r) not in refused]
    found = {}
    for sid, slot in slots.items():
        turns = [r for r in live if _turn_of(r, sid) and r.req_pool_idx == slot.req_pool_idx]
        record = turns[0] if turns and slot.req_pool_idx is not None else slot
        node = slot.last_node
        locked = None if node is None or node.parent is None else node.id
        found[sid] = (record, locked)
    return found


def _turn_of(req, session_id: str) -> bool:
    session = getattr(req, "session", None)
    return session is not None and session.streaming and session.session_id == session_id


def sessions(scheduler: Scheduler) -> list:
    return list(scheduler.session_controller.sessions.values())


def record_checks(scheduler: Scheduler, sink: list) -> None:
    """SGLang's idle checks (its pool sum, its request-pool count) go to ``sink``."""
    real = scheduler_runtime_checker_mixin.raise_error_or_warn

    def recording(obj, strict, counter_name, message, log_interval=1000):
        sink.append(str(message).strip())
        real(obj, False, counter_name, message, log_interval)

    scheduler_runtime_checker_mixin.raise_error_or_warn = recording


def busy_check(scheduler: Scheduler) -> str | None:
    """SGLang's busy check (``self_check_during_busy``): its assertion's message, or None."""
    try:
        scheduler.self_check_during_busy()
    except AssertionError as exc:
        return str(exc)
    return None


RETRACTS = shim_common.RetractCounter(ScheduleBatch)


def retracted(scheduler: Scheduler) -> int:
    return RETRACTS.count


def generate_input(op: dict) -> io_struct.TokenizedGenerateReqInput:
    session = op.get("session")
    return io_struct.TokenizedGenerateReqInput(
        rid=op["rid"],
        input_text=None,
        input_ids=list(op["input_ids"]),
        mm_inputs=None,
        sampling_params=shim_common.sampling_params(op, SamplingParams),
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


def tree_nodes(scheduler: Scheduler) -> list:
    """(id, parent id or -1, key length, value slots, lock_ref) of every node, root first;
    empty for the chunk cache."""
    tree = scheduler.tree_cache
    root = getattr(getattr(tree, "inner", tree), "root_node", None)  # 0.5.11 may wrap it
    if root is None:
        return []
    found, stack = [], [root]
    while stack:
        node = stack.pop()
        value = [] if node.value is None else torch.as_tensor(node.value).long().tolist()
        parent = -1 if node.parent is None else node.parent.id
        found.append(
            (node.id, parent, 0 if node.key is None else len(node.key), value, node.lock_ref)
        )
        stack.extend(node.children.values())
    return found


def free_pages(scheduler: Scheduler) -> list[int]:
    """Free page ids (with page size 1, the free slots), the release list included."""
    allocator = scheduler.token_to_kv_pool_allocator
    return torch.cat((allocator.free_pages, allocator.release_pages)).long().tolist()


def record_refusals(refused: set) -> None:
    shim_common.record_refusals(session_controller.Session, refused)


def set_clock(now) -> None:
    shim_common.set_clock([scheduler_module, session_controller], now)
