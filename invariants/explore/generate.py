"""The trace of one seed: its swarm configuration, then three phases of ops.

Keeps: the trace is a pure function of (seed, steps) — the same seed gives the same JSON —
and every op is an intent (abort the k-th request of a phase, a turn of a session that may
have closed), so any subsequence is still a valid trace for the shrinker.

    safety   ops drawn by the seed's weights until ``steps`` scheduled iterations: submits
             (shared heads, over-long prompts), session opens / turns / closes, aborts in
             every phase, forced retracts, cache flushes, clock advances
    drain    no new work: every session still open closed (a session may hold its KV
             forever, by design), then idle within a step budget (not idle, or a stall,
             is a liveness finding)
    idle     a cache flush, then the runner's final drain checks the idle event
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, get_args

import numpy as np

from engine.model.tokenizer import BOS_ID
from invariants.explore.swarm import MAX_OPEN_SESSIONS, Swarm, sample_swarm
from invariants.scenarios.ops import (
    Abort,
    AbortPhase,
    AdvanceClock,
    CloseSession,
    Disconnect,
    FlushCache,
    ForceRetract,
    Idle,
    Op,
    OpenSession,
    SessionRef,
    Step,
    Submit,
    Trace,
    WaitFor,
)
from invariants.scenarios.scenario import with_penalties
from invariants.scenarios.trace_run import drain_budget

PHASES: tuple[AbortPhase, ...] = get_args(AbortPhase)
WAIT_STEPS = 48  # a client awaiting its streaming turn (counts fully against the step budget)
OVERLONG_PROB = 0.03
BOS_PROB = 0.25  # turns that open with the tokenizer's BOS
CONTINUE_PROB = 0.125  # streaming turns that only say "continue" (with BOS_PROB's: a quarter)
SETTLE_PROB = 0.6  # streaming turns that first wait for the session's last one
BOUNDARY_PROB = 0.15  # turns whose new input is a boundary length instead (_boundary_input)
EMPTY_PROMPT_PROB = 0.01  # plain prompts sent empty (refused, 400, as SGLang does)
CLOSE_AT_ONCE_PROB = 0.1  # sessions closed right after they open, before any turn


def generate_trace(seed: int, steps: int, swarm: Swarm | None = None) -> Trace:
    """The trace of ``seed`` with ``steps`` scheduled iterations in its safety phase, on the
    seed's swarm configuration (or on ``swarm``: another target's draw for the seed)."""
    swarm = swarm or sample_swarm(seed)
    ops = generate_ops(swarm, np.random.default_rng([seed, 4]), steps)
    return Trace(name=f"explore-seed-{seed}", seed=seed, engine=swarm.engine, ops=with_drain(ops))


def generate_ops(swarm: Swarm, rng: np.random.Generator, steps: int, prefix: str = "") -> list[Op]:
    """Safety-phase ops for ``steps`` scheduled iterations; every request and session id
    starts with ``prefix`` (ops spliced into another trace keep their own names)."""
    return _Generator(swarm, rng, prefix=prefix).safety(steps)


def with_drain(safety: list[Op]) -> list[Op]:
    """``safety`` then the drain: every session it left open closed, idle within a budget of
    a few steps per token still owed, and the final cache flush."""
    open_sids: dict[str, None] = {}
    for op in safety:
        if isinstance(op, OpenSession):
            open_sids[op.sid] = None
        elif isinstance(op, CloseSession):
            open_sids.pop(op.sid, None)
    closes = [CloseSession(sid=sid) for sid in open_sids]
    return [*safety, *closes, Idle(max_steps=drain_budget(safety)), FlushCache()]


def scheduled(ops: list[Op]) -> int:
    """The iterations ``ops`` schedule: each step, a wait's budget, a forced retract's one."""
    return sum(
        op.n
        if isinstance(op, Step)
        else WAIT_STEPS
        if isinstance(op, WaitFor)
        else int(isinstance(op, ForceRetract))
        for op in ops
    )


def safety_part(ops: list[Op]) -> list[Op]:
    """A generated trace's ops before its drain (the inverse of ``with_drain``)."""
    end = next((i for i, op in enumerate(ops) if isinstance(op, Idle)), len(ops))
    while end > 0 and isinstance(ops[end - 1], CloseSession):
        end -= 1
    return list(ops[:end])


