"""Session controller: open and close sessions, build each session request's prompt from its
history, the streaming in-flight flag, deferred close and timeouts (SGLang
``session/session_controller.py``).

Keeps: a streaming session has at most one live request, and ``inflight`` is set exactly
while it has one — ``create_req`` sets it, ``finish_req``/``abort_req`` clear it, and so does a
request that is retired without a release (aborted in the waiting queue, too long): SGLang
0.5.11's U6 gap, closed. ``req_nodes`` of a streaming session is its last successful turn
only: ``finish_req`` is the one writer (never create, abort or retract), so an aborted turn
never becomes history. A rejection never changes the session. Every rejection is an abort
with status 400 and SGLang's message. Time comes from the engine's injected clock.

Prompt of a request appended to ``R`` (SGLang ``Session.create_req``):
    prev = R.origin_input_ids + R.output_ids[:R.max_new_tokens]
           (drop_previous_output: R.origin_input_ids only)
    prompt = prev[:offset] + new   if offset else   prev + new     (new: leading BOS stripped)
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from engine.model.tokenizer import BOS_ID
from engine.request import Req

MakeReq = Callable[[list[int]], Req]
Abort = Callable[[str], bool]

STREAMING_DISABLED = (
    "Streaming sessions are disabled. Please relaunch with --enable-streaming-session."
)
OPEN_FAILED = "Failed to open the session. Check if a session with the same id is still open."


class SessionError(ValueError):
    """A session call SGLang answers with HTTP 400; the message is SGLang's."""

    status_code = 400


@dataclass(frozen=True, slots=True)
class SessionParams:
    """``session_params`` of a generate request (SGLang ``SessionParams``)."""

    id: str | None = None
    rid: str | None = None
    offset: int | None = None
    replace: bool | None = None
    drop_previous_output: bool | None = None

    @classmethod
    def of(cls, value: Mapping[str, Any] | SessionParams) -> SessionParams:
        if isinstance(value, SessionParams):
            return value
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise SessionError(f"unknown session_params keys {unknown} (known: {sorted(known)})")
        return cls(**value)


@dataclass(slots=True, eq=False)
class SessionReqNode:
    """One request of a session's history tree (non-streaming: branches; streaming: one)."""

    req: Req
    parent: SessionReqNode | None = None
    children: list[SessionReqNode] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.parent is not None:
            self.parent.children.append(self)

    def clear_children(self, nodes: dict[str, SessionReqNode], abort: Abort) -> None:
        for child in self.children:
            child.clear(nodes, abort)
        self.children = []

    def clear(self, nodes: dict[str, SessionReqNode], abort: Abort) -> None:
        """Drop this subtree from ``nodes``, aborting its unfinished requests."""
        self.clear_children(nodes, abort)
        self.abort(abort)
        nodes.pop(self.req.rid, None)

    def abort(self, abort: Abort) -> None:
        if not self.req.finished():
            abort(self.req.rid)


@dataclass(frozen=True, slots=True)
class TurnRecord:
    """What the response oracles need of one session request, fixed when it was created:
    its turn, the appended tokens, and the session's last successful response before it."""

    session_id: str
    streaming: bool = False
    turn: int = 0
    appended: int = 0
    rejected: bool = False
    parent_turn: int = 0
    parent_prompt: int = 0
    parent_completion: int = 0
    cache_flushed: bool = False  # flush_cache or the wedge breaker dropped the slot since


