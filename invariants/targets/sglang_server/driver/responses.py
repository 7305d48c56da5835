"""The server's HTTP answers as kvspec's ``response`` views (engine/view.py ``ResponseView``),
with the session bookkeeping the response rules read: a turn's number, its parent (the
session's last successful turn when it was sent), and the uncached reference its tokens must
equal (context_tokens.py) where the whole context is known.

Keeps: a field is the server's own answer (``meta_info``: prompt, completion and cached
tokens, the finish reason) or the client's own record of what it sent; the reference is
checked only for a plain request and a streaming turn with no session options (SGLang's
session semantics are the server's to apply; kvspec does not re-derive the others). Runs in
the sglang venv; imports nothing of kvspec.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from context_tokens import reference


@dataclass
class Turn:
    """A successful turn of a session: its prompt, its output (what the next turn builds on)."""

    number: int
    prompt_tokens: int
    completion_tokens: int
    context: list[int] | None  # prompt ids then output ids (None: not known to this side)


@dataclass
class Session:
    streaming: bool
    turns: int = 0
    last: Turn | None = None
    flushed: bool = False  # a flush since the last successful turn


@dataclass
class Sent:
    """What the client sent for one rid, and the session state it was sent in."""

    op: dict
    session: Session | None = None
    turn: int = 0
    parent: Turn | None = None
    flushed: bool = False
    prompt: list[int] | None = None  # the whole context the request attends to, if known


@dataclass
class Responses:
    seed: int
    eos: tuple[int, float]
    sessions: dict[str, Session] = field(default_factory=dict)
    sent: dict[str, Sent] = field(default_factory=dict)

    def opened(self, sid: str, streaming: bool) -> None:
        self.sessions[sid] = Session(streaming)

    def flushed(self) -> None:
        for session in self.sessions.values():
            session.flushed = True

    def submitted(self, op: dict) -> None:
        params = op.get("session") or {}
        session = self.sessions.get(params.get("id", ""))
        sent = Sent(op, session)
        if session is None:
            sent.prompt = list(op["input_ids"]) if not params else None
        else:
            session.turns += 1
            sent.turn, sent.parent, sent.flushed = session.turns, session.last, session.flushed
            plain = session.streaming and set(params) == {"id"}
            parent = [] if sent.parent is None else sent.parent.context
            if plain and parent is not None:
                sent.prompt = parent + list(op["input_ids"])
        self.sent[op["rid"]] = sent

    def view(self, rid: str, call, step: int, sched: dict) -> dict | None:
        """The response view of ``rid``'s finished call; None when the answer gives no token
        counts to check (SGLang's answer to a request aborted while queued carries none)."""
        sent, answer = self.sent[rid], call.json()
        meta = answer.get("meta_info", {})
        params = sent.op.get("session") or {}
        rejected = bool(params) and call.status == 400
        if "prompt_tokens" not in meta and not rejected:
            return None
        reason = meta.get("finish_reason") or {}
        status = call.status or 0
        output = [int(t) for t in answer.get("output_ids") or []]
        ok = status == 200 and reason.get("type") != "abort"
        response = dict(
            rid=rid,
            session_id=params.get("id", ""),
            streaming=bool(sent.session and sent.session.streaming),
            turn=sent.turn,
            prompt_tokens=int(meta.get("prompt_tokens", 0)),
            completion_tokens=int(meta.get("completion_tokens", 0)),
            cached_tokens=int(meta.get("cached_tokens", 0)),
            finish_type=reason.get("type", "abort"),
            stop_token=reason["matched"] if isinstance(reason.get("matched"), int) else -1,
            min_new_tokens=int(sent.op.get("min_new_tokens") or 0),
            status_code=int(reason.get("status_code") or (0 if status == 200 else status)),
            rejected=rejected,
            appended_tokens=len(sent.op["input_ids"]),
            output_ids=output,
            cache_flushed=sent.flushed,
            **self._parent(sent),
            **self._reference(sent, output, ok),
        )
        if ok and sent.session is not None:
            self._succeeded(sent, response, output)
        return dict(event="response", step=step, sched=sched, pools=[], response=response)

    def _parent(self, sent: Sent) -> dict:
        parent = sent.parent
        if parent is None:
            return {}
        return dict(
            parent_turn=parent.number,
            parent_prompt_tokens=parent.prompt_tokens,
            parent_completion_tokens=parent.completion_tokens,
        )

    def _reference(self, sent: Sent, output: list[int], ok: bool) -> dict:
        if not ok or sent.prompt is None or not output:
            return {}
        return dict(
            reference_ids=reference(self.seed, sent.prompt, len(output), self.eos),
            reference_checked=True,
        )

    def _succeeded(self, sent: Sent, response: dict, output: list[int]) -> None:
        context = None if sent.prompt is None else sent.prompt + output
        turn = Turn(sent.turn, response["prompt_tokens"], response["completion_tokens"], context)
        sent.session.last, sent.session.flushed = turn, False
