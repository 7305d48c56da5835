"""What every era's adapter shares: how a real Scheduler of one configuration is built around
the fake worker, how its state is read (through the layouts the probes found), and the trace's
ops as the release's own input objects. An era's adapter (``adapter_legacy``,
``adapter_components``, ``adapter_context``) adds how the Scheduler is launched and where its
seams and checks are.

Keeps: everything not named here or in an era's adapter is SGLang's own code running for
real; what differs between releases is a probe's answer (probes.py), never a version. Runs
inside the sglang venv; imports nothing of kvspec.

Shims (why):
1. ``Scheduler.init_tp_model_worker`` -> the fake worker (worker.py, built by pools.py): the
   model forward is the one fake on the decision path.
2. ``Scheduler.init_memory_pools`` / ``init_all_attention_backends`` / ``init_all_cuda_graphs``
   -> no-ops where the release has them (the pool_hooks probe): the fake worker builds SGLang's
   own pools itself; attention and CUDA graphs belong to the forward, which does not run.
3. The environment: ``SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python`` (a Rust TreeCore keeps
   the same counts, but its nodes cannot be listed, and the census needs every node's slots);
   ``SGLANG_ENABLE_STRICT_MEM_CHECK_*`` off (SGLang's checks are called and recorded instead).
4. SGLang's test retract hook (``TEST_RETRACT``, ``TEST_RETRACT_INTERVAL``): scheduler.py reads
   it into module globals at import, so the globals are set, not only the environment.
5. The simulated clock: ``time.monotonic`` in the scheduler and session modules reads the
   driver's clock (1 ms per iteration), so session timeouts replay.
6. SGLang's idle checks report through ``raise_error_or_warn`` in the module the checks probe
   names: recorded, never raised.
7. Speculative decoding (a config with ``speculative``, where the speculative probe says
   ``eagle-v2``): SGLang's ``--speculative-*`` flags and drafts.py's fake EAGLE worker (each
   of its shims with its reason there); request rows get SGLang's own spec headroom.
8. Hybrid SWA or MLA (a config with ``swa`` or ``mla``, where the kv_pools probe finds the
   release's pool builder): the model config, server arguments and pools are hybrid.py's and
   hybrid_pools.py's (each shim with its reason there); the full pool's counters are the
   tree's ``full_*`` ones, the SWA pool is read by hybrid_reader.py.
"""

from __future__ import annotations

import importlib
import os
from array import array

import hybrid
import hybrid_pools
import hybrid_reader
import layouts
import pools
from sglang.srt.managers import io_struct
from sglang.srt.managers import scheduler as scheduler_module
from sglang.srt.managers.schedule_batch import ScheduleBatch
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs
from wrappers import ChunkDeferrals, ClockedTime, RetractCounter, record_refusals


def environment(cfg: dict) -> dict[str, str]:
    """Shim 3: the environment SGLang reads its test hooks and backend choices from."""
    env = {
        "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND": "python",
        "SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY": "0",
        "SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE": "0",  # recorded, not raised
    }
    if cfg.get("retract_interval"):
        env["SGLANG_TEST_RETRACT"] = "1"
        env["SGLANG_TEST_RETRACT_INTERVAL"] = str(cfg["retract_interval"])
    return env


def server_args(cfg: dict) -> ServerArgs:
    """The server arguments of one configuration (SGLang's flag names)."""
    spec = {}
    if cfg.get("speculative"):
        import drafts  # only here: it imports modules a release without spec v2 lacks

        spec = drafts.server_args(cfg["speculative"], pools.MODEL)
    extra = hybrid.server_args(cfg)
    return ServerArgs(
        model_path=hybrid.model_path(cfg),
        device="cpu",
        attention_backend=extra.pop("attention_backend", "torch_native"),
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
        **spec,
        **extra,
    )


