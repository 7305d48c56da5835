"""SGLang's scheduler glue around its real memory classes (docs/targets/sglang.md).

Keeps: every memory step calls the real function the 0.5.23 scheduler calls —
the prompt-length and logprob-start checks of ``handle_generate_request`` (inlined:
``managers/utils.py`` imports einops, absent from the CPU venv),
``Session.create_req``, ``Req.init_next_round_input`` (match), ``cache.lock`` + ``extend_end``
(PrefillAdder), ``alloc_for_extend``, ``checkpoint_kv_cache`` after an unfinished prefill,
``alloc_for_decode`` (with the real ``ScheduleBatch.maybe_evict_swa`` inside),
``release_kv_cache(checkpoint=True)``, ``SessionController.close`` / ``maybe_reap``.
Faked: the ScheduleBatch (driver/stack.py), token ids (the harness's seeded draw), the
clock (a simulated one, 1 ms per iteration as kvspec's SimClock, installed into the session
controller so SGLang's own timeout code reads it), and the admission gate (the anchor's FCFS
loop: one prefill batch under a prefill-token budget and a memory gate, then one decode
round of everything running). Imports nothing of kvspec.
"""

from __future__ import annotations

from array import array
from types import SimpleNamespace

import sglang.srt.session.session_controller as session_module
import torch
from sglang.srt.managers.io_struct import CloseSessionReqInput, OpenSessionReqInput
from sglang.srt.managers.schedule_batch import FINISH_ABORT, FINISH_LENGTH, Req
from sglang.srt.mem_cache.allocation import alloc_for_decode, alloc_for_extend
from sglang.srt.mem_cache.common import checkpoint_kv_cache, release_kv_cache
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.sampling.sampling_params import SamplingParams
from stack import Stack

STEP_SECONDS = 0.001  # the simulated clock's tick per iteration (kvspec's SimClock)


def ceil_to(x: int, page: int) -> int:
    return (x + page - 1) // page * page


