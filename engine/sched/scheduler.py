"""Scheduler: the loop that admits, batches, runs and retires requests (SGLang
``managers/scheduler.py``: ``get_next_batch_to_run``, ``get_new_batch_prefill``,
``update_running_batch``, ``event_loop_normal`` / ``event_loop_overlap``, and
``scheduler_output_processor_mixin.py``).

Keeps: every request is in exactly one place — the waiting queue, the running batch, the
in-flight chunk (``chunked_req``, at most one), a launched batch, or finished; its KV is given
back only through ``release_kv_cache`` (finished: inserted; retracted: freed, and the request
re-queued), and a request finished before admission (input too long, aborted while waiting)
never touched memory. Deterministic: no threads, no clock, no hash-order iteration.

One iteration (``step``), as SGLang runs it:
    normal:  schedule N → forward N → process N
    overlap: schedule N+1 → forward N+1 → process N   (N+1 was prepared — decode
             ``committed += 1`` — before N's tokens were seen, so a request that N finishes
             has already claimed, and N+1 has written, the KV of its last token; N+1's inputs
             come from ``last_tokens``, SGLang's future map)

Deliberate differences from SGLang 0.5.11 (each keeps memory safe where SGLang would crash or
spin): a mixed batch is formed only if the decode step's memory is there (SGLang's
``alloc_for_decode`` would raise); the delayed token of a request finished inside a mixed
overlap batch is not freed again (``kv_committed_len`` already covers it); a too-long prompt
is finished before any prefill (SGLang prefills a 1-token stand-in); a continuing chunk the
pool cannot take this round waits (SGLang asserts it fits; adder.deferred).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import replace
from functools import partial

from engine.config import EngineConfig
from engine.memory import KVMemory
from engine.model.runner import ForwardOutput
from engine.request import FinishReason, Req
from engine.sched.batch import ScheduleBatch
from engine.sched.decode import DecodePolicy, decode_fits
from engine.sched.estimate import AllocEstimate
from engine.sched.prefill_adder import AddReqResult, PrefillAdder
from engine.sched.retract import release_kv, retract_decode
from engine.sched.stats import SchedulerError, SchedulerStats, StepOutcome, count_batch
from engine.sched.wedge import WedgeBreaker, reclaim_slot
from engine.view import ReleasedView

Emit = Callable[[str], None]


class Scheduler:
    """SGLang's scheduler over one KVMemory; ``policy`` runs the model and decides how a decode
    step is taken (plain or speculative); ``emit`` reports events."""

    def __init__(
        self, config: EngineConfig, mem: KVMemory, policy: DecodePolicy, emit: Emit
    ) -> None:
        self.config, self.mem, self.policy, self.emit = config, mem, policy, emit
        self.overlap = config.enable_overlap
        self.waiting_queue: list[Req] = []
        self.running_batch = ScheduleBatch()
        self.cur_batch: ScheduleBatch | None = None
        self.last_batch: ScheduleBatch | None = None
        self.chunked_req: Req | None = None
        self.result_queue: deque[tuple[ScheduleBatch, ForwardOutput]] = deque()
        self.last_tokens: dict[Req, int] = {}  # latest sampled token per request (future map)
        self.finished_reqs: list[Req] = []  # drained by the engine
        self.released: list[ReleasedView] = []  # every release of the current iteration
        self.new_token_ratio = config.init_new_token_ratio
        self.forward_ct = 0
        self.wedge = WedgeBreaker()  # pinned sessions cannot wedge the loop (wedge.py)
        self.estimate = AllocEstimate(mem)  # what this iteration's batch was decided on
        self.stats = SchedulerStats()

    # ---- requests in and out ----

    def add_request(self, req: Req) -> None:
        """Validate the prompt length (too long: aborted with status 400, before any KV is
        touched), clip ``max_new_tokens`` to the context, queue the request."""
        limit, n = self.config.max_req_input_len, len(req.origin_input_ids)
        if n >= limit and not req.finished():
            req.set_finish_with_abort(
                f"Input length ({n} tokens) exceeds the maximum allowed length ({limit} tokens). "
                "Use a shorter input.",
                400,
            )
        if req.finished():  # too long, or rejected by its session
            self._retire(req)
            return
        room = self.config.max_req_len - n - 1
        if req.sampling_params.max_new_tokens > room:
            req.sampling_params = replace(req.sampling_params, max_new_tokens=room)
        self.waiting_queue.append(req)

    def abort(self, rid: str) -> bool:
        """A waiting request is popped and finished at once; a running one gets ``to_finish``
        and is released by the normal path after its next forward. False if unknown."""
        for i, req in enumerate(self.waiting_queue):
            if req.rid == rid:
                del self.waiting_queue[i]
                req.set_finish_with_abort("Abort in waiting queue", None)
                self._retire(req)
                return True
        for req in self.live_reqs():
            if req.rid == rid and not req.finished():
                req.to_finish = FinishReason.of_abort("Abort running request", None)
                return True
        return False

    def _retire(self, req: Req) -> None:
        self.finished_reqs.append(req)
        self.last_tokens.pop(req, None)
        self.stats.finished_reqs += 1
        self.stats.cached_tokens += req.cached_tokens
        if req.finished_reason is not None and req.finished_reason.kind == "abort":
            self.stats.aborted_reqs += 1

    # ---- the loop ----

    def step(self) -> StepOutcome:
        """One loop iteration; emits schedule/forward/process/idle as they happen, then step.
        Idle is declared (SGLang's idle check) on an iteration that has nothing to launch and
        nothing left to process."""
        self.stats.iterations += 1  # every event of this iteration carries its number
        self.released = []
        self.estimate.begin()
        batch = self.get_next_batch_to_run()
        self.cur_batch = batch
        processed = False
        if batch is not None:
            out = self._run_batch(batch)
            if self.overlap:
                self.result_queue.append((batch.copy(), out))
            else:
                self._process(batch, out)
                processed = True
        if self.overlap and self.last_batch is not None:
            self._process(*self.result_queue.popleft())
            processed = True
        idle = batch is None and not processed and self.is_fully_idle()
        relieved = self.wedge.after(self, batch is None and not processed)
        if idle:
            self.new_token_ratio = self.config.init_new_token_ratio
            self.emit("idle")
        self.last_batch = batch
        self.stats.evicted_tokens = self.mem.evicted_tokens
        self.emit("step")
        return StepOutcome(batch is not None, processed, idle, relieved)

    def is_fully_idle(self) -> bool:
        """Nothing waiting, running, chunked, launched or left to process — including a
        last (mixed) prefill batch whose requests are not yet merged into the running batch."""
        pending_merge = self.last_batch is not None and any(
            not r.finished() for r in self.last_batch.reqs
        )
        return (
            not self.waiting_queue
            and self.running_batch.is_empty()
            and self.chunked_req is None
            and not pending_merge
            and not self.result_queue
        )

    def _run_batch(self, batch: ScheduleBatch) -> ForwardOutput:
        self.emit("schedule")
        assert batch.forward is not None
        out = self.policy.forward(batch.forward)
        self.stats.spec_accept_hist = self.policy.accept_hist  # the verify's, as it happens
        self.forward_ct += 1
        fb = batch.forward
        for req, token, sample in zip(fb.reqs, out.next_token_ids.tolist(), fb.sample):
            if sample:
                self.last_tokens[req] = token
        count_batch(self.stats, batch, self.forward_ct)
        self.emit("forward")
        return out

    # ---- scheduling ----

    def get_next_batch_to_run(self) -> ScheduleBatch | None:
        """Stash the in-flight chunk, merge the last prefill into the running batch, then a
        new prefill batch if one can be formed, else the next decode step."""
        exclude: list[Req] = []
        if self.chunked_req is not None:
            exclude.append(self.chunked_req)
            inflight = self.chunked_req.extend_input_len if self.config.enable_overlap else 0
            self.mem.checkpoint(self.chunked_req, chunked=True, reads_back=inflight)  # row kept
        last = self.last_batch
        if last is not None and last.is_extend:
            if last.chunked_req is not None:
                exclude.append(last.chunked_req)
            last_bs = last.batch_size()
            last.filter_batch(exclude)
            if last.batch_size() < last_bs:
                self.running_batch.batch_is_full = False
            if not last.is_empty():
                if self.running_batch.is_empty():
                    self.running_batch = last
                else:
                    self.running_batch.merge_batch(last)
        if self.running_batch.is_prefill_only:
            # its requests finish at their prefill's result: none ever decodes (SGLang)
            self.running_batch.filter_batch()
        if self.running_batch.is_empty():
            # nothing runs, so a 'full' verdict is stale: a session close, abort or flush may
            # have freed the memory since (SGLang resets it likewise — "otherwise it hangs")
            self.running_batch.batch_is_full = False
        new_batch = self.get_new_batch_prefill()
        if new_batch is not None:
            return new_batch
        if self.running_batch.is_empty() or self.running_batch.is_prefill_only:
            return None
        self.running_batch = self.update_running_batch(self.running_batch)
        return None if self.running_batch.is_empty() else self.running_batch

    def get_new_batch_prefill(self) -> ScheduleBatch | None:
        running = self.running_batch
        if (running.batch_is_full or not self.waiting_queue) and self.chunked_req is None:
            return None
        running_bs = running.batch_size()
        if self.config.running_limit - running_bs <= 0 and self.chunked_req is None:
            running.batch_is_full = True
            return None
        adder = self._make_adder(running_bs)
        if self.chunked_req is not None:
            self.chunked_req.init_next_round_input()
            self.chunked_req = adder.add_chunked_req(self.chunked_req)
            if adder.deferred:  # no room for the chunk: the decode step runs instead
                self.stats.chunk_deferred_at = self.stats.iterations
                return None
        self._admit_waiting(adder)
        can_run = adder.can_run_list
        if not can_run:
            return None
        admitted = set(can_run)
        self.waiting_queue = [r for r in self.waiting_queue if r not in admitted]
        if adder.new_chunked_req is not None:
            if self.chunked_req is not None:  # INV-CHUNKED-SINGLE
                raise SchedulerError(
                    f"second chunked request {adder.new_chunked_req.rid} while "
                    f"{self.chunked_req.rid} is in flight"
                )
            self.chunked_req = adder.new_chunked_req
        if self.chunked_req is not None:
            self.chunked_req.is_chunked += 1
        new_batch = ScheduleBatch(list(can_run), chunked_req=self.chunked_req)
        new_batch.is_prefill_only = self.policy.spec_mode == "off" and all(
            r.sampling_params.max_new_tokens == 0 for r in can_run
        )
        new_batch.prepare_for_extend(self.mem)
        self.estimate.prefill = adder.charged_tokens
        self._maybe_mix(new_batch)
        return new_batch

    def _make_adder(self, running_bs: int) -> PrefillAdder:
        cfg = self.config
        mixed = running_bs if cfg.enable_mixed_chunk else 0
        return PrefillAdder(
            self.mem,
            self.running_batch.reqs,
            self.new_token_ratio,
            cfg.max_prefill_tokens,
            cfg.chunked_prefill_size,
            mixed,
            cfg.clip_max_new_tokens,
        )

    def _admit_waiting(self, adder: PrefillAdder) -> None:
        """Offer the waiting requests in queue order (FCFS) until a budget runs out."""
        running = self.running_batch
        for req in self.waiting_queue:
            if len(adder.can_run_list) >= self.config.running_limit - running.batch_size():
                running.batch_is_full = True
            if running.batch_is_full:
                break
            req.init_next_round_input(self.mem)
            res = adder.add_one_req(req, has_chunked_req=self.chunked_req is not None)
            if res is not AddReqResult.CONTINUE:
                if res is AddReqResult.NO_TOKEN:
                    running.batch_is_full = True
                break

    def _maybe_mix(self, new_batch: ScheduleBatch) -> None:
        """Mixed chunk: the running requests' decode step rides in the prefill batch — only
        when that step's memory is there (no retract can happen here)."""
        running = self.running_batch
        mixes = self.config.enable_mixed_chunk and self.policy.mixes_chunks  # never with EAGLE
        if not mixes or running.is_empty():
            return
        if any(r.return_logprob for r in new_batch.reqs + running.reqs):
            return
        running.filter_batch()
        if not running.is_empty():
            if not decode_fits(self.mem, self.policy, running.reqs, self.estimate):
                return
            running.prepare_for_decode(self.policy, self.last_tokens)
            new_batch.mix_with_running(running)
        self.running_batch = ScheduleBatch(batch_is_full=running.batch_is_full)

    def update_running_batch(self, batch: ScheduleBatch) -> ScheduleBatch:
        """Drop finished requests; retract if the next decode step does not fit (or a
        test retract is due); otherwise decay the new-token ratio; prepare the decode."""
        cfg = self.config
        initial_bs = batch.batch_size()
        batch.filter_batch()
        if batch.is_empty():
            batch.batch_is_full = False
            return batch
        forced = cfg.test_retract and self.forward_ct % cfg.test_retract_interval == 0
        if not decode_fits(self.mem, self.policy, batch.reqs, self.estimate) or forced:
            steps, reclaim = cfg.retract_decode_steps, partial(reclaim_slot, self)
            retracted, self.new_token_ratio = retract_decode(
                batch, self.mem, self.policy, steps, self.released, reclaim, self.estimate
            )
            self.stats.retract_rounds += bool(retracted)
            self.stats.retracted_reqs += len(retracted)
            for req in retracted:
                self.last_tokens.pop(req, None)
                self.waiting_queue.append(req)
        else:
            self.new_token_ratio = max(
                self.new_token_ratio - cfg.new_token_ratio_decay, cfg.min_new_token_ratio
            )
        if batch.batch_size() < initial_bs:
            batch.batch_is_full = False
        batch.prepare_for_decode(self.policy, self.last_tokens)
        return batch

    # ---- results ----

    def _process(self, batch: ScheduleBatch, out: ForwardOutput) -> None:
        if batch.is_extend:
            self._process_prefill(batch, out)
        else:
            self.policy.process_decode(batch.reqs, out, self._release)
        self.emit("process")

    def _process_prefill(self, batch: ScheduleBatch, out: ForwardOutput) -> None:
        """Append each request's first (or next, for mixed decodes) token; a non-final chunk
        only counts down; finished requests are released, the rest checkpointed."""
        decoding, fb = set(batch.decoding_reqs or ()), batch.forward
        for i, (req, token, logprob) in enumerate(
            zip(batch.reqs, out.next_token_ids.tolist(), out.next_token_logprobs.tolist())
        ):
            if req.is_retracted or req.finished():  # overlap: retracted/finished meanwhile
                continue
            prompt_logprobs = out.input_token_logprobs[i] if req.return_logprob else None
            if prompt_logprobs is not None and fb is not None:
                first = max(int(fb.prefix_lens[i]), req.logprob_start_len)
                req.take_input_logprobs(prompt_logprobs, first)
            if req.is_chunked > 0:
                req.is_chunked -= 1
                continue
            req.append_output(token, logprob)
            req.check_finished()
            if req.finished():
                self._release(req)
            elif req not in decoding:
                self.mem.checkpoint(req)

    def _release(self, req: Req) -> None:
        """A finished request: its reservation given back (``before_release``), then its KV
        released (inserted into the cache) and its result retired."""
        self.policy.before_release(req)
        release_kv(self.mem, req, True, self.released)
        self._retire(req)

    # ---- introspection ----

    def live_reqs(self) -> list[Req]:
        """Requests that may own KV: waiting ones with a row, the in-flight chunk, the
        running batch and every launched batch (deduplicated, in that order)."""
        found = [r for r in self.waiting_queue if r.req_pool_idx is not None]
        if self.chunked_req is not None:
            found.append(self.chunked_req)
        found += self.running_batch.reqs
        seen = set(found)  # a Req hashes (and compares) by identity
        if len(seen) != len(found):
            found = list(dict.fromkeys(found))
        listed = [self.running_batch.reqs]
        for batch in (self.cur_batch, self.last_batch, *(q for q, _ in self.result_queue)):
            # a list equal to one taken adds nothing (a decode batch's is the running batch's)
            if batch is not None and batch.reqs not in listed:
                listed.append(batch.reqs)
                if more := list(dict.fromkeys([r for r in batch.reqs if r not in seen])):
                    seen.update(more)
                    found += more
        return found

    def flush_cache(self) -> bool:
        """Drop the whole prefix cache and reset the pools — only when fully idle."""
        if not self.is_fully_idle():
            return False
        self.cur_batch = self.last_batch = None
        self.mem.tree_cache.reset()
        self.mem.req_to_token_pool.clear()
        self.mem.allocator.clear()
        self.last_tokens.clear()
        return True
