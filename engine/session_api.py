"""The Engine's session API (a mixin of ``engine.engine.Engine``): open/close sessions,
session requests, reaping, the ``session`` and ``response`` events.

Keeps: with ``EngineConfig.enable_streaming_session`` the prefix cache is wrapped in the
streaming-session cache (SGLang ``--enable-streaming-session``; ``KVMemory.from_config``);
without it only non-streaming sessions open. The controller decides session policy; the
slots of the sessions it closes are released here, and a turn retired before it ran gives
its slot's loan back (``StreamingSession.forget``). Every session request yields one result
like any request (a rejection: an abort with status 400 and SGLang's message). The
``session`` event follows every open, close (immediate, deferred or timed out), abort and
flush; the ``response`` event follows every finished request, with its ``ResponseView``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from engine.observe.session_views import response_view
from engine.request import Req, SamplingParams
from engine.sched.sessions import SessionController, SessionError, SessionParams, TurnRecord
from engine.view import ResponseView

if TYPE_CHECKING:
    from engine.config import EngineConfig
    from engine.hooks import Clock, HookList, NullHooks
    from engine.memory import KVMemory
    from engine.model.runner import ModelRunner
    from engine.sched.scheduler import Scheduler

SessionParamsLike = Mapping[str, Any] | SessionParams


class SessionAPI:
    """Session methods of the Engine (it provides the attributes declared here)."""

    config: EngineConfig
    mem: KVMemory
    runner: ModelRunner
    clock: Clock
    scheduler: Scheduler
    hooks: HookList | NullHooks
    sessions: SessionController
    _response: ResponseView
    _response_req: Req | None
    _emit: Callable[[str], None]

    # ---- open / close ----

    def open_session(
        self,
        capacity_of_str_len: int,
        session_id: str | None = None,
        streaming: bool = False,
        timeout: float | None = None,
    ) -> str:
        """Open a session; returns its id (generated when None). Raises ``SessionError``
        (SGLang's HTTP 400) for a duplicate id, or streaming without the flag."""
        sid = self.sessions.open(capacity_of_str_len, session_id, streaming, timeout)
        refs = self.mem.session_refs
        if refs is not None:
            refs.open(sid)  # a new incarnation: turns of an earlier one tag nothing
        self._emit("session")
        return sid

    def close_session(self, session_id: str) -> bool:
        """Close a session — at once, or when its in-flight streaming turn ends (deferred);
        with session tags, its tags go at once (its KV stays, evictable). False for an
        unknown id (SGLang answers 200 and logs)."""
        refs = self.mem.session_refs
        tagged = refs is not None and session_id in refs.generations
        if refs is not None:
            refs.release(session_id)
        found = self.sessions.close(session_id) or tagged
        self._release_closed()
        self._emit("session")
        return found

    def _reap(self) -> None:
        reaped = bool(self.sessions.sessions) and bool(self.sessions.maybe_reap(self.clock.now()))
        self._release_closed()  # also a close made on the controller itself
        if reaped:
            self._emit("session")

    def _release_closed(self) -> None:
        """The streaming slots of the sessions just closed: their KV, row and lock go."""
        for session_id in self.sessions.take_closed():
            if self.mem.streaming is not None:
                self.mem.streaming.release_session(session_id)

    # ---- requests ----

    def _new_req(
        self,
        rid: str,
        input_ids: Sequence[int],
        sampling_params: SamplingParams | None,
        session_params: SessionParamsLike | None,
        session_id: str | None = None,
    ) -> Req:
        def make(ids: list[int]) -> Req:
            return Req(
                rid,
                ids,
                sampling_params=sampling_params or SamplingParams(),
                eos_token_ids=frozenset(self.config.eos_token_ids),
            )

        ids = [int(t) for t in input_ids]
        if not ids:  # SGLang's GenerateReqInput refuses it before any session or memory (400)
            req = make(ids)
            req.set_finish_with_abort("input_ids cannot be empty.", 400)
            return req
        if session_params is None:
            return self._tagged(make(ids), session_id)
        params = SessionParams.of(session_params)
        if params.id is None:
            return make(ids)
        req = self.sessions.create_req(rid, ids, params, make, self.scheduler.abort)
        session = self.sessions.sessions.get(params.id)
        return req if session is None or session.streaming else self._tagged(req, params.id)

    def _tagged(self, req: Req, session_id: str | None) -> Req:
        """With session tags, a turn of a (non-streaming or top-level) session carries its
        session's generation: finished, it tags its KV in the tree."""
        refs = self.mem.session_refs
        if refs is not None and session_id is not None:
            req.session_tag = (session_id, refs.generation(session_id))
        return req

    def _check_logprob_start(self, req: Req, return_logprob: bool, logprob_start_len: int) -> None:
        """SGLang's ``handle_generate_request``: a logprob start past the prompt is a 400;
        without one (-1) only the output's logprobs are returned (start = the prompt's end).
        A streaming turn reuses its slot's KV, so SGLang (0.5.11 ``init_next_round_input``)
        ignores its start: only the output's logprobs, as with -1."""
        req.return_logprob = return_logprob
        n = len(req.origin_input_ids)
        session = self.sessions.session_of(req)
        ignored = session is not None and session.streaming
        req.logprob_start_len = (
            n if logprob_start_len == -1 or ignored else min(logprob_start_len, n)
        )
        if (
            return_logprob
            and logprob_start_len != -1
            and logprob_start_len >= n
            and not req.finished()
        ):
            req.set_finish_with_abort(
                f"logprob_start_len={logprob_start_len} is higher than the number of "
                f"input tokens {n}. Please use a smaller logprob_start_len.",
                400,
            )

    def _retired(self, req: Req, prompt: int, completion: int) -> None:
        """Session bookkeeping for a finished request, then the ``response`` event."""
        if self.mem.streaming is not None:
            self.mem.streaming.forget(req)  # a loan of a turn that never ran, undone
        record: TurnRecord | None = self.sessions.on_retired(req)
        reason = req.finished_reason
        assert reason is not None
        if record is not None:
            self.sessions.record_response(record, reason.kind, prompt, completion)
        if self.hooks.observers:
            self._response = response_view(req, record, prompt, completion)
            self._response_req = req
            self._emit("response")


__all__ = ["SessionAPI", "SessionError", "SessionParams"]
