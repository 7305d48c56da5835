"""The anchor workload on SGLang's REAL memory path (no model): the pools, allocators and default
tree cache of the installed release, driven through `match`, `lock`, `alloc_for_extend`,
`checkpoint_kv_cache`, `alloc_for_decode` and `release_kv_cache` by an FCFS loop, and SGLang's own
checks (`SchedulerInvariantChecker`) timed apart from the steps. Runs inside the sglang venv;
imports nothing of kvspec (anchor.py is the entry point).

Keeps: the workload kvspec's `bench anchor` replays exactly (invariants/bench/anchor.py and
scenarios/workload.py: the same seeded trace, pool, gate and step), so the two speeds compare
like with like. One STEP = admit waiting requests (match + lock, one `alloc_for_extend` over the
new ones, their first token, checkpoint) + one `alloc_for_decode` round over the running batch
+ release of the requests that reached their length. The timed window is the steps that start
while requests still wait (the drain tail runs and is checked, untimed).
"""

from __future__ import annotations

import time
from array import array
from types import SimpleNamespace

import numpy as np
import torch
from sglang.srt.disaggregation.utils import DisaggregationMode
from sglang.srt.managers.schedule_batch import FINISH_LENGTH, Req
from sglang.srt.managers.scheduler_components.invariant_checker import SchedulerInvariantChecker
from sglang.srt.managers.scheduler_components.pool_stats_observer import (
    SchedulerPoolStatsObserver,
)
from sglang.srt.mem_cache.allocation import alloc_for_decode, alloc_for_extend
from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.common import checkpoint_kv_cache, release_kv_cache
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.mem_cache.radix_cache import RadixCache
from sglang.srt.mem_cache.unified_cache.components import ComponentType
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
from sglang.srt.sampling.sampling_params import SamplingParams

VOCAB = 32000
N_SYSTEM_PROMPTS, SYSTEM_PROMPT_LEN = 8, 256
SUFFIX_MIN, SUFFIX_MAX = 32, 512
GEN_MIN, GEN_MAX = 16, 64
MAX_PREFILL_TOKENS = 16384  # SGLang's default --max-prefill-tokens
PER_REQ_POOL_TOKENS = 640  # the pool: the shared prompts + 640 tokens per batch slot
MAX_CONTEXT = SYSTEM_PROMPT_LEN + SUFFIX_MAX + GEN_MAX + 64
COUNTS = ("steps", "prefills", "finishes", "hit_tokens", "extend_tokens")
PHASES = ("step", "prefill", "decode", "conserv", "page")  # timed: the step, its parts, checks


def ceil_to(x: int, p: int) -> int:
    return (x + p - 1) // p * p


def pool_tokens(batch: int) -> int:
    return ceil_to(N_SYSTEM_PROMPTS * SYSTEM_PROMPT_LEN + PER_REQ_POOL_TOKENS * batch, 16)


def make_trace(seed: int, n: int) -> list:
    """``n`` requests: (system prompt id, input ids, length, output ids); a function of seed."""
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(1, VOCAB, SYSTEM_PROMPT_LEN).tolist() for _ in range(N_SYSTEM_PROMPTS)]
    trace = []
    for _ in range(n):
        s = int(rng.integers(0, N_SYSTEM_PROMPTS))
        u = int(rng.integers(SUFFIX_MIN, SUFFIX_MAX + 1))
        g = int(rng.integers(GEN_MIN, GEN_MAX + 1))
        ids = prompts[s] + rng.integers(1, VOCAB, u).tolist()
        trace.append((s, ids, g, rng.integers(1, VOCAB, g).tolist()))
    return trace


def make_reqs(trace: list) -> list:
    out = []
    for i, (_s, ids, g, outs) in enumerate(trace):
        params = SamplingParams(max_new_tokens=g)
        req = Req(
            rid=f"r{i}",
            origin_input_text="",
            origin_input_ids=array("q", ids),
            sampling_params=params,
        )
        req._bench_g, req._bench_outs = g, outs
        out.append(req)
    return out


def pools(page_size: int, batch: int, tokens: int) -> tuple:
    """The release's KV pool, its (paged) allocator and the request rows of one config."""
    kv = MHATokenToKVPool(
        size=tokens,
        page_size=page_size,
        dtype=torch.float16,
        head_num=1,
        head_dim=8,
        layer_num=1,
        device="cpu",
        enable_memory_saver=False,
    )
    paged = {"page_size": page_size} if page_size > 1 else {}
    kind = PagedTokenToKVPoolAllocator if page_size > 1 else TokenToKVPoolAllocator
    alloc = kind(
        size=tokens, dtype=torch.float16, device="cpu", kvcache=kv, need_sort=False, **paged
    )
    rows = ReqToTokenPool(
        size=batch + 8, max_context_len=MAX_CONTEXT, device="cpu", enable_memory_saver=False
    )
    return kv, alloc, rows