class Adapter:
    """One release's real Scheduler, built and read as its probes say (``probes``)."""

    def __init__(self, probes) -> None:
        self.probes = probes
        self.records = layouts.KvRecords(probes["req_kv"])
        self.session_controller = importlib.import_module(probes["session_module"])
        self.retracts = RetractCounter(ScheduleBatch)
        self.swa = False  # the configuration has hybrid SWA pools (set by build)

    # ---- building ----

    def build(self, cfg: dict) -> Scheduler:
        """The real Scheduler of one configuration, with only the model worker faked."""
        self.prepare(cfg)
        return self.launch(server_args(cfg))

    def prepare(self, cfg: dict) -> None:
        """Every shim of one configuration, in place before SGLang builds its Scheduler (the
        sglang-server target's scheduler process calls this, then SGLang launches it)."""
        os.environ.update(environment(cfg))
        self.swa = hybrid.kind(cfg) == "swa"
        if self.swa:
            from sglang.srt.managers.schedule_policy import PrefillAdder

            self.deferrals = ChunkDeferrals(PrefillAdder)
        interval = int(cfg.get("retract_interval") or 0)  # shim 4
        scheduler_module.TEST_RETRACT = interval > 0
        scheduler_module.TEST_RETRACT_INTERVAL = max(interval, 1)
        pools.route_allocator_kernels(self.probes["allocator_kernels"])
        hooks = self.probes["pool_hooks"]
        for name in [] if hooks == "none" else hooks.split(","):  # shim 2
            setattr(Scheduler, name, lambda self: None)
        Scheduler.init_tp_model_worker = self.worker_hook(cfg)
        if cfg.get("speculative"):
            import drafts

            runner_read = self.probes["spec_draft_runner"] == "read"
            drafts.install(Scheduler, cfg["speculative"], runner_read)

    def worker_hook(self, cfg: dict):
        """Shim 1: ``Scheduler.init_tp_model_worker`` as the fake worker's set-up."""
        adapter, probes = self, self.probes

        def init_tp_model_worker(scheduler: Scheduler) -> None:
            adapter.before_worker(scheduler)
            result = pools.batch_result_maker(probes["batch_logits"])
            if hybrid.kind(cfg) != "plain":  # shim 8
                worker = hybrid_pools.hybrid_worker(scheduler, cfg, probes, result)
            else:
                extra = pools.row_headroom(cfg, scheduler.server_args, probes)
                worker = pools.fake_worker(scheduler, cfg, probes, result, extra)
            worker.model_runner.spec_algorithm = getattr(scheduler, "spec_algorithm", None)
            scheduler.tp_worker = worker

        return init_tp_model_worker

    def before_worker(self, scheduler: Scheduler) -> None:
        """What the real worker's set-up did before its pools (an era may add to it)."""

    def launch(self, args: ServerArgs) -> Scheduler:
        raise NotImplementedError  # the era's adapter says how its Scheduler starts

    # ---- what SGLang's own checks say ----

    def record_checks(self, scheduler: Scheduler, sink: list) -> None:
        """Shim 6: SGLang's idle checks (its pool sum, its request-pool count, its page
        invariants) go to ``sink`` instead of a log line or an exception."""
        module = importlib.import_module(self.probes["checks"])
        real = module.raise_error_or_warn

        def recording(obj, strict, counter_name, message, log_interval=1000):
            sink.append(str(message).strip())
            real(obj, False, counter_name, message, log_interval)

        module.raise_error_or_warn = recording

    def record_refusals(self, refused: set) -> None:
        record_refusals(self.session_controller.Session, refused)

    def set_clock(self, now) -> None:
        """Shim 5: the scheduler's and the sessions' ``time.monotonic`` read ``now``."""
        for module in (scheduler_module, self.session_controller):
            module.time = ClockedTime(now)

    def retracted(self, scheduler: Scheduler) -> int:
        return self.retracts.count

    # ---- reading (layouts.py, by the probes' answers) ----

    def req_kv(self, req):
        return self.records(req)

    def fill_len(self, req) -> int:
        """Tokens of the request's current fill (the prompt and output, cut at this chunk)."""
        return layouts.fill_len(req, self.probes["fill"])

    def swa_evicted(self, kv) -> int:
        """The record's SWA eviction cursor (0 off hybrid SWA: nothing slides)."""
        if not self.swa:
            return 0
        return hybrid_reader.cursor(kv, self.probes["swa_cursor"])

    def chunk_deferred(self) -> bool:
        """SGLang's latest round held the continuing chunk back (hybrid SWA only)."""
        return self.swa and self.deferrals.deferred

    def tree_swa(self, scheduler: Scheduler) -> dict:
        return hybrid_reader.tree_fields(scheduler)

    def tree_swa_sizes(self, scheduler: Scheduler) -> dict:
        return hybrid_reader.tree_sizes(scheduler)

    def swa_pool(self, scheduler: Scheduler, rows: list, census_input) -> dict | None:
        """The SWA pool's view record, None off hybrid SWA (hybrid_reader.py)."""
        source, way = self.probes["swa_cursor"], self.probes["free_pages"]
        pages = lambda allocator: layouts.free_pages(allocator, way)  # noqa: E731
        return hybrid_reader.swa_pool(scheduler, rows, source, pages, census_input)

    def session_slots(self, scheduler: Scheduler, refused: frozenset = frozenset()) -> dict:
        layout = self.probes["slot_layout"]
        return layouts.session_slots(scheduler, layout, self.records, refused)

    def sessions(self, scheduler: Scheduler) -> list:
        """The open sessions (SGLang's ``Session`` objects)."""
        return list(scheduler.session_controller.sessions.values())

    def session_state(self, session, live: list) -> tuple[bool, bool]:
        return layouts.session_state(session, live, self.probes["session_flags"])

    def counters(self, scheduler: Scheduler) -> dict:
        """The allocator's and the tree's own counters, and the pool's capacity (hybrid SWA:
        the full side's, SGLang's ``_check_full_pool`` terms)."""
        tree = scheduler.tree_cache
        if hybrid_reader.is_hybrid(scheduler):
            alloc, inner = scheduler.token_to_kv_pool_allocator, hybrid_reader.inner_tree(scheduler)
            return dict(
                free=alloc.full_available_size(),
                evictable=inner.full_evictable_size(),
                protected=inner.full_protected_size(),
                capacity=alloc.size_full,
            )
        return dict(
            free=scheduler.token_to_kv_pool_allocator.available_size(),
            evictable=tree.evictable_size(),
            protected=tree.protected_size(),
            capacity=scheduler.max_total_num_tokens,
        )

    def tree_nodes(self, scheduler: Scheduler) -> list:
        return layouts.tree_nodes(scheduler)

    def free_pages(self, scheduler: Scheduler) -> list[int]:
        allocator = scheduler.token_to_kv_pool_allocator
        allocator = getattr(allocator, "full_attn_allocator", allocator)  # hybrid: full side
        return layouts.free_pages(allocator, self.probes["free_pages"])

    # ---- the trace's ops as the release's inputs ----

    def generate_input(self, op: dict) -> io_struct.TokenizedGenerateReqInput:
        session = op.get("session")
        ids = op["input_ids"]
        return io_struct.TokenizedGenerateReqInput(
            rid=op["rid"],
            input_text=None,
            input_ids=array("q", ids) if self.probes["input_ids"] == "array" else list(ids),
            input_embeds=None,
            mm_inputs=None,
            token_type_ids=None,
            sampling_params=sampling_params(op),
            return_logprob=False,
            logprob_start_len=-1,
            top_logprobs_num=0,
            token_ids_logprob=None,
            stream=False,
            session_params=None if session is None else io_struct.SessionParams(**session),
        )

    def session_input(self, op: dict):
        if op["op"] == "close_session":
            return io_struct.CloseSessionReqInput(session_id=op["session_id"])
        return io_struct.OpenSessionReqInput(
            capacity_of_str_len=100_000,
            session_id=op["session_id"],
            streaming=op.get("streaming", False),
            timeout=op.get("timeout"),
        )

    def abort_input(self, rid: str) -> io_struct.AbortReq:
        return io_struct.AbortReq(rid=rid)

    def flush_input(self) -> io_struct.FlushCacheReqInput:
        return io_struct.FlushCacheReqInput()


def sampling_params(op: dict) -> SamplingParams:
    """Greedy sampling of ``max_new_tokens`` (the fake worker picks the tokens anyway)."""
    params = SamplingParams(
        max_new_tokens=op["max_new_tokens"], temperature=0.0, ignore_eos=op["ignore_eos"]
    )
    params.normalize(None)
    params.verify(512)
    return params