class Session:
    """One session: its history, the streaming in-flight flag, close and timeout state."""

    def __init__(
        self,
        capacity_of_str_len: int,
        session_id: str,
        streaming: bool,
        timeout: float | None,
        now: float,
    ) -> None:
        self.session_id = session_id
        self.capacity_of_str_len = capacity_of_str_len  # stored, never enforced (as SGLang)
        self.streaming = streaming
        self.timeout = timeout
        self.last_active_time = now
        self.req_nodes: dict[str, SessionReqNode] = {}
        self.close_on_finish = False
        self.inflight_rid: str | None = None  # SGLang's ``_inflight``, naming the request
        self.turns = 0
        self.last_ok = (
            0,
            0,
            0,
        )  # (turn, prompt_tokens, completion_tokens) of the last successful response
        self.flushed = False  # flush_cache dropped the slot since that response

    @property
    def inflight(self) -> bool:
        return self.inflight_rid is not None

    def is_timed_out(self, now: float) -> bool:
        return self.timeout is not None and now - self.last_active_time > self.timeout

    def finish_req(self, req: Req) -> None:
        """A streaming turn finished: it becomes the session's only history node."""
        self.inflight_rid = None
        self.req_nodes = {req.rid: SessionReqNode(req)}

    def abort_req(self, req: Req) -> None:
        """The in-flight turn ended without finishing: history unchanged."""
        if self.inflight_rid == req.rid:
            self.inflight_rid = None

    def create_req(
        self,
        rid: str,
        input_ids: list[int],
        params: SessionParams,
        make_req: MakeReq,
        abort: Abort,
        now: float,
    ) -> tuple[Req, TurnRecord]:
        """The request for ``input_ids`` on this session (finished with an abort when rejected)."""
        self.turns += 1
        parent, message = (
            self._streaming_parent(params) if self.streaming else self._plain_parent(params, abort)
        )
        new = input_ids[1:] if parent is not None and input_ids[:1] == [BOS_ID] else input_ids
        req = make_req(_prompt(parent, params, new))
        turn, prompt, completion = self.last_ok
        record = TurnRecord(
            self.session_id,
            self.streaming,
            self.turns,
            len(new),
            message is not None,
            turn,
            prompt,
            completion,
            self.flushed,
        )
        if message is not None:
            req.set_finish_with_abort(message, 400)
            return req, record
        self.last_active_time = now
        if self.streaming:
            self.inflight_rid = rid  # req_nodes moves only in finish_req
        else:
            self.req_nodes[rid] = SessionReqNode(req, parent)
        return req, record

    def _streaming_parent(self, params: SessionParams) -> tuple[SessionReqNode | None, str | None]:
        if self.inflight:
            return None, "Streaming session already has an active request."
        if params.replace:
            return None, "Streaming sessions do not support replace."
        if params.drop_previous_output:
            return None, "Streaming sessions do not support drop_previous_output."
        if params.offset:
            return None, "Streaming sessions do not support offset."
        if len(self.req_nodes) > 1:
            raise AssertionError(
                f"streaming session {self.session_id} has {len(self.req_nodes)} history nodes"
            )
        return next(iter(self.req_nodes.values()), None), None

    def _plain_parent(
        self, params: SessionParams, abort: Abort
    ) -> tuple[SessionReqNode | None, str | None]:
        nodes = self.req_nodes
        if params.replace and params.rid is None:
            for root in [n for n in nodes.values() if n.parent is None]:
                root.clear(nodes, abort)
            return None, None
        if params.rid is None:
            return None, None
        node = nodes.get(params.rid)
        if node is None:
            return None, "Invalid request session id"
        if params.replace:
            node.abort(abort)
            node.clear_children(nodes, abort)
        elif not node.req.finished():
            return None, "Session request is appending to a request that hasn't finished."
        return node, None


def _prompt(parent: SessionReqNode | None, params: SessionParams, new: list[int]) -> list[int]:
    if parent is None:
        return list(new)
    last = parent.req
    prev = last.origin_input_ids + last.output_ids[: last.sampling_params.max_new_tokens]
    if params.drop_previous_output:
        prev = list(last.origin_input_ids)
    return prev[: params.offset] + new if params.offset else prev + new


