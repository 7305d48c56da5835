"""What the installed SGLang's code has, asked of the code itself: each probe is an import, a
``hasattr``, an ``inspect.signature`` or a dataclass's fields — never a version string — and
answers with one word and a one-line reason. The answers pick the adapter (its era: how the
Scheduler is launched and where its seams are) and the small switches every era shares (where
a request's KV record lives, how a session slot holds a row, …), and they are the banner's
``probes``, so a run says which code it drove and why.

Keeps: a probe that finds an internal no adapter drives raises ``Drift`` naming the attribute
or module (the banner then says ``drift``, never a traceback); a dev build of SGLang runs on
the adapter its code matches. The probe functions take SGLang's objects as arguments, so
they can be tested on stand-ins (release_probes.py asks the installed release). Runs inside
the sglang venv; imports nothing of kvspec.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
from dataclasses import dataclass

SRT = "sglang.srt."
RECEIVER = SRT + "managers.scheduler_components.request_receiver"
CHECKER = SRT + "managers.scheduler_components.invariant_checker"
MIXIN = SRT + "managers.scheduler_runtime_checker_mixin"
SESSION_MODULES = (SRT + "session.session_controller", SRT + "managers.session_controller")
SLOT_MODULES = (SRT + "session.streaming_session", SRT + "mem_cache.session_aware_cache")
POOL_HOOKS = ("init_memory_pools", "init_all_attention_backends", "init_all_cuda_graphs")


class Drift(Exception):
    """The installed SGLang has an internal no adapter drives (the message names it, and
    ``adapter``: the adapter module the era's probes chose, or ``probes`` before that)."""

    def __init__(self, message: str, adapter: str = "probes") -> None:
        super().__init__(message)
        self.adapter = adapter


@dataclass(frozen=True, slots=True)
class Found:
    """One probe's answer and the one line that says why."""

    answer: str
    why: str


@dataclass(frozen=True, slots=True)
class Probes:
    """Every probe's answer, by name, in the order they were asked."""

    found: tuple[tuple[str, Found], ...]

    def __getitem__(self, name: str) -> str:
        return dict(self.found)[name].answer

    def banner(self) -> dict[str, str]:
        """name -> "answer: why" (the banner's ``probes``)."""
        return {name: f"{f.answer}: {f.why}" for name, f in self.found}


def has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def first_module(names: tuple[str, ...]) -> str:
    """The first of ``names`` the release has; ``Drift`` naming them all when none."""
    for name in names:
        if has_module(name):
            return name
    raise Drift(f"none of the modules {', '.join(names)}")


def parameters(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


def field_names(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()


# ---- the era: how the Scheduler is launched, where its seams are ----


def launch(scheduler_cls, runtime_context) -> Found:
    """``gloo``: the 9-argument Scheduler, whose ModelRunner set torch.distributed up (the
    driver does: one gloo rank); ``context``: ranks published, the runtime bootstrapped by the
    Scheduler itself."""
    if "gpu_id" in parameters(scheduler_cls.__init__):
        why = "Scheduler.__init__ takes gpu_id and ranks: the driver inits torch.distributed"
        return Found("gloo", why + " (one gloo rank), as the model runner did")
    publish = getattr(runtime_context, "publish", None)
    if publish is None or "ranks" not in parameters(publish):
        raise Drift("Scheduler.__init__ takes no gpu_id, and runtime_context.publish no ranks=")
    if not hasattr(runtime_context, "SpawnRanks"):
        raise Drift("Scheduler.__init__ takes no gpu_id, and runtime_context has no SpawnRanks")
    why = "Scheduler.__init__ takes no gpu_id: ranks from runtime_context.publish(ranks=)"
    return Found("context", why)


def seams(scheduler_cls) -> Found:
    """Where the loop receives its requests and sends its outputs."""
    if hasattr(scheduler_cls, "recv_requests"):
        return Found("scheduler", "Scheduler.recv_requests and scheduler.send_to_* are the seams")
    if has_module(RECEIVER):
        why = "no Scheduler.recv_requests: the request_receiver and ipc_channels components"
        return Found("components", why)
    raise Drift(f"Scheduler.recv_requests, and no module {RECEIVER}")


# ---- the switches every era shares ----


def checks() -> Found:
    """The module whose ``raise_error_or_warn`` SGLang's idle checks report through."""
    if has_module(CHECKER):
        return Found(CHECKER, "the checks are a SchedulerInvariantChecker component")
    if has_module(MIXIN):
        return Found(MIXIN, "the checks are the scheduler's runtime-checker mixin")
    raise Drift(f"neither {CHECKER} nor {MIXIN}")


def page_invariants(checker_module) -> Found:
    """Whether the busy check has a page-invariant half to call."""
    checker = getattr(checker_module, "SchedulerInvariantChecker", None)
    if hasattr(checker, "_check_kv_page_invariants"):
        return Found("yes", "SchedulerInvariantChecker._check_kv_page_invariants exists")
    return Found("no", "no _check_kv_page_invariants on the invariant checker")


def pool_hooks(scheduler_cls) -> Found:
    """The Scheduler's own pool, attention and graph set-up steps the fake worker replaces."""
    present = [name for name in POOL_HOOKS if hasattr(scheduler_cls, name)]
    if not present:
        return Found("none", "the Scheduler builds no pools itself (the worker hands them over)")
    return Found(",".join(present), "Scheduler methods that would drive the real worker: no-ops")


def allocator_kernels(paged_cls) -> Found:
    """The module whose Triton allocator kernels are routed to torch code (the one binding
    them for ``PagedTokenToKVPoolAllocator``), and whose decode twin runs."""
    module = importlib.import_module(paged_cls.__module__)
    if not hasattr(module, "alloc_extend_kernel") or not hasattr(module, "alloc_extend_naive"):
        raise Drift(f"{module.__name__} binds no alloc_extend_kernel/alloc_extend_naive")
    return Found(module.__name__, "binds the paged allocator's Triton kernels")


def free_pages(allocator_cls) -> Found:
    if hasattr(allocator_cls, "get_all_free_pages"):
        return Found("get_all_free_pages", "the allocator lists its free pages itself")
    return Found("free+release", "free pages are free_pages then release_pages")


def session_flags(session_cls) -> Found:
    """Whether a session keeps its own in-flight flag and deferred close."""
    session = session_cls(capacity_of_str_len=1, session_id="kvspec-probe", streaming=True)
    if hasattr(session, "_inflight") and hasattr(session, "close_on_finish"):
        return Found("flags", "Session keeps _inflight and close_on_finish")
    return Found("liveness", "no Session._inflight: in flight while its last turn runs")


def slot_layout(slot_cls) -> Found:
    """How a streaming session's slot holds its row between turns (``SessionSlot``'s fields)."""
    fields = field_names(slot_cls)
    if "lock" in fields and "kv" in fields:
        return Found("lock", "SessionSlot keeps the turns' own KV record (kv) and a TreeLock")
    if "kv" in fields and "req_pool_idx" not in fields:
        return Found("moved", "SessionSlot keeps the turns' own KV record (kv) and last_node")
    if "kv" in fields:
        return Found("split", "SessionSlot copies a turn's row, committed length and kv apart")
    if {"req_pool_idx", "kv_allocated_len", "last_node"} <= fields:
        return Found("flat", "SessionSlot copies a turn's KV fields in and out")
    raise Drift(f"SessionSlot fields {sorted(fields)}: none of the slot layouts the driver reads")


def req_kv(schedule_batch) -> Found:
    """Where a request's KV fields (row, committed, allocated, protected) live."""
    record = getattr(schedule_batch, "ReqKvInfo", None)
    fields = field_names(record)
    if "req_pool_idx" in fields and "kv_allocated_len" in fields:
        return Found("record", "ReqKvInfo holds them all (req.kv)")
    if "kv_allocated_len" in fields:
        return Found("split", "req.kv (ReqKvInfo) holds kv_allocated_len; the rest is on Req")
    if record is None:
        return Found("flat", "no ReqKvInfo: the fields are on Req")
    raise Drift(f"ReqKvInfo fields {sorted(fields)}: no kv_allocated_len")


def fill(req_cls) -> Found:
    """How long a request's current fill is (a request no round has set up yet: as its
    release reads it — empty, or the whole prompt and output where the end is unset)."""
    if hasattr(req_cls, "set_extend_range"):
        return Found("extend_range", "the fill ends at Req.extend_range.end (None: unset)")
    if hasattr(req_cls, "get_fill_ids"):
        return Found("get_fill_ids", "Req.get_fill_ids() gives the current fill")
    return Found("fill_ids", "Req.fill_ids is the current fill")


def batch_logits(batch_result_cls) -> Found:
    """Whether a forward's result must carry a logits output: the overlap loop's
    ``copy_to_cpu`` reads its hidden states unless the caller says they are not wanted."""
    if "return_hidden_states" in parameters(batch_result_cls.copy_to_cpu):
        return Found("none", "copy_to_cpu(return_hidden_states=) skips the logits output")
    return Found("empty", "copy_to_cpu reads logits_output.hidden_states: an empty one")


def input_ids(io_struct) -> Found:
    annotation = str(io_struct.TokenizedGenerateReqInput.__annotations__.get("input_ids", ""))
    if "array" in annotation:
        return Found("array", "TokenizedGenerateReqInput.input_ids is an array('q')")
    return Found("list", f"TokenizedGenerateReqInput.input_ids is {annotation or 'a list'}")


def worker_info(runtime_context) -> Found:
    """Where TpModelWorker.get_worker_info reads the schedule limits from."""
    if hasattr(runtime_context, "get_schedule"):
        return Found("schedule", "runtime_context.get_schedule() holds the schedule limits")
    return Found("server_args", "the schedule limits are the server arguments")


def ngram(has_manager: bool, manager_cls) -> Found:
    """Whether the scheduler prepares an n-gram embedding manager every batch."""
    if not has_manager:
        return Found("none", "no NgramEmbeddingManager module")
    if "server_args" in parameters(manager_cls.from_model):
        return Found("server_args", "NgramEmbeddingManager.from_model takes server_args")
    return Found("plain", "NgramEmbeddingManager.from_model takes no server_args")


def row_zero(pool_cls) -> Found:
    """Whether a fresh ReqToTokenPool hands out row 0 (kvspec's rule says it never does)."""
    pool = pool_cls(size=2, max_context_len=4, device="cpu", enable_memory_saver=False)
    if 0 in {int(row) for row in pool.free_slots}:
        return Found("handed_out", "a fresh ReqToTokenPool(size=2).free_slots holds row 0")
    return Found("reserved", "a fresh ReqToTokenPool(size=2).free_slots lacks row 0")


def bind_threads(bootstrap) -> Found:
    if hasattr(bootstrap, "_bind_threads_if_cpu"):
        return Found("present", "bootstrap._bind_threads_if_cpu asserts NUMA facts: a no-op")
    return Found("absent", "no bootstrap._bind_threads_if_cpu")


def dp_attention(initialize_dp_attention) -> Found:
    if "model_config" in parameters(initialize_dp_attention):
        return Found("model_config", "initialize_dp_attention(server_args, model_config)")
    return Found("server_args", "initialize_dp_attention(server_args)")


def tree(has_tree_core: bool) -> Found:
    """Where a unified radix cache keeps its nodes (the reader walks whichever it meets)."""
    if has_tree_core:
        return Found("tree_core", "UnifiedRadixCache keeps its nodes in a (Python) tree_core")
    return Found("root_node", "the radix caches keep their nodes under root_node")


# ---- speculative decoding (drafts.py: the fake spec-v2 worker) ----

SPEC_NEEDS = (  # (module, attribute): what drafts.py patches or calls
    ("mem_cache.allocation", "assign_req_to_token_pool"),
    ("mem_cache.allocation_sizing", "get_alloc_len_per_decode"),
    ("mem_cache.allocation_sizing", "get_req_to_token_extra_context_len"),
    ("arg_groups.speculative_hook", "_disable_overlap_schedule_for_cpu"),
    ("managers.overlap_utils", "gather_spec_extras"),
    ("speculative.base_spec_worker", "BaseSpecWorker"),
)


def speculative(batch_result_cls, draft_input_cls) -> Found:
    """``eagle-v2`` where drafts.py's fake drives the release's EAGLE: spec v2 is its only
    EAGLE worker, and every internal drafts.py patches or builds is where it looks."""
    if has_module(SRT + "speculative.eagle_worker"):
        return Found("no", "an EAGLE v1 worker exists (spec v2 only under overlap): not faked")
    for module, name in SPEC_NEEDS:
        if not has_module(SRT + module) or not hasattr(importlib.import_module(SRT + module), name):
            return Found("no", f"no {module}.{name} (drafts.py patches or calls it)")
    missing = {"new_seq_lens", "speculative_num_draft_tokens"} - field_names(batch_result_cls)
    missing |= {"bonus_tokens", "topk_p", "topk_index"} - field_names(draft_input_cls)
    if missing:
        return Found("no", f"no {', '.join(sorted(missing))} in the spec-v2 result records")
    return Found("eagle-v2", "spec v2 is the only EAGLE worker; drafts.py's patch targets exist")


def spec_headroom(allocation_sizing) -> Found:
    """How the spec row headroom is asked for (where speculation runs)."""
    sizing = getattr(allocation_sizing, "get_req_to_token_extra_context_len", None)
    if sizing is None:
        return Found("none", "no allocation_sizing.get_req_to_token_extra_context_len")
    if "server_args" in parameters(sizing):
        return Found("server_args", "get_req_to_token_extra_context_len(server_args)")
    return Found("plain", "get_req_to_token_extra_context_len() reads the published args")


def spec_draft_runner(eagle_utils) -> Found:
    """Whether the scheduler reads a draft model runner at start (the fake then hands it a
    stand-in runner holding no KV pool)."""
    if hasattr(eagle_utils, "get_draft_recurrent_hidden_state_spec"):
        return Found("read", "eagle_utils.get_draft_recurrent_hidden_state_spec(draft_runner)")
    return Found("unread", "the draft hidden-state width comes from the draft model config")


def spec_commit(result_processor) -> Found:
    """Where a spec-v2 verify's accepted run is committed: at resolve, whole (no bonus slot
    pre-claimed at prepare, so the decode reserve holds the lag: whole pages of committed +
    2 * alloc_len) — not kvspec's own spec-v2 model."""
    processor = getattr(result_processor, "SchedulerBatchResultProcessor", None)
    if hasattr(processor, "_resolve_spec_v2_tokens"):
        why = "SchedulerBatchResultProcessor._resolve_spec_v2_tokens commits the accepted run"
        return Found("at_resolve", why + "; no worker pre-claims the bonus")
    return Found("unknown", "no SchedulerBatchResultProcessor._resolve_spec_v2_tokens")


# ---- hybrid SWA and MLA pools (hybrid_pools.py) ----


def kv_pools(configurator_cls, mixin_cls) -> Found:
    """Which of the release's own pool builders the driver runs for hybrid SWA and MLA."""
    if configurator_cls is not None and hasattr(configurator_cls, "configure"):
        return Found("configurator", "KVCacheConfigurator.configure builds SWA/MLA pools")
    if mixin_cls is not None and hasattr(mixin_cls, "init_memory_pool"):
        return Found("mixin", "ModelRunnerKVCacheMixin.init_memory_pool builds SWA/MLA pools")
    return Found("none", "no pool builder the driver runs: swa and mla are not driven")


def swa_split(mixin_cls) -> Found:
    """How ``--max-total-tokens`` and the ratio become the full and SWA pool sizes."""
    if mixin_cls is not None and hasattr(mixin_cls, "_resolve_hybrid_swa_tokens"):
        return Found("bytes", "_resolve_hybrid_swa_tokens splits the cap by bytes: fitted")
    return Found("ratio", "full = the cap, swa = full * swa_full_tokens_ratio")


def swa_cursor(req_kv_cls) -> Found:
    """Where a request's SWA eviction cursor lives."""
    if req_kv_cls is not None and hasattr(req_kv_cls, "get_evicted_seqlen"):
        return Found("component", "ReqKvInfo.get_evicted_seqlen(ComponentType.SWA)")
    return Found("field", "swa_evicted_seqlen on the request's KV record (or Req)")


def swa_check(scheduler_cls, checker_cls) -> Found:
    """Whether SGLang's busy check sums the SWA pool (0.5.10.x's does not: it sums the
    tree's ``evictable_size()``, which SWARadixCache raises on, and min(full, swa) free)."""
    if hasattr(scheduler_cls, "_check_swa_pool") or hasattr(checker_cls, "_check_swa_pool"):
        return Found("yes", "the busy check has _check_swa_pool")
    return Found("no", "the busy check is not hybrid-aware: skipped on hybrid SWA pools")
