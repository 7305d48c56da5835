"""The assembly of an engine's state view at an event: the memory layer's sections
(memory_view.py), where the scheduler holds each request (req_views.py), the scheduler's
section, the session sections (session_views.py) and the event's own records (KV reads
that failed, the finished request's response).

Keeps: docs/design.md decision 1 — the view is plain data read from the components; a section
no rule at the event reads is not built (``view.wanted_sections``). A streaming turn that
holds its slot's row only on loan (restored, not yet run on) owns no row in the view: its
session slot still does (SGLang counts it in ``session_held``, not ``uncached``).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace
from typing import Any

from engine.memory import KVMemory
from engine.model.fingerprint import KVFingerprints
from engine.observe.inflight import InFlightReads
from engine.observe.memory_view import ViewMemo, memory_view
from engine.observe.req_views import NOWHERE, ReqPlaces
from engine.observe.session_views import session_views, slot_views
from engine.request import Req
from engine.sched.scheduler import Scheduler
from engine.sched.sessions import SessionController
from engine.view import (
    IntegrityView,
    ResponseView,
    SchedView,
    SessionSlotView,
    StateView,
    wanted_sections,
)

SESSION_SECTIONS = frozenset({"slots", "sessions"})
PER_REQUEST_SECTIONS = frozenset({"pools", "req_pool", "reqs"}) | SESSION_SECTIONS  # live reqs
KV_CHECK_EVENTS = frozenset({"session", "idle"})  # a slot's KV is checked at these events


class StateViews:
    """Builds the state view of one engine's components (kept between views: the memo of
    request views and the incremental census); ``runner`` supplies the KV fingerprints a
    slot's KV check reads (the sim model)."""

    def __init__(
        self, mem: KVMemory, scheduler: Scheduler, sessions: SessionController, runner: Any
    ) -> None:
        self.mem, self.scheduler, self.sessions = mem, scheduler, sessions
        self.runner = runner
        kv = getattr(runner, "kv", None)
        self.kv = kv if isinstance(kv, KVFingerprints) else None
        policy = scheduler.policy
        # plain decode has no speculative state: skip asking it for every request
        self.memo = ViewMemo(None if policy.spec_mode == "off" else policy.spec_state)
        self.inflight = InFlightReads(
            mem, policy.num_draft_tokens if policy.spec_mode != "off" else 0
        )

    def build(
        self,
        event: str,
        parts: frozenset[str],
        integrity: tuple[IntegrityView, ...],
        response: ResponseView,
        responded: Req | None = None,
    ) -> StateView:
        """The view at ``event``: the sections ``parts`` asks for (all without
        ``view.SELECTIVE``), the census, tree nodes and a response's uncached reference
        (for the response of request ``responded``) when ``parts`` names them."""
        sched, sections = self.scheduler, wanted_sections(parts)
        if sections & PER_REQUEST_SECTIONS:
            places, owning = self._places(), self._owning(sched.live_reqs())
        else:  # no section that lists requests or rows: skip finding them
            places, owning = NOWHERE, []
        extra: dict[str, Any] = {}
        if event == "response":
            wants = "reference_ids" in parts
            extra["response"] = self._with_reference(response, responded) if wants else response
        if "sched" in sections:
            extra["sched"] = self._sched_view(event)
        step, memo = sched.stats.iterations, self.memo
        extra["integrity"] = integrity
        view = memory_view(self.mem, event, step, owning, places, parts, memo, **extra)
        if sections & SESSION_SECTIONS:
            view = self._session_parts(event, view)
        return view

    def _with_reference(self, response: ResponseView, req: Req | None) -> ResponseView:
        """The response with the model's greedy tokens for ``req``'s prompt (under its
        penalties) computed with nothing cached (a model without an exact reference leaves
        it unchecked)."""
        reference = getattr(self.runner, "reference", None)
        n = len(response.output_ids)
        if reference is None or not n or req is None:
            return response
        tokens = reference(req.origin_input_ids, n, req)
        if tokens is None:
            return response
        return replace(response, reference_ids=tuple(tokens), reference_checked=True)

    def _places(self) -> ReqPlaces:
        """Where the scheduler holds each request. A decode step's batch is the running batch
        (or lists the same requests): it shares the running batch's set."""
        sched, batch = self.scheduler, self.scheduler.cur_batch
        running = sched.running_batch.reqs
        in_running = set(running)
        if batch is None:
            in_batch: Collection[Req] = ()
        else:  # list equality compares each Req by identity
            in_batch = in_running if batch.reqs == running else set(batch.reqs)
        waiting = set(sched.waiting_queue) if sched.waiting_queue else ()
        return ReqPlaces(waiting, in_running, in_batch)

    def _owning(self, live: list[Req]) -> list[Req]:
        """The live requests that own their row (a turn on loan does not)."""
        streaming = self.mem.streaming
        if streaming is None:
            return live
        waiting = set(self.scheduler.waiting_queue)
        return [r for r in live if r not in waiting or not streaming.is_on_loan(r)]

    def _sched_view(self, event: str) -> SchedView:
        sched, batch, policy = self.scheduler, self.scheduler.cur_batch, self.scheduler.policy
        return SchedView(
            overlap=sched.overlap,
            forward_ct=sched.forward_ct,
            num_waiting=len(sched.waiting_queue),
            num_running=sched.running_batch.batch_size(),
            batch_mode="idle" if batch is None else batch.mode.value,
            batch_size=0 if batch is None else batch.batch_size(),
            chunked_rids=() if sched.chunked_req is None else (sched.chunked_req.rid,),
            new_token_ratio=sched.new_token_ratio,
            batch_chunked_rids=() if batch is None else batch.truncated_rids,
            max_running_requests=sched.config.running_limit,
            released=tuple(sched.released),
            reuse=() if batch is None else batch.reused,
            spec_mode=policy.spec_mode,
            num_draft_tokens=policy.num_draft_tokens,
            spec_alloc_len=policy.alloc_len,
            chunk_deferred=sched.stats.chunk_deferred_at == sched.stats.iterations,
            wedged=(wedged := sched.stats.wedged_at == sched.stats.iterations),
            waiting_rids=tuple(r.rid for r in sched.waiting_queue[:8]) if wedged else (),
            inflight_freed=self._inflight_freed(event) if sched.overlap else (),
            estimated_tokens=sched.estimate.estimated,
            allocated_tokens=sched.estimate.allocated(),
        )

    def _inflight_freed(self, event: str) -> tuple[str, ...]:
        """Reads of a launched, unprocessed batch whose slot is gone (inflight.py)."""
        sched, launched = self.scheduler, None
        if event == "forward" and sched.cur_batch is not None:
            launched = sched.cur_batch.forward
        queued = [b.forward for b, _ in sched.result_queue if b.forward is not None]
        when = f"{event} of iteration {sched.stats.iterations}"
        return self.inflight.update(queued, launched, sched.forward_ct, when)

    def _session_parts(self, event: str, view: StateView) -> StateView:
        """``view`` with the slot and session records (unchanged when there are none)."""
        sessions, cache = self.sessions, self.mem.streaming
        if not sessions.sessions and (cache is None or not cache.slots):
            return view
        sched = self.scheduler
        queued = {id(r): r for r in [*sched.waiting_queue, *sched.live_reqs()]}.values()
        unfinished = [r for r in queued if not r.finished()]
        slots: tuple[SessionSlotView, ...] = ()
        if cache is not None:
            kv = self.kv if event in KV_CHECK_EVENTS else None
            slots = slot_views(sessions, cache, self.mem.req_to_token_pool, kv)
        return replace(view, slots=slots, sessions=session_views(sessions, unfinished, cache))