class Stack:
    """The release's pools, tree cache and invariant checker, sized for one configuration."""

    def __init__(self, cache_kind: str, page_size: int, batch: int, tokens: int) -> None:
        self.page_size, self.pool_tokens = page_size, tokens
        self.kv, self.alloc, self.rpool = pools(page_size, batch, tokens)
        params = CacheInitParams(
            disable=False,
            req_to_token_pool=self.rpool,
            token_to_kv_pool_allocator=self.alloc,
            page_size=page_size,
        )
        if cache_kind == "unified":
            params.tree_components = (ComponentType.FULL,)  # what the default factory builds
        self.cache = UnifiedRadixCache(params) if cache_kind == "unified" else RadixCache(params)
        core = getattr(self.cache, "tree_core", None)
        self.tree_core = type(core).__name__ if core is not None else "python TreeNode tree"
        self.evict_calls = self.evicted_tokens = 0
        self._count_evictions()
        self.running_view = SimpleNamespace(reqs=[])  # stands for last_batch and running_batch
        self.checker = self._checker()

    def _count_evictions(self) -> None:
        """Wrap the entry the allocator calls when it runs short, to count what it evicts."""
        inner = self.cache.evict_for_alloc

        def counting(params, *args, **kwargs):
            result = inner(params, *args, **kwargs)
            n = getattr(result, "num_tokens_evicted", 0) or 0
            if n:
                self.evict_calls += 1
                self.evicted_tokens += n
            return result

        self.cache.evict_for_alloc = counting

    def _checker(self) -> SchedulerInvariantChecker:
        """SGLang's own invariant checker, built standalone over this stack."""
        tokens = self.pool_tokens
        shared = dict(
            tree_cache=self.cache,
            token_to_kv_pool_allocator=self.alloc,
            req_to_token_pool=self.rpool,
            is_hybrid_swa=False,
            is_hybrid_ssm=False,
            full_tokens_per_layer=tokens,
            swa_tokens_per_layer=None,
            max_total_num_tokens=tokens,
        )
        observer = SchedulerPoolStatsObserver(
            session_controller=SimpleNamespace(sessions={}),
            hisparse_coordinator=None,
            enable_hisparse=False,
            **shared,
        )
        return SchedulerInvariantChecker(
            disaggregation_mode=DisaggregationMode.NULL,
            page_size=self.page_size,
            pool_stats_observer=observer,
            get_last_batch=lambda: self.running_view,
            get_running_batch=lambda: self.running_view,
            scheduler_stage_metrics=None,
            **shared,
        )

    def fake_batch(self, reqs: list, **fields) -> SimpleNamespace:
        """The fields of a ScheduleBatch the allocation functions read."""
        return SimpleNamespace(
            reqs=reqs,
            tree_cache=self.cache,
            req_to_token_pool=self.rpool,
            device="cpu",
            hisparse_coordinator=None,
            maybe_evict_swa=lambda: None,
            is_dllm=lambda: False,
            model_config=SimpleNamespace(is_encoder_decoder=False),
            **fields,
        )


