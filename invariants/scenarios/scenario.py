"""Scenario → op trace: turns a spec's workload (scenario_schema.py) into the ops of ops.py,
deterministically from the spec's seed.

Keeps: the trace is a pure function of the spec (seeded sub-streams: plain traffic, session
tokens, faults), so a spec replays exactly; plain traffic is drawn exactly as before
sessions existed (workload.py's anchor order), so old specs run the same trace.
A request the workload means to be rejected carries its reason in its rid (``…!long``,
``…!param``): the rejection oracle reads it from the trace alone.

Timeline of a plain-only workload (``arrivals_per_step`` k): tick t submits requests
[t*k, (t+1)*k), then one step; aborts land d ticks after their request. With sessions, waves of
``concurrency`` sessions follow; per round (one turn of each session of the wave):

    tick 0: submit every turn (+ plain_per_round requests)  |  ticks 1..: aborts, closes,
    storms, a forced retract, one step per tick              |  then wait_for the round's rids
    (+ the clock past the timeout, + idle + flush_cache)
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

import numpy as np

from engine.model.tokenizer import BOS_ID, NUM_BYTES
from invariants.scenarios.ops import (
    Abort,
    AdvanceClock,
    CloseSession,
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
from invariants.scenarios.scenario_schema import Dist
from invariants.scenarios.spec import Spec

TOO_LONG, BAD_PARAM = "!long", "!param"  # rid marks of intended rejections (HTTP 400)
BRANCH_KINDS = ("append", "branch", "backtrack", "drop_output", "new_root")


def build_trace(spec: Spec) -> Trace:
    """The spec's workload as ops (same spec, same trace)."""
    return Trace(name=spec.name, seed=spec.seed, engine=spec.engine, ops=list(_Builder(spec).ops()))


def draw(rng: np.random.Generator, dist: Dist) -> int:
    """One length from ``dist``."""
    if dist.uniform is not None:
        return int(rng.integers(dist.uniform[0], dist.uniform[1] + 1))
    if dist.loguniform is not None:
        lo, hi = dist.loguniform
        return int(
            min(hi, max(lo, round(float(np.exp(rng.uniform(np.log(lo), np.log(hi + 1)))) - 0.5)))
        )
    assert dist.choice is not None
    return int(dist.choice[int(rng.integers(0, len(dist.choice)))])


def with_penalties(submit: Submit, rng: np.random.Generator) -> Submit:
    """``submit`` asking for the penalizers: a minimum length, frequency and presence
    penalties (each maybe neutral), EOS honoured."""
    penalty = (0.0, 0.5, 1.5, -0.5)
    update = {
        "ignore_eos": False,
        "min_new_tokens": int(rng.integers(0, submit.max_new_tokens + 1)),
        "frequency_penalty": penalty[int(rng.integers(0, len(penalty)))],
        "presence_penalty": penalty[int(rng.integers(0, len(penalty)))],
    }
    return submit.model_copy(update=update)


class _Agenda:
    """Ops at ticks relative to a start; rendered as the ops of each tick then one step."""

    def __init__(self) -> None:
        self.at: dict[int, list[Op]] = defaultdict(list)
        self.retract_at: set[int] = set()

    def render(self, min_ticks: int = 0) -> Iterator[Op]:
        last = max([*self.at, *self.retract_at, min_ticks - 1], default=-1)
        pending = 0
        for tick in range(last + 1):
            if self.at.get(tick) and pending:
                yield Step(n=pending)
                pending = 0
            yield from self.at.get(tick, [])
            if tick in self.retract_at:
                if pending:
                    yield Step(n=pending)
                    pending = 0
                yield ForceRetract()
            else:
                pending += 1
        if pending:
            yield Step(n=pending)