class SessionController:
    """Session policy only: every open session, the request → session links (SGLang
    ``req.session``), the turn records, close and timeouts. It holds no KV: the sessions it
    closes are handed out by ``take_closed`` (the engine releases their streaming slots)."""

    def __init__(self, now: Callable[[], float], streaming_enabled: bool) -> None:
        self.sessions: dict[str, Session] = {}
        self.owner: dict[Req, Session] = {}
        self.records: dict[Req, TurnRecord] = {}
        self.closed: list[str] = []  # closed since the last take_closed
        self.now = now
        self.streaming_enabled = streaming_enabled
        self._ids = itertools.count()

    # ---- the cache's lookup ----

    def session_of(self, req: Req) -> Session | None:
        return self.owner.get(req)

    def detach(self, req: Req) -> None:
        self.owner.pop(req, None)

    def slot_dropped(self, session_id: str) -> None:
        """The wedge breaker reclaimed the session's slot: its next turn (one may wait
        already) re-prefills, as after ``flush_cache``."""
        if (session := self.sessions.get(session_id)) is not None:
            session.flushed = True
        for req, record in self.records.items():
            if record.session_id == session_id:
                self.records[req] = replace(record, cache_flushed=True)

    # ---- open / close ----

    def open(
        self,
        capacity_of_str_len: int,
        session_id: str | None = None,
        streaming: bool = False,
        timeout: float | None = None,
    ) -> str:
        if streaming and not self.streaming_enabled:
            raise SessionError(STREAMING_DISABLED)
        sid = session_id if session_id is not None else f"session-{next(self._ids):08x}"
        if sid in self.sessions:
            raise SessionError(OPEN_FAILED)
        self.sessions[sid] = Session(capacity_of_str_len, sid, bool(streaming), timeout, self.now())
        return sid

    def close(self, session_id: str) -> bool:
        """Close now, or — a streaming request still in flight — once it ends. False for an
        unknown id (SGLang only logs it)."""
        if session_id not in self.sessions:
            return False
        self._close(session_id)
        return True

    def _close(self, session_id: str) -> bool:
        session = self.sessions[session_id]
        if session.streaming and session.inflight:
            session.close_on_finish = True  # closed by maybe_reap once the turn ends
            return False
        self.closed.append(session_id)
        del self.sessions[session_id]
        return True

    def maybe_reap(self, now: float) -> list[str]:
        """Complete deferred closes whose turn ended, then close timed-out sessions; returns
        the ids closed (SGLang reaps once a second; here at every loop iteration)."""
        closed = []
        for sid, session in list(self.sessions.items()):
            deferred_done = session.close_on_finish and not session.inflight
            timed_out = not session.close_on_finish and session.is_timed_out(now)
            if (deferred_done or timed_out) and self._close(sid):
                closed.append(sid)
        return closed

    def take_closed(self) -> list[str]:
        """The sessions closed since the last call (their slots are to be released)."""
        closed, self.closed = self.closed, []
        return closed

    # ---- requests ----

    def create_req(
        self, rid: str, input_ids: list[int], params: SessionParams, make_req: MakeReq, abort: Abort
    ) -> Req:
        """The request of a generate call with ``session_params``: a session request, or an
        abort (status 400) for an unknown or closing session or a rejected append (``abort``:
        the scheduler's, for the requests a replace drops)."""
        session = self.sessions.get(params.id) if params.id is not None else None
        if session is None or session.close_on_finish:
            req = make_req(list(input_ids))
            req.set_finish_with_abort(
                f"Invalid request: close was requested for session {params.id}"
                if session is not None
                else f"Invalid request: session id {params.id} does not exist",
                400,
            )
            self.records[req] = TurnRecord(params.id or "", rejected=True, appended=len(input_ids))
            return req
        req, record = session.create_req(rid, list(input_ids), params, make_req, abort, self.now())
        self.records[req] = record
        if not record.rejected:
            self.owner[req] = session
        return req

    def on_retired(self, req: Req) -> TurnRecord | None:
        """A request left the scheduler (with a result). One retired without a release —
        aborted while waiting, too long — ends its session's in-flight turn here."""
        session = self.owner.pop(req, None)
        if session is not None:
            session.abort_req(req)
        return self.records.pop(req, None)

    def record_response(
        self, record: TurnRecord, finish_kind: str, prompt: int, completion: int
    ) -> None:
        """Remember the session's last successful response (the response oracles' parent)."""
        session = self.sessions.get(record.session_id)
        if session is not None and not record.rejected and finish_kind != "abort":
            session.last_ok = (record.turn, prompt, completion)
            session.flushed = False

    def on_flush(self) -> None:
        """``flush_cache`` dropped every slot (history tokens stay)."""
        for session in self.sessions.values():
            session.flushed = True