@dataclass(slots=True, eq=False)
class _Generator:
    """What the generator believes about the run (the engine may disagree: ops are intents)."""

    swarm: Swarm
    rng: np.random.Generator
    prefix: str = ""
    rids: list[str] = field(default_factory=list)
    sessions: dict[str, bool] = field(default_factory=dict)  # open sid -> streaming
    last_turn: dict[str, str] = field(default_factory=dict)  # sid -> its last request
    num_sessions: int = 0

    def safety(self, steps: int) -> list[Op]:
        kinds = [k for k, w in self.swarm.weights.items() if w > 0]
        p = np.array([self.swarm.weights[k] for k in kinds])
        ops: list[Op] = []
        count = 0
        while count < steps:
            kind = kinds[int(self.rng.choice(len(kinds), p=p / p.sum()))]
            new = self._make(kind)
            ops.extend(new)
            count += scheduled(new)
        return ops

    def _make(self, kind: str) -> list[Op]:
        rng = self.rng
        if kind == "submit":
            return [self._submit(None)]
        if kind == "step":
            return [Step(n=int(rng.choice([1, 1, 2, 4, 8, 16])))]
        if kind == "abort":
            return [self._abort()]
        if kind == "disconnect":  # a client hangs up on one of the requests sent so far
            return (
                [Disconnect(rid=self.rids[int(rng.integers(len(self.rids)))])] if self.rids else []
            )
        if kind == "force_retract":
            return [ForceRetract()]
        if kind == "flush_cache":
            return [FlushCache()]
        if kind == "advance_clock":
            return [AdvanceClock(seconds=float(rng.choice([0.5, 5.0, 30.0])))]
        if not self.sessions or (kind == "open_session" and len(self.sessions) < MAX_OPEN_SESSIONS):
            return self._open_maybe_close()
        sid = list(self.sessions)[int(rng.integers(len(self.sessions)))]
        if kind == "close_session":
            del self.sessions[sid]
            return [CloseSession(sid=sid)]
        last = self.last_turn.get(sid)
        turn = self._submit(sid)
        # a streaming turn sent while the last one runs is rejected: mostly wait for it first
        settle = self.sessions[sid] and last is not None and rng.random() < SETTLE_PROB
        ops: list[Op] = [WaitFor(rids=[last], max_steps=WAIT_STEPS)] if settle else []
        ops.append(turn)
        if kind == "wait_turn":
            ops.append(WaitFor(rids=[turn.rid], max_steps=WAIT_STEPS))
        return ops

    def _open_maybe_close(self) -> list[Op]:
        """An open; now and then the close right after it (a session that never had a turn),
        drawn from the session id alone so that the seed's other draws stay as they were."""
        opened = self._open()
        if _own_rng(opened.sid, 8).random() >= CLOSE_AT_ONCE_PROB:
            return [opened]
        del self.sessions[opened.sid]
        return [opened, CloseSession(sid=opened.sid)]

    def _open(self) -> OpenSession:
        sid = f"{self.prefix}s{self.num_sessions}"
        self.num_sessions += 1
        streaming = bool(self.rng.random() < self.swarm.streaming_prob)
        self.sessions[sid] = streaming
        timeout = [None, None, None, 2.0, 20.0][int(self.rng.integers(5))]
        return OpenSession(sid=sid, streaming=streaming, timeout=timeout)

    def _submit(self, sid: str | None) -> Submit:
        rng, shape = self.rng, self.swarm.prompts
        rid = f"{self.prefix}r{len(self.rids)}"
        self.rids.append(rid)
        if sid is not None:  # a turn: short new input on top of the session's history
            ids = self._turn_input(max(2, shape.suffix_max // 4), self.sessions[sid])
        elif rng.random() < OVERLONG_PROB:
            ids = rng.integers(0, 256, shape.input_limit + int(rng.integers(0, 8))).tolist()
        else:
            head = shape.heads[int(rng.integers(len(shape.heads)))] if rng.random() < 0.6 else ()
            ids = [
                *head[: int(rng.integers(0, len(head) + 1))],
                *rng.integers(0, 256, int(rng.integers(1, shape.suffix_max))).tolist(),
            ]
        ids = self._boundary_input(rid, ids, sid is not None)
        session = None if sid is None else self._session_ref(sid)
        if sid is not None:
            self.last_turn[sid] = rid
        submit = Submit(
            rid=rid,
            input_ids=ids,
            max_new_tokens=int(rng.integers(1, shape.new_max + 1)),
            session=session,
            return_logprob=bool(rng.random() < 0.1),
        )
        return self._maybe_penalized(submit)

    def _maybe_penalized(self, submit: Submit) -> Submit:
        """With the seed's chance, the penalizers: drawn from the rid alone, so a seed that
        draws none (most) runs the trace it ran before they existed."""
        rng = np.random.default_rng(list(submit.rid.encode()))
        if not float(rng.random()) < self.swarm.penalized:
            return submit
        return with_penalties(submit, rng)

    def _turn_input(self, most: int, streaming: bool) -> list[int]:
        """A turn's new tokens, its boundaries as likely as its bulk: a length log-uniform in
        [1, most) (one token as often as a dozen), and the leading BOS a client tokenizing
        each turn sends (SGLang strips it), alone half of those times; a streaming turn is
        also, as often, a bare "continue" (BOS alone: the history is the whole key)."""
        rng = self.rng
        if streaming and rng.random() < CONTINUE_PROB:
            return [BOS_ID]
        n = int(np.exp(rng.uniform(0.0, np.log(most))))
        ids = rng.integers(0, 256, max(1, min(n, most - 1))).tolist()
        if rng.random() < BOS_PROB:
            ids = [BOS_ID] if rng.random() < 1 / 2 else [BOS_ID, *ids]
        return ids

    def _boundary_input(self, rid: str, ids: list[int], turn: bool) -> list[int]:
        """``ids``, or (drawn from the rid alone: the seed's other draws stay as they were) a
        boundary length in their place: a turn of 0 or 1 tokens or of a page and either side
        of it, a plain prompt of 0 (an empty input is refused, 400)."""
        rng = _own_rng(rid, 7)
        if not turn:
            return [] if rng.random() < EMPTY_PROMPT_PROB else ids
        if rng.random() >= BOUNDARY_PROB:
            return ids
        ps = self.swarm.engine.page_size
        sizes = [0, 1] + [n for n in (ps - 1, ps, ps + 1) if 1 < n <= self.swarm.prompts.suffix_max]
        n = sizes[int(rng.integers(len(sizes)))]
        return rng.integers(0, 256, n).tolist()

    def _session_ref(self, sid: str) -> SessionRef:
        """Streaming turns append; plain-session turns name their parent, now and then with
        SGLang's offset / replace / drop_previous_output (some of which it rejects)."""
        parent = (
            self.last_turn.get(sid) if not self.sessions[sid] and self.rng.random() < 0.8 else None
        )
        extra: list[dict[str, Any]] = [
            {},
            {},
            {},
            {"offset": -1},
            {"replace": True},
            {"drop_previous_output": True},
        ]
        if self.sessions[sid] and self.rng.random() < 0.8:
            return SessionRef(id=sid)  # streaming rejects all three: mostly a plain next turn
        return SessionRef(id=sid, rid=parent, **extra[int(self.rng.integers(len(extra)))])

    def _abort(self) -> Abort:
        if self.rids and self.rng.random() < 0.3:
            return Abort(rid=self.rids[int(self.rng.integers(len(self.rids)))])
        return Abort(
            phase=PHASES[int(self.rng.integers(len(PHASES)))], pick=int(self.rng.integers(64))
        )


def _own_rng(name: str, stream: int) -> np.random.Generator:
    """A draw of its own for one request or session (its name and a stream number)."""
    return np.random.default_rng([*name.encode(), stream])