class _Builder:
    """One spec's generator: its random sub-streams and the limits its engine imposes."""

    def __init__(self, spec: Spec) -> None:
        self.spec, self.w = spec, spec.workload
        config = spec.engine.engine_config(spec.seed)
        self.max_input = config.max_req_input_len
        self.chunk = config.chunked_prefill_size or self.max_input
        self.plain_rng = np.random.default_rng(spec.seed)  # the anchor order of workload.py
        self.token_rng = np.random.default_rng([spec.seed, 1])
        self.fault_rng = np.random.default_rng([spec.seed, 2])
        self.sampling_rng = np.random.default_rng([spec.seed, 3])
        self.system = [
            self.plain_rng.integers(1, NUM_BYTES, self.w.system_prompt_len).tolist()
            for _ in range(self.w.system_prompts)
        ]
        self.num_plain = 0

    def ops(self) -> Iterator[Op]:
        yield from self._plain_traffic()
        sessions = self.w.sessions
        for start in range(0, sessions.total, sessions.concurrency):
            yield from self._wave(range(start, min(start + sessions.concurrency, sessions.total)))

    # ---- plain traffic ----

    def _plain(self) -> Submit:
        """The next plain request, drawn as make_trace draws it; maybe too long or a bad
        logprob start (rejected)."""
        i, rng = self.num_plain, self.plain_rng
        self.num_plain += 1
        system = self.system[int(rng.integers(0, len(self.system)))]
        suffix, gen = draw(rng, self.w.suffix), draw(rng, self.w.gen)
        ids = system + rng.integers(1, NUM_BYTES, suffix).tolist()
        rng.integers(1, NUM_BYTES, gen)  # the anchor trace's output ids: keeps the stream aligned
        submit = Submit(rid=f"r{i}", input_ids=ids, max_new_tokens=gen)
        return self._maybe_rejected(self._maybe_penalized(submit), sessionless=True)

    def _plain_traffic(self) -> Iterator[Op]:
        n = self.w.requests
        if not n:
            return
        per_tick, agenda = self.w.arrivals_per_step or n, _Agenda()
        for i in range(n):
            submit = self._plain()
            agenda.at[i // per_tick].append(submit)
            self._maybe_abort(agenda, i // per_tick, submit)
        yield from agenda.render()

    # ---- faults ----

    def _chance(self, p: float) -> bool:
        return p > 0 and float(self.fault_rng.random()) < p

    def _maybe_penalized(self, submit: Submit) -> Submit:
        rng = self.sampling_rng
        if not (self.w.penalized > 0 and float(rng.random()) < self.w.penalized):
            return submit
        return with_penalties(submit, rng)

    def _maybe_rejected(
        self, submit: Submit, sessionless: bool = False, streaming: bool = False
    ) -> Submit:
        faults, rng = self.w.faults, self.fault_rng
        if self._chance(faults.too_long):
            ids = [BOS_ID] + rng.integers(0, NUM_BYTES, self.max_input + 1).tolist()
            return submit.model_copy(update={"rid": submit.rid + TOO_LONG, "input_ids": ids})
        if not self._chance(faults.rejected_params):
            return submit
        kinds = ["logprob"] + (
            [] if sessionless else ["offset", "replace", "drop"] if streaming else ["parent"]
        )
        kind = kinds[int(rng.integers(0, len(kinds)))]
        update: dict[str, object] = {"rid": submit.rid + BAD_PARAM}
        if kind == "logprob":  # a logprob start past the whole prompt (session history included)
            update |= {"return_logprob": True, "logprob_start_len": self.max_input + 8}
        else:
            assert submit.session is not None
            field = {
                "offset": ("offset", 1),
                "replace": ("replace", True),
                "drop": ("drop_previous_output", True),
                "parent": ("rid", "no-such-request"),
            }[kind]
            update["session"] = submit.session.model_copy(update=dict([field]))
        return submit.model_copy(update=update)

    def _maybe_abort(self, agenda: _Agenda, tick: int, submit: Submit) -> None:
        if (
            BAD_PARAM in submit.rid
            or TOO_LONG in submit.rid
            or not self._chance(self.w.faults.mid_abort)
        ):
            return
        span = submit.max_new_tokens + -(-len(submit.input_ids) // self.chunk) + 2
        agenda.at[tick + int(self.fault_rng.integers(0, span + 1))].append(Abort(rid=submit.rid))

    def _round_faults(self, agenda: _Agenda, span: int) -> None:
        faults, rng = self.w.faults, self.fault_rng
        for _ in range(faults.abort_storm):
            phase = faults.storm_phases[int(rng.integers(0, len(faults.storm_phases)))]
            agenda.at[int(rng.integers(0, span + 1))].append(
                Abort(phase=phase, pick=int(rng.integers(0, 64)))
            )
        if self._chance(faults.retract):
            agenda.retract_at.add(int(rng.integers(1, max(2, span))))

    # ---- sessions ----

    def _tokens(self, dist: Dist) -> list[int]:
        return [BOS_ID] + self.token_rng.integers(0, NUM_BYTES, draw(self.token_rng, dist)).tolist()

    def _wave(self, indexes: range) -> Iterator[Op]:
        s = self.w.sessions
        sids = {f"s{i}": i < s.streaming for i in indexes}
        history: dict[str, list[str]] = {sid: [] for sid in sids}  # turns meant to succeed
        for sid, streaming in sids.items():
            yield OpenSession(sid=sid, streaming=streaming, timeout=s.timeout)
        live = set(sids)
        for turn in range(1, s.turns + 1):
            if not live:
                return
            agenda, rids = _Agenda(), []
            for sid in sorted(live, key=lambda x: int(x[1:])):
                submit = self._turn(sid, sids[sid], turn, history[sid])
                agenda.at[0].append(submit)
                rids.append(submit.rid)
                self._maybe_abort(agenda, 0, submit)
                if self._chance(self.w.faults.close_in_flight):
                    agenda.at[int(self.fault_rng.integers(0, submit.max_new_tokens + 1))].append(
                        CloseSession(sid=sid)
                    )
                    live.discard(sid)
            for _ in range(s.plain_per_round):
                plain = self._plain()
                agenda.at[0].append(plain)
                rids.append(plain.rid)
                self._maybe_abort(agenda, 0, plain)
            self._round_faults(agenda, s.gen.high)
            yield from agenda.render()
            yield WaitFor(rids=rids)
            yield from self._after_round(live)
        for sid in sorted(live, key=lambda x: int(x[1:])):
            yield CloseSession(sid=sid)

    def _after_round(self, live: set[str]) -> Iterator[Op]:
        s, faults = self.w.sessions, self.w.faults
        if s.timeout is not None and self._chance(faults.timeout):
            yield AdvanceClock(seconds=s.timeout + 1.0)  # every session of the wave idles out
            yield Step(n=1)  # the reap
            live.clear()
        if self._chance(faults.flush):
            yield Idle()
            yield FlushCache()

    def _turn(self, sid: str, streaming: bool, turn: int, history: list[str]) -> Submit:
        s = self.w.sessions
        if turn == 1:
            system = self.system[int(sid[1:]) % len(self.system)]
            ids = [BOS_ID] + system + self._tokens(s.first_prompt or s.prompt)[1:]
        elif self._chance(s.continuing):
            ids = [BOS_ID]  # nothing appended: the history is the whole key (SGLang #22862)
        else:
            ids = self._tokens(s.prompt)
        ref = SessionRef(id=sid, rid=history[-1] if history else None)
        if not streaming and history:
            ref = self._branch(sid, history)
        submit = Submit(
            rid=f"{sid}t{turn}",
            input_ids=ids,
            max_new_tokens=draw(self.token_rng, s.gen),
            session=ref,
            return_logprob=self._chance(s.logprob),
        )
        submit = self._maybe_rejected(self._maybe_penalized(submit), streaming=streaming)
        if TOO_LONG not in submit.rid and BAD_PARAM not in submit.rid:
            history.append(submit.rid)
        return submit

    def _branch(self, sid: str, history: list[str]) -> SessionRef:
        """How a non-streaming turn attaches (the spec's branch weights)."""
        weights = np.array(list(self.w.sessions.branch.model_dump().values()), dtype=float)
        kind = BRANCH_KINDS[
            int(self.fault_rng.choice(len(BRANCH_KINDS), p=weights / weights.sum()))
        ]
        last = history[-1]
        if kind == "branch":
            return SessionRef(id=sid, rid=history[int(self.fault_rng.integers(0, len(history)))])
        if kind == "backtrack":
            return SessionRef(id=sid, rid=last, offset=-1, replace=True)
        if kind == "drop_output":
            return SessionRef(id=sid, rid=last, drop_previous_output=True)
        if kind == "new_root":
            return SessionRef(id=sid)
        return SessionRef(id=sid, rid=last)