class _GenerateInput(SimpleNamespace):
    """Duck-typed TokenizedGenerateReqInput for ``Session.create_req``: unset fields are None."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return None


class Glue:
    """The anchor step loop over real SGLang: admit → one extend → one decode round → release."""

    def __init__(
        self,
        stack: Stack,
        batch: int,
        max_prefill_tokens: int,
        max_input_len: int,
        bos_id: int | None = None,
    ) -> None:
        self.stack, self.max_batch, self.max_prefill_tokens = stack, batch, max_prefill_tokens
        self.max_input_len = max_input_len
        self.tokenizer = SimpleNamespace(bos_token_id=bos_id)  # Session's BOS strip reads it
        self.now = 0.0
        session_module.time = SimpleNamespace(monotonic=lambda: self.now)  # SGLang's timeouts
        self.reqs: dict[str, Req] = {}  # every submitted request, in submission order
        self.rejected: set[str] = set()  # refused at submission (queued for a 1-token prefill)
        # refused after ``Session.create_req`` accepted the turn: the streaming session stays
        # in flight on it until the scheduler detaches it (the comment on 0.5.23's
        # Scheduler.retire_unadmitted_request), so it is the session's live request meanwhile
        self.turn_rejected: set[str] = set()
        self.waiting: list[Req] = []  # FCFS: admitted from the front
        self.running: list[Req] = []
        self.plan: dict[str, tuple[int, list[int]]] = {}  # rid -> (max_new_tokens, outputs)
        self.reserve = 0  # decode tokens still owed to running requests
        self.released: list[dict] = []  # this step's releases (for the view)
        self.counts = dict(
            steps=0,
            admitted=0,
            finished=0,
            aborted=0,
            cached_tokens=0,
            extend_tokens=0,
            decode_tokens=0,
            rejected=0,
        )

    # ---- ops ----------------------------------------------------------------------------
    def submit(self, op: dict) -> None:
        """A generate request, routed as ``Scheduler.handle_generate_request`` routes it."""
        rid, ids, gen = op["rid"], array("q", op["input_ids"]), op["max_new_tokens"]
        params = SamplingParams(max_new_tokens=gen, ignore_eos=op.get("ignore_eos", True))
        ref, logprob = op.get("session"), bool(op.get("return_logprob"))
        session = self.stack.sessions.get(ref["id"]) if ref else None
        if session is not None and not session.close_on_finish:
            req = session.create_req(
                _generate_input(rid, ids, params, ref, logprob), self.tokenizer, vocab_size=1 << 20
            )
        else:
            req = Req(
                rid=rid,
                origin_input_text="",
                origin_input_ids=ids,
                sampling_params=params,
                return_logprob=logprob,
            )
            if ref:
                req.set_finish_with_abort(
                    f"Invalid request: session {ref['id']} is closed or unknown"
                )
        self.plan[rid] = (gen, list(op["output_ids"]))
        self.reqs[rid] = req
        if req.to_finish is None:
            self._validate(req, op.get("logprob_start_len", -1))
            if req.to_finish is not None and session is not None and session.streaming:
                self.turn_rejected.add(rid)
        if req.to_finish is not None:
            self.rejected.add(rid)
            self.counts["rejected"] += 1
        self.waiting.append(req)  # a rejected request still runs a 1-token prefill (SGLang)

    def _validate(self, req: Req, logprob_start_len: int) -> None:
        """The prompt-length and logprob-start checks of ``handle_generate_request``."""
        if len(req.origin_input_ids) >= self.max_input_len:  # managers/utils.validate_input_length
            req.set_finish_with_abort(
                f"Input length ({len(req.origin_input_ids)} tokens) exceeds the "
                f"maximum allowed length ({self.max_input_len} tokens)"
            )
            return
        start = logprob_start_len if req.return_logprob else -1
        req.logprob_start_len = (
            len(req.origin_input_ids) if req.return_logprob and start == -1 else start
        )
        if req.logprob_start_len > len(req.origin_input_ids):
            req.set_finish_with_abort(
                f"logprob_start_len={req.logprob_start_len} is higher than the "
                f"number of input tokens {len(req.origin_input_ids)}"
            )

    def open_session(
        self, session_id: str, streaming: bool = True, timeout: float | None = None
    ) -> bool:
        answer = self.stack.sessions.open(
            OpenSessionReqInput(
                capacity_of_str_len=1 << 16,
                session_id=session_id,
                streaming=streaming,
                timeout=timeout,
            )
        )
        return bool(answer.success)

    def close_session(self, session_id: str) -> bool:
        if session_id not in self.stack.sessions:
            return False
        self.stack.sessions.close(CloseSessionReqInput(session_id=session_id))
        return True

    def abort(self, rid: str) -> bool:
        """Queued: dropped (session turn detached); running: to_finish, released next decode."""
        for req in self.waiting:
            if req.rid == rid:
                self.waiting.remove(req)
                if req.session is not None and req.session.streaming:
                    req.session.abort_req()
                req.finished_reason = FINISH_ABORT()
                self.counts["aborted"] += 1
                return True
        for req in self.running:
            if req.rid == rid and req.to_finish is None:
                req.to_finish = FINISH_ABORT()
                return True
        return False

    def unfinished(self, phase: str) -> list[str]:
        """Unfinished rids in ``phase`` (waiting | running | chunked | any), as kvspec lists
        them."""
        reqs = {
            "waiting": self.waiting,
            "running": self.running,
            "chunked": [],
            "any": list(self.reqs.values()),
        }[phase]
        return [r.rid for r in reqs if not r.finished()]

    def finished(self, rid: str) -> bool:
        req = self.reqs.get(rid)
        return req is None or req.finished()

    @property
    def idle(self) -> bool:
        deferred = any(s.close_on_finish for s in self.stack.sessions.sessions.values())
        return not self.waiting and not self.running and not deferred

    def step(self, plan: dict | None = None) -> None:
        """Reap sessions, one scheduler iteration, one clock tick (kvspec's Engine.step). No
        plan: the anchor iteration (admit → extend → decode round). A lockstep plan runs the
        batch kvspec's scheduler formed: ``extend`` of exactly ``rids``, or ``decode``."""
        self.released = []
        self.stack.sessions.maybe_reap(now=self.now, interval=-1.0)  # every iteration, as kvspec
        mode = "anchor" if plan is None else plan["mode"]
        if plan is not None:
            self._retire_rejected()
        if mode == "anchor":
            new = self._admit()
            if new:
                self._prefill(new)
            if self.running:
                self._decode()
        elif mode == "extend":
            self._prefill(self._take(plan["rids"]))
        elif mode == "decode":
            if sorted(plan["rids"]) != sorted(r.rid for r in self.running):
                raise ValueError(
                    f"lockstep decode of {sorted(plan['rids'])}, but sglang runs "
                    f"{sorted(r.rid for r in self.running)}"
                )
            self._decode()
        elif mode != "idle":
            raise ValueError(f"lockstep batch mode {mode!r}: the glue runs extend, decode or idle")
        self.counts["steps"] += 1
        self.now += STEP_SECONDS

    def _retire_rejected(self) -> None:
        """Lockstep: kvspec retires a request rejected at submission before any KV is touched
        (Scheduler.add_request), so it never plans SGLang's one-token stub prefill of it; the
        stub would finish in this iteration, so it is retired now as 0.5.23 retires a request
        refused at the door (``Scheduler.retire_unadmitted_request``, managers/scheduler.py:3455:
        a streaming session's turn detached, ``abort_req``). Left queued, it would keep its
        streaming session in flight, and SGLang would refuse the session's next turn."""
        for req in [r for r in self.waiting if r.rid in self.rejected]:
            self.waiting.remove(req)
            if req.session is not None and req.session.streaming:
                req.session.abort_req()
                req.session = None
            req.finished_reason, req.to_finish = req.to_finish, None
            self.counts["aborted"] += 1

    def _take(self, rids: list[str]) -> list[Req]:
        """The waiting requests ``rids``, matched and locked as PrefillAdder does."""
        cache, new = self.stack.cache, []
        for rid in rids:
            req = next((r for r in self.waiting if r.rid == rid), None)
            if req is None:
                raise ValueError(f"lockstep extend of {rid}, which is not waiting on sglang")
            self.waiting.remove(req)
            req.init_next_round_input(cache)
            req.extend_end = len(req.full_untruncated_fill_ids)
            req.lock = cache.lock(req.last_node)
            self.reserve += self._owed(req)
            new.append(req)
        return new

    # ---- the scheduler iteration ---------------------------------------------------------
    def _owed(self, req: Req) -> int:
        page = self.stack.page_size
        return ceil_to(self.plan[req.rid][0], page) + page

    def _admit(self) -> list[Req]:
        """FCFS under a prefill budget and a memory gate (the anchor's PrefillAdder stand-in);
        the gate holds on both pools of an SWA hybrid."""
        cache, page = self.stack.cache, self.stack.page_size
        new: list[Req] = []
        budget = self.max_prefill_tokens
        room = min(self.stack.room()) - self.reserve
        while self.waiting and len(self.running) + len(new) < self.max_batch:
            req = self.waiting[0]
            req.init_next_round_input(cache)  # real match_kv_cache (session slots lend here)
            extend = len(req.full_untruncated_fill_ids) - req.prefix_len
            need = ceil_to(extend, page) + self._owed(req)
            if need > room or (new and extend > budget):
                break  # nothing running and the head cannot fit: it waits, as SGLang's does
            self.waiting.pop(0)
            req.extend_end = len(req.full_untruncated_fill_ids)
            req.lock = cache.lock(req.last_node)  # what PrefillAdder does
            new.append(req)
            budget, room, self.reserve = (
                budget - extend,
                room - need,
                self.reserve + self._owed(req),
            )
        return new

    def _prefill(self, new: list[Req]) -> None:
        prefix_lens = [r.prefix_len for r in new]
        extend_lens = [r.extend_len for r in new]
        seq = torch.tensor([r.extend_end for r in new], dtype=torch.int64)
        alloc_for_extend(
            self.stack.batch(
                new,
                ForwardMode.EXTEND,
                prefix_lens=prefix_lens,
                extend_lens=extend_lens,
                seq_lens=seq,
                seq_lens_cpu=seq.clone(),
                extend_num_tokens=sum(extend_lens),
            )
        )
        for req, hit, extend in zip(new, prefix_lens, extend_lens):
            req.extend_batch_idx += 1
            self.counts["cached_tokens"] += hit
            self.counts["extend_tokens"] += extend
            if self._sample(req) or req.to_finish is not None:  # the token lands, then the abort
                self._release(req)
            else:
                checkpoint_kv_cache(req, self.stack.cache)  # an unfinished prefill publishes
                self.running.append(req)
        self.counts["admitted"] += len(new)

    def _decode(self) -> None:
        seq = torch.tensor([r.kv.kv_committed_len for r in self.running], dtype=torch.int64)
        rows = torch.tensor([r.kv.req_pool_idx for r in self.running], dtype=torch.int64)
        alloc_for_decode(
            self.stack.batch(
                self.running,
                ForwardMode.DECODE,
                seq_lens=seq,
                seq_lens_cpu=seq.clone(),
                req_pool_indices=rows,
                req_pool_indices_cpu=rows.clone(),
            ),
            token_per_req=1,
        )
        self.counts["decode_tokens"] += len(self.running)
        still = []
        for req in self.running:
            req.decode_batch_idx += 1
            if self._sample(req) or req.to_finish is not None:
                self._release(req)
            else:
                still.append(req)
        self.running = still

    def _sample(self, req: Req) -> bool:
        """Append the planned next token; True when the request reached its length."""
        max_new, outputs = self.plan[req.rid]
        req.output_ids.append(outputs[len(req.output_ids)])
        return len(req.output_ids) >= max_new

    def _release(self, req: Req) -> None:
        """Finish (length, or a pending abort promoted) and release with the tree checkpoint."""
        if req.to_finish is not None:
            req.finished_reason, req.to_finish = req.to_finish, None
            self.counts["aborted"] += 1
        else:
            req.finished_reason = FINISH_LENGTH(length=len(req.output_ids))
            self.counts["finished"] += 1
        self.released.append(
            dict(
                rid=req.rid,
                req_pool_idx=_row(req),
                is_insert=True,
                finished=True,
                kv_committed_len=req.kv.kv_committed_len,
                kv_allocated_len=req.kv.kv_allocated_len,
                cache_protected_len=req.kv.cache_protected_len,
                origin_len=len(req.origin_input_ids),
                num_output=len(req.output_ids),
            )
        )
        release_kv_cache(req, self.stack.cache, checkpoint=True)
        self.reserve -= self._owed(req)


def _generate_input(
    rid: str, ids: array, params: SamplingParams, ref: dict, logprob: bool
) -> _GenerateInput:
    """The TokenizedGenerateReqInput fields ``Session.create_req`` reads."""
    session_params = SimpleNamespace(
        id=ref["id"],
        rid=ref.get("rid"),
        offset=ref.get("offset"),
        replace=ref.get("replace"),
        drop_previous_output=ref.get("drop_previous_output"),
    )
    return _GenerateInput(
        rid=rid,
        input_ids=ids,
        sampling_params=params,
        stream=False,
        return_logprob=logprob,
        top_logprobs_num=0,
        return_hidden_states=False,
        return_routed_experts=False,
        return_sampling_mask=False,
        require_reasoning=False,
        session_params=session_params,
    )


def _row(req: Req) -> int:
    return -1 if req.kv.req_pool_idx is None else int(req.kv.req_pool_idx)