class AnchorRun:
    """The whole trace through the memory path once; ``checks`` ("conserv", "page") run after
    every step, timed apart from it; ``inject(step, stack, running)`` plants a fault."""

    def __init__(self, st: Stack, reqs: list, batch: int, checks=(), inject=None) -> None:
        self.st, self.batch, self.checks, self.inject = st, batch, checks, inject
        self.waiting, self.running = list(reversed(reqs)), []  # pop() from the end: FCFS
        self.reserve = 0  # decode tokens still owed to running requests
        self.counts = dict.fromkeys(COUNTS, 0)
        self.window = dict.fromkeys(("steps", "decode_tokens", *PHASES), 0)  # ns per phase

    def run(self) -> dict:
        """Every step to idle, then the result (SGLang's idle sums asserted)."""
        clock = time.perf_counter_ns
        while self.waiting or self.running:
            timed, t0 = bool(self.waiting), clock()
            self.admit()
            t_admit, n_decode = clock(), len(self.running)
            t_alloc = self.decode(clock)
            t_step = clock()
            self.after_step()
            if "conserv" in self.checks:
                self.st.checker.self_check_during_busy()  # asserts SGLang's busy sum
            t_conserv = clock()
            if "page" in self.checks:
                self.st.checker._check_kv_page_invariants()  # use-after-free, double free
            t_page = clock()
            if timed:
                phases = (t0, t_admit, t_alloc, t_step, t_conserv, t_page)
                self.count_window(n_decode, phases)
        st = self.st
        assert st.alloc.available_size() + st.cache.evictable_size() == st.pool_tokens, "leak"
        assert st.cache.protected_size() == 0, "lock leak at idle"
        return self.result()

    def after_step(self) -> None:
        self.counts["steps"] += 1
        if self.inject is not None:
            self.inject(self.counts["steps"], self.st, self.running)
        self.st.running_view.reqs = self.running

    def count_window(self, n_decode: int, marks: tuple) -> None:
        """A timed step: ``marks`` = its start, and the end of admission, of the decode
        allocation, of the step, of the conservation check, of the page check (ns)."""
        t0, t_admit, t_alloc, t_step, t_conserv, t_page = marks
        spans = (t_step - t0, t_admit - t0, t_alloc - t_admit)
        spans += (t_conserv - t_step, t_page - t_conserv)
        w = self.window
        w["steps"] += 1
        w["decode_tokens"] += n_decode
        for name, ns in zip(PHASES, spans):
            w[name] += ns

    def admit(self) -> None:
        """PrefillAdder's stand-in: FCFS under a prefill budget and a memory gate, each new
        request matched and locked; one `alloc_for_extend`; first token; checkpoint."""
        if not self.waiting or len(self.running) >= self.batch:
            return
        new = self.take_waiting()
        if not new:
            return
        seq = [r.extend_end for r in new]
        prefix_lens, extend_lens = [r.prefix_len for r in new], [r.extend_len for r in new]
        batch = self.st.fake_batch(
            new,
            prefix_lens=prefix_lens,
            extend_lens=extend_lens,
            seq_lens=torch.tensor(seq, dtype=torch.int64),
            seq_lens_cpu=torch.tensor(seq, dtype=torch.int64),
            extend_num_tokens=sum(extend_lens),
        )
        alloc_for_extend(batch)  # SGLang's own: evict + alloc + rows
        for req, prefix, extend in zip(new, prefix_lens, extend_lens):
            req.output_ids.append(req._bench_outs[0])  # the token the prefill sampled
            checkpoint_kv_cache(req, self.st.cache)  # unfinished: publish the prompt
            self.counts["hit_tokens"] += prefix
            self.counts["extend_tokens"] += extend
        self.counts["prefills"] += len(new)
        self.running.extend(new)

    def take_waiting(self) -> list:
        """The waiting requests that fit this round (matched for real, then locked)."""
        st, ps, new = self.st, self.st.page_size, []
        budget, room = MAX_PREFILL_TOKENS, st.alloc.available_size() + st.cache.evictable_size()
        room -= self.reserve
        while self.waiting and len(self.running) + len(new) < self.batch:
            req = self.waiting[-1]
            req.init_next_round_input(st.cache)  # SGLang's own match_kv_cache
            extend = len(req.full_untruncated_fill_ids) - req.prefix_len
            need = ceil_to(extend, ps) + ceil_to(req._bench_g, ps) + ps
            if new and (extend > budget or need > room):
                break
            if not new and need > room:
                if self.running:
                    break  # wait for finishes
                raise RuntimeError("pool too small for a single request")
            self.waiting.pop()
            req.extend_end = len(req.full_untruncated_fill_ids)
            req.lock = st.cache.lock(req.last_node)  # what PrefillAdder does
            new.append(req)
            budget, room = budget - extend, room - need
            self.reserve += ceil_to(req._bench_g, ps) + ps
        return new

    def decode(self, clock) -> int:
        """One `alloc_for_decode` round over the running batch, then each request's token
        (a request at its length finishes: `release_kv_cache`); when the round's allocation
        ended (ns)."""
        if not self.running:
            return clock()
        st, running = self.st, self.running
        seq = torch.tensor([r.kv.kv_committed_len for r in running], dtype=torch.int64)
        rows = torch.tensor([r.kv.req_pool_idx for r in running], dtype=torch.int64)
        batch = st.fake_batch(
            running,
            seq_lens=seq,
            seq_lens_cpu=seq.clone(),
            req_pool_indices=rows,
            req_pool_indices_cpu=rows.clone(),
        )
        alloc_for_decode(batch, token_per_req=1)  # SGLang's own: evict + alloc + write
        allocated = clock()
        still = []
        for req in running:
            n = len(req.output_ids)
            req.output_ids.append(req._bench_outs[n])
            if n + 1 < req._bench_g:
                still.append(req)
                continue
            req.finished_reason = FINISH_LENGTH(length=n + 1)
            release_kv_cache(req, st.cache, checkpoint=True)  # insert + free + unlock
            self.reserve -= ceil_to(req._bench_g, st.page_size) + st.page_size
            self.counts["finishes"] += 1
        self.running = still
        return allocated

    def result(self) -> dict:
        w, st = self.window, self.st
        seconds = w["step"] / 1e9
        return dict(
            steps_total=self.counts["steps"],
            steps_timed=w["steps"],
            steps_per_s=w["steps"] / seconds,
            decode_tokens_per_s=w["decode_tokens"] / seconds,
            mean_batch=w["decode_tokens"] / w["steps"],
            pct_prefill=100.0 * w["prefill"] / w["step"],
            pct_decode_alloc=100.0 * w["decode"] / w["step"],
            conserv_us_per_step=w["conserv"] / 1e3 / w["steps"],
            page_us_per_step=w["page"] / 1e3 / w["steps"],
            prefills=self.counts["prefills"],
            finishes=self.counts["finishes"],
            hit_tokens=self.counts["hit_tokens"],
            extend_tokens=self.counts["extend_tokens"],
            evict_calls=st.evict_calls,
            evicted_tokens=st.evicted_tokens,
        )
