"""Runs an op trace (ops.py) through the engine with the checker attached.

Keeps: a run is a pure function of the trace (its seed drives the engine, the clock is
simulated), so the same trace replays the same violations at the same op and step; every
violation is tied to the op during which it was seen (``len(ops)``: the final drain); an
engine exception ends the run and is returned as ``error`` with its traceback, never hidden,
and the state at that moment is checked at the ``crash`` event (crash.py), so the exception is
a named finding too.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Literal

from engine.engine import Engine
from engine.errors import ConfigError
from engine.hooks import Observer, SimClock
from engine.observe.crosscheck import CrossCheckMismatch
from engine.sched.sessions import SessionError
from engine.sched.stats import SchedulerStats
from invariants.checking.checker import Checker, CheckerHook, InvariantViolation, Level, Violation
from invariants.checking.loader import Catalog
from invariants.scenarios.crash import DrainStuck, check_crash
from invariants.scenarios.ops import (
    Abort,
    AdvanceClock,
    CloseSession,
    Disconnect,
    FlushCache,
    ForceRetract,
    Idle,
    Op,
    OpenSession,
    Step,
    Submit,
    Trace,
    WaitFor,
    op_label,
)
from invariants.scenarios.spec import vllm_only_fields
from invariants.scenarios.watchdog import ProgressWatch

DRAIN_FLOOR = 2_000  # a drain's budget: this many steps plus a few per token still owed
Status = Literal["ok", "noop", "skipped", "rejected", "incomplete"]


@dataclass(frozen=True, slots=True)
class TraceViolation:
    """A violation and the op during which the checker saw it (``len(ops)``: the drain)."""

    op_index: int
    violation: Violation

    @property
    def invariant(self) -> str:
        return self.violation.invariant

    @property
    def step(self) -> int:
        return self.violation.step

    @property
    def event(self) -> str:
        return self.violation.event

    @property
    def message(self) -> str:
        return self.violation.message

    def __str__(self) -> str:
        return f"{self.violation} (op #{self.op_index})"


@dataclass(frozen=True, slots=True)
class Response:
    """One finished request as the API answered it (the response oracles read these)."""

    rid: str
    op_index: int
    finish_type: str  # length | stop | abort
    status_code: int | None
    message: str | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    output_ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class OpResult:
    """What one op did: ``ok``, ``noop`` (no target), ``skipped`` (rid reused), ``rejected``
    (the engine's 400 answer), ``incomplete`` (a wait ran out of steps)."""

    index: int
    status: Status
    detail: str = ""


@dataclass(frozen=True, slots=True)
class TraceOutcome:
    """What a trace run did and found."""

    trace: Trace
    violations: tuple[TraceViolation, ...]
    stats: SchedulerStats
    steps: int
    checks: int
    seconds: float
    error: str | None = None  # the engine raised: a finding too, never hidden
    error_traceback: str | None = None
    responses: dict[str, Response] = field(default_factory=dict)
    results: tuple[OpResult, ...] = ()
    stopped_at: int | None = None  # op index where the run stopped early (violation or error)

    @property
    def first_violation(self) -> TraceViolation | None:
        return self.violations[0] if self.violations else None

    @property
    def ok(self) -> bool:
        return not self.violations and self.error is None

    def describe(self, limit: int = 5) -> str:
        """A few lines: the first violations or the error, each with its op."""
        ops = self.trace.ops
        lines = [
            f"{v}  <- {op_label(ops[v.op_index]) if v.op_index < len(ops) else 'drain'}"
            for v in self.violations[:limit]
        ]
        return "\n".join(lines + ([f"engine error: {self.error}"] if self.error else []))


def run_trace(
    trace: Trace,
    catalog: Catalog,
    level: int = Level.RECORD,
    *,
    observers: Sequence[Observer] = (),
    stop_at_first: bool = False,
    drain: bool = True,
    before_op: Callable[[int], None] | None = None,
) -> TraceOutcome:
    """Run ``trace``'s ops, then (``drain``) step to idle; the checker sees every event.
    ``stop_at_first`` (or level 2) ends the run at the first violation; ``before_op`` hears
    each op's index before it runs (``len(ops)``: the final drain). A trace whose engine
    config is invalid raises ``ConfigError`` before anything runs."""
    checker = Checker(catalog, level=Level.STRICT if stop_at_first else level)
    run = _Interpreter(trace, checker, observers, before_op)
    start = time.perf_counter()
    stopped = run.execute(drain)
    seconds = time.perf_counter() - start
    checks = sum(s.evaluations for s in checker.stats().values())
    return TraceOutcome(
        trace,
        tuple(run.violations),
        run.engine.stats,
        run.engine.step_count,
        checks,
        seconds,
        run.error,
        run.error_traceback,
        run.responses,
        tuple(run.results),
        stopped,
    )


def drain_budget(ops: Sequence[Op]) -> int:
    """The steps a drain may take: ``DRAIN_FLOOR`` plus four per token the trace's requests
    may owe (prompt and new tokens), whatever the ops before it left undone."""
    owed = sum(len(op.input_ids) + op.max_new_tokens for op in ops if isinstance(op, Submit))
    return DRAIN_FLOOR + 4 * owed


class _Interpreter:
    """The engine, the checker, and the state the ops are interpreted against."""

    def __init__(
        self,
        trace: Trace,
        checker: Checker,
        observers: Sequence[Observer],
        before_op: Callable[[int], None] | None = None,
    ) -> None:
        self.trace = trace
        self.before_op = before_op
        self.checker = checker
        vllm_only = vllm_only_fields(trace.engine)
        if vllm_only:  # kvspec's engine has no connector API, no Mamba group
            raise ConfigError(f"engine.{vllm_only[0]}: a vLLM feature (the vllm target only)")
        self.engine = Engine(
            trace.engine.engine_config(trace.seed),
            clock=SimClock(),
            observers=[CheckerHook(checker), *observers, ProgressWatch(self._where)],
        )
        self.used: set[str] = set()
        self.responses: dict[str, Response] = {}
        self.results: list[OpResult] = []
        self.violations: list[TraceViolation] = []
        self.error: str | None = None
        self.error_traceback: str | None = None
        self.index = 0

    def execute(self, drain: bool) -> int | None:
        """Every op, then the drain; returns the op index where the run stopped early."""
        ops = self.trace.ops
        actions: list[Callable[[], OpResult | None]] = [partial(self.apply, op) for op in ops]
        if drain:
            actions.append(self.drain)
        for self.index, action in enumerate(actions):
            if self.before_op is not None:
                self.before_op(self.index)
            try:
                result = action()
            except InvariantViolation:
                self._collect()
                return self.index
            except CrossCheckMismatch:
                raise  # the harness's own fast path is wrong: never an engine finding
            except Exception as exc:
                if self.checker.level > Level.OFF:
                    check_crash(self.checker, self.engine, exc)
                self._collect()
                self.error = f"{type(exc).__name__}: {exc} ({self._where()})"
                self.error_traceback = traceback.format_exc()
                return self.index
            if result is not None:
                self.results.append(result)
            if self._collect() and self.checker.level >= Level.STRICT:
                return self.index
        return None

    def _where(self) -> str:
        """The op running now: ``op #i: label`` (the drain after the last)."""
        ops = self.trace.ops
        label = op_label(ops[self.index]) if self.index < len(ops) else "the drain"
        return f"op #{self.index}: {label}"

    def _collect(self) -> bool:
        """Tag the checker's new violations with the current op and take the finished
        responses; True if there were new violations."""
        engine = self.engine
        for rid in list(engine.results):
            r = engine.pop_result(rid)
            reason = r.finish_reason
            self.responses[rid] = Response(
                rid,
                self.index,
                reason.kind,
                reason.status_code,
                reason.message,
                r.prompt_tokens,
                r.completion_tokens,
                r.cached_tokens,
                r.output_ids,
            )
        new = self.checker.violations[len(self.violations) :]
        self.violations.extend(TraceViolation(self.index, v) for v in new)
        return bool(new)

    def apply(self, op: Op) -> OpResult:
        status, detail = getattr(self, f"_{op.op}")(op)
        return OpResult(self.index, status, detail)

    def drain(self) -> None:
        """Step to idle (within ``drain_budget``), then once more if a deferred close waits
        for the next reap."""
        engine, budget = self.engine, drain_budget(self.trace.ops)
        engine.run_until_idle(budget)
        if not engine.is_idle():
            raise DrainStuck(f"not idle after {budget} drain steps")
        if any(s.close_on_finish for s in engine.sessions.sessions.values()):
            engine.step()

    # ---- the ops (each returns (status, detail)) ----

    def _submit(self, op: Submit) -> tuple[Status, str]:
        if op.rid in self.used:
            return "skipped", f"rid {op.rid} was used before"
        self.used.add(op.rid)
        self.engine.submit(
            op.input_ids,
            op.sampling_params(),
            rid=op.rid,
            session_params=op.session.params() if op.session else None,
            return_logprob=op.return_logprob,
            logprob_start_len=op.logprob_start_len,
        )
        result = self.engine.results.get(op.rid)
        if result is not None and result.finish_reason.status_code == 400:
            return "rejected", result.finish_reason.message or ""
        return "ok", ""

    def _open_session(self, op: OpenSession) -> tuple[Status, str]:
        try:
            self.engine.open_session(1000, op.sid, op.streaming, op.timeout)
        except SessionError as exc:
            return "rejected", str(exc)
        return "ok", ""

    def _close_session(self, op: CloseSession) -> tuple[Status, str]:
        return ("ok", "") if self.engine.close_session(op.sid) else ("noop", f"no session {op.sid}")

    def _abort(self, op: Abort) -> tuple[Status, str]:
        rid = op.rid
        if rid is None:
            candidates = self._unfinished(op.phase)
            if not candidates:
                return "noop", f"no unfinished request in phase {op.phase}"
            rid = candidates[op.pick % len(candidates)]
        return ("ok", rid) if self.engine.abort(rid) else ("noop", f"{rid} unknown or finished")

    def _disconnect(self, op: Disconnect) -> tuple[Status, str]:
        """A client that went away: its request is aborted (what the server's front end does)."""
        return self._abort(Abort(rid=op.rid))

    def _unfinished(self, phase: str) -> list[str]:
        sched = self.engine.scheduler
        reqs: list[Any] = {
            "waiting": list(sched.waiting_queue),
            "running": list(sched.running_batch.reqs),
            "chunked": [sched.chunked_req] if sched.chunked_req is not None else [],
            "any": list(self.engine.requests.values()),
        }[phase]
        return [r.rid for r in reqs if not r.finished()]

    def _step(self, op: Step) -> tuple[Status, str]:
        for _ in range(op.n):
            self.engine.step()
        return "ok", ""

    def _wait_for(self, op: WaitFor) -> tuple[Status, str]:
        engine = self.engine
        for _ in range(op.max_steps):
            if not any(r in engine.requests and r not in engine.results for r in op.rids):
                return "ok", ""
            engine.step()
        return "incomplete", f"still running after {op.max_steps} steps"

    def _idle(self, op: Idle) -> tuple[Status, str]:
        self.engine.run_until_idle(op.max_steps)
        return (
            ("ok", "")
            if self.engine.is_idle()
            else ("incomplete", f"not idle after {op.max_steps} steps")
        )

    def _force_retract(self, op: ForceRetract) -> tuple[Status, str]:
        sched = self.engine.scheduler
        normal, before = sched.config, sched.stats.retracted_reqs
        sched.config = replace(normal, test_retract=True, test_retract_interval=1)
        try:
            self.engine.step()
        finally:
            sched.config = normal
        return (
            ("ok", "") if sched.stats.retracted_reqs > before else ("noop", "no decode to retract")
        )

    def _flush_cache(self, op: FlushCache) -> tuple[Status, str]:
        return ("ok", "") if self.engine.flush_cache() else ("noop", "refused: not idle")

    def _advance_clock(self, op: AdvanceClock) -> tuple[Status, str]:
        clock = self.engine.clock
        if not isinstance(clock, SimClock):
            return "noop", "not a simulated clock"
        clock.t += op.seconds
        return "ok", ""


__all__ = ["OpResult", "Response", "TraceOutcome", "TraceViolation", "run_trace"]
